"""Why ours paused, resumed and moved programs in one simulated run, counted over the whole
run (warm-up included): every step the scheduler records (``Decisions.steps``), by kind and
reason, with the mean tokens of the programs concerned. Used for the mixed population's
figures in docs/benchmarks.md ("A mixed population, sized like the live runs").

Usage, from the repository root, with the flags of one ``bench sim`` case (one arm, one N):
  .venv/bin/python docs/benchmarks/sim-live-sizing-20261205/reasons.py --regime calibrated \\
      --trace mixed.jsonl --live-sizing --agents 24 --arms ours --no-reuse-output --seed 1 \\
      --warmup-s 60 --window-s 540 [--policy P.yaml]
(mixed.jsonl: the SWE-agent trace and the Claude Code sessions concatenated, as mixed.sh does.)
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import dynamo_thunderagent.scheduler as scheduler
from dynamo_thunderagent.bench.sim.command import run_case


def main(argv: list[str]) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    tokens: Counter[tuple[str, str]] = Counter()
    record = scheduler._step

    def counted(d: Any, kind: Any, program: Any, worker: Any, reason: str,
                wait: float = 0.0) -> None:
        counts[(kind.value, reason)] += 1
        tokens[(kind.value, reason)] += program.tokens
        record(d, kind, program, worker, reason, wait)

    scheduler._step = counted  # every step goes through it
    f = run_case(argv)
    print(f"steps/min {f.steps_per_min:.1f}, hit rate {f.hit_rate:.3f}, median turn "
          f"{f.latency_p50_s:.1f} s, recomputed {f.recomputed_tokens:,} tokens (the window)")
    for key, n in sorted(counts.items()):
        if key != ("admitted", "sticky"):
            print(f"{key[0]} ({key[1]}): {n}, mean {tokens[key] / n:,.0f} tokens")


if __name__ == "__main__":
    main(sys.argv[1:])
