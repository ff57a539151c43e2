"""How many streamed tokens a second the stack forwards with and without the router's hop.

Issue 11 asks for the most tokens a second one router process forwards before it becomes
the bottleneck, with the mocker fast enough never to be one. For each arm (stock: the
frontend routes to the workers itself; ours: frontend -> our router -> workers), on a fresh
default local stack (2 mocker workers) with the mocker at a high speedup, C clients send
streamed one-turn chats of TOKENS output tokens back to back for SECONDS; the clients are
curl processes (C, output to /dev/null), so the load generator's own share of the CPU stays
small (each request is one curl process: its start-up is not counted in any role). Reported
per arm and concurrency: output tokens a second (completed requests x TOKENS over the time
until the last request ended, the requests running at the end of the window included),
requests that failed, and the CPU microseconds each role of the stack spent per forwarded
token (from /proc, around the load).

Usage (from the repository root; about 5 minutes):
    .venv/bin/python docs/benchmarks/hop-ceiling-20261203/hop_ceiling.py [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from dynamo_thunderagent.bench.clients import cpu_by_role
from dynamo_thunderagent.stack.launcher import LocalStack

TOKENS = 500
SECONDS = 30.0
SPEEDUP = 1000.0
CONCURRENCY = (8, 32)
ARMS = ("stock", "ours")


async def _client(url: str, index: int, stop: float, done: list[int], failed: list[int]) -> None:
    body = json.dumps({
        "model": "tiny", "max_tokens": TOKENS, "stream": True,
        "messages": [{"role": "user", "content": f"client {index} asks for a long answer"}],
        "ignore_eos": True,
    })
    turn = 0
    while time.monotonic() < stop:
        turn += 1
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sN", "-o", "/dev/null", "-w", "%{http_code}", "-m", "120",
            "-H", "content-type: application/json", "-d", body,
            f"{url}/chat/completions", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        # Every request counts, those that end after the window too: the rate divides by
        # the time until the last one ended, and the CPU read covers them all.
        (done if out.decode().strip() == "200" else failed).append(1)


async def _load(url: str, concurrency: int) -> tuple[int, int, float]:
    done: list[int] = []
    failed: list[int] = []
    started = time.monotonic()
    stop = started + SECONDS
    await asyncio.gather(*(_client(url, i, stop, done, failed) for i in range(concurrency)))
    return len(done), len(failed), time.monotonic() - started


def run(arm: str, concurrency: int, out: Path) -> dict[str, object]:
    stack = LocalStack(arm=arm, num_workers=2, num_gpu_blocks=4096, block_size=16,
                       speedup_ratio=SPEEDUP, run_dir=out / f"{arm}-c{concurrency}",
                       startup_timeout_s=120.0)
    with stack:
        asyncio.run(_load(stack.url, 2))  # warm-up: tokenizer caches, connections
        before = cpu_by_role(stack)
        requests, failed, seconds = asyncio.run(_load(stack.url, concurrency))
        after = cpu_by_role(stack)
    tokens = requests * TOKENS
    cpu_us = {role: round((after[role] - before.get(role, 0.0)) / tokens * 1e6, 1)
              for role in after if tokens}
    return {"arm": arm, "concurrency": concurrency, "requests": requests, "failed": failed,
            "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds),
            "cpu_us_per_token": cpu_us}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench-results/hop-ceiling"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for concurrency in CONCURRENCY:
        for arm in ARMS:
            row = run(arm, concurrency, args.out / "runs")
            print(json.dumps(row), flush=True)
            rows.append(row)
    (args.out / "hop-ceiling.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
