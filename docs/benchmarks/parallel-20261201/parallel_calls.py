"""Parallel calls under one session id: each arm on a fresh local stack, arms rotated.

Each of ``--sessions`` agents repeats a step for ``--window`` seconds: ``--calls`` chat
requests sent at once with the agent's session id (a system prompt and the last eight tool
outputs, one more each step; a different question per call), then the next step once all
of them have answered; at the end, X-Dynamo-Session-Final. Prints requests/s and step
latency (the slowest call of the step) per arm, the mean of ``--repeats`` runs (each run's
figures too).

    .venv/bin/python docs/benchmarks/parallel-20261201/parallel_calls.py \\
        --arms stock,ours,ours:queue=policies/ablations/minus_concurrent_turns.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, SESSION_HEADER
from dynamo_thunderagent.stack.launcher import LocalStack


async def drive(url: str, model: str, sessions: int, calls: int, window: float,
                max_tokens: int) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    done = 0
    errors = 0
    steps: list[float] = []
    end = time.monotonic() + window

    async def call(session: str, history: list[Any], k: int) -> None:
        nonlocal done, errors
        try:
            await client.chat.completions.create(
                model=model, max_tokens=max_tokens, extra_headers={SESSION_HEADER: session},
                messages=[*history, {"role": "user", "content": f"question {k} of this step"}])
            done += 1
        except openai.APIError as error:
            errors += 1
            if errors == 1:
                print(f"first error: {error}", file=sys.stderr)

    async def agent(index: int) -> None:
        session = f"parallel-{index}-{time.monotonic_ns()}"
        history: list[Any] = [
            {"role": "system", "content": f"You are agent {index}. " + "context " * 200}]
        step = 0
        while time.monotonic() < end:
            started = time.monotonic()
            await asyncio.gather(*(call(session, history, k) for k in range(calls)))
            steps.append(time.monotonic() - started)
            history.append({"role": "user", "content": f"tool output of step {step} " * 20})
            del history[1:-8]  # compaction: the system prompt and the last 8 tool outputs
            step += 1
        await client.chat.completions.create(
            model=model, max_tokens=1, messages=[{"role": "user", "content": "done"}],
            extra_headers={SESSION_HEADER: session, FINAL_HEADER: "true"})

    started = time.monotonic()
    await asyncio.gather(*(agent(i) for i in range(sessions)))
    elapsed = time.monotonic() - started
    await client.close()
    steps.sort()
    return {"requests_per_s": done / elapsed, "requests": done, "errors": errors,
            "step_p50_s": statistics.median(steps),
            "step_p99_s": steps[min(len(steps) - 1, int(0.99 * len(steps)))]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="stock,ours")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    arms = []
    for spec in args.arms.split(","):
        label, _, policy = spec.partition("=")
        arms.append((label, label.split(":")[0], Path(policy) if policy else None))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in arms}
    for repeat in range(args.repeats):
        order = arms[repeat % len(arms):] + arms[:repeat % len(arms)]
        for label, arm, policy in order:
            with tempfile.TemporaryDirectory() as tmp, LocalStack(
                    arm=arm, policy=policy, run_dir=Path(tmp) / "run",
                    startup_timeout_s=120.0) as stack:
                figures = asyncio.run(drive(stack.url, stack.config.model_name, args.sessions,
                                            args.calls, args.window, args.max_tokens))
            runs[label].append(figures)
            print(f"{label} run {repeat + 1}: {json.dumps(figures)}", file=sys.stderr)
    base = statistics.mean(r["requests_per_s"] for r in runs[arms[0][0]])
    print(f"{args.sessions} sessions x {args.calls} parallel calls, {args.window:g} s, "
          f"{args.repeats} runs per arm\n")
    print("| arm | requests/s (runs) | vs first arm | step p50 / p99 (s) | errors |")
    print("|---|---|---|---|---|")
    for label, _, _ in arms:
        rs = runs[label]
        rate = statistics.mean(r["requests_per_s"] for r in rs)
        each = ", ".join(f"{r['requests_per_s']:.1f}" for r in rs)
        p50 = statistics.mean(r["step_p50_s"] for r in rs)
        p99 = statistics.mean(r["step_p99_s"] for r in rs)
        print(f"| {label} | {rate:.1f} ({each}) | {rate / base:.2f}x | {p50:.2f} / {p99:.2f} | "
              f"{sum(r['errors'] for r in rs)} |")
    if args.out is not None:
        args.out.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
