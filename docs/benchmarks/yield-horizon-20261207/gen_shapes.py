"""Seeded JSONL traces of four agent shapes no policy here was tuned on (bench trace format).

    python gen_shapes.py SHAPE OUT.jsonl SEED

chat:      a person between turns (lognormal, median 20 s), 10-40 short turns, small contexts
research:  large tool results (4k-10k tokens a call: pages, documents), 3-8 turns, short tools
reasoning: long outputs (1k-4k tokens a turn), 6-16 turns, tools median 4 s
bimodal:   tools that mostly return within 2 s and now and then (8%) run 1-4 minutes (a build,
           a test suite), 15-50 turns

96 sessions each (64 for reasoning). ``llm_seconds`` is a nominal 0.3 s + 20 ms per output
token; the simulator and the live harness time turns with their own engine models.
"""

import json
import random
import sys


def main() -> None:
    shape, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(f"{shape}:{seed}")
    with open(path, "w", encoding="utf-8") as out:
        def row(sid: str, step: int, prompt: int, output: int, tool: float) -> None:
            out.write(json.dumps({"session_id": sid, "step": step, "input_tokens": prompt,
                                  "output_tokens": output,
                                  "llm_seconds": round(0.3 + output * 0.02, 3),
                                  "tool_seconds": round(tool, 2)}) + "\n")

        for s in range(64 if shape == "reasoning" else 96):
            sid = f"{shape}{s}"
            if shape == "chat":
                prompt = rng.randint(300, 1500)
                for step in range(1, rng.randint(10, 40) + 1):
                    output = rng.randint(100, 600)
                    row(sid, step, prompt, output, rng.lognormvariate(3.0, 0.7))
                    prompt += output + rng.randint(20, 200)
            elif shape == "research":
                prompt = rng.randint(1500, 3000)
                for step in range(1, rng.randint(3, 8) + 1):
                    output = rng.randint(60, 300)
                    row(sid, step, prompt, output, rng.uniform(0.5, 5.0))
                    prompt += output + rng.randint(4000, 10000)
            elif shape == "reasoning":
                prompt = rng.randint(2000, 6000)
                for step in range(1, rng.randint(6, 16) + 1):
                    output = rng.randint(1000, 4000)
                    row(sid, step, prompt, output, rng.lognormvariate(1.4, 0.9))
                    prompt += output + rng.randint(200, 1500)
            elif shape == "bimodal":
                prompt = rng.randint(3000, 8000)
                for step in range(1, rng.randint(15, 50) + 1):
                    output = rng.randint(50, 400)
                    long_tool = rng.random() < 0.08
                    row(sid, step, prompt, output,
                        rng.uniform(60, 240) if long_tool else rng.uniform(0.1, 2.0))
                    prompt += output + rng.randint(100, 2500)
            else:
                raise SystemExit(f"unknown shape {shape!r}: chat, research, reasoning, bimodal")


if __name__ == "__main__":
    main()
