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
from collections.abc import Callable
from typing import NamedTuple


class Shape(NamedTuple):
    sessions: int
    first_prompt: tuple[int, int]  # tokens, inclusive range
    turns: tuple[int, int]
    output: tuple[int, int]  # tokens a turn
    tool: Callable[[random.Random], float]  # seconds after a turn
    growth: tuple[int, int]  # tokens the next prompt adds beyond the output (tool results)


def _bimodal_tool(rng: random.Random) -> float:
    return rng.uniform(60, 240) if rng.random() < 0.08 else rng.uniform(0.1, 2.0)


SHAPES = {
    "chat": Shape(96, (300, 1500), (10, 40), (100, 600),
                  lambda rng: rng.lognormvariate(3.0, 0.7), (20, 200)),
    "research": Shape(96, (1500, 3000), (3, 8), (60, 300),
                      lambda rng: rng.uniform(0.5, 5.0), (4000, 10000)),
    "reasoning": Shape(64, (2000, 6000), (6, 16), (1000, 4000),
                       lambda rng: rng.lognormvariate(1.4, 0.9), (200, 1500)),
    "bimodal": Shape(96, (3000, 8000), (15, 50), (50, 400), _bimodal_tool, (100, 2500)),
}


def main() -> None:
    name, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shape = SHAPES.get(name)
    if shape is None:
        raise SystemExit(f"unknown shape {name!r}: {', '.join(SHAPES)}")
    rng = random.Random(f"{name}:{seed}")
    with open(path, "w", encoding="utf-8") as out:
        for s in range(shape.sessions):
            prompt = rng.randint(*shape.first_prompt)
            for step in range(1, rng.randint(*shape.turns) + 1):
                output = rng.randint(*shape.output)
                out.write(json.dumps({"session_id": f"{name}{s}", "step": step,
                                      "input_tokens": prompt, "output_tokens": output,
                                      "llm_seconds": round(0.3 + output * 0.02, 3),
                                      "tool_seconds": round(shape.tool(rng), 2)}) + "\n")
                prompt += output + rng.randint(*shape.growth)


if __name__ == "__main__":
    main()
