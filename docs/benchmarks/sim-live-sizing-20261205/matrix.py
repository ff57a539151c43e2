"""Ours with policy variants against the shipped policy on every live-sized case (3x, seeds
0-2), the mixed population included: per case the three seeds' steps/min ratios, and the
geometric mean over all; with --refs also the shipped policy against stock and the Python port.
Used for the hold's figures in docs/benchmarks.md ("A mixed population, sized like the live
runs"). From the repository root (CLAUDE: the Claude Code sessions as a trace; MIXED: it
concatenated with the SWE-agent trace, as mixed.sh does):
  .venv/bin/python docs/benchmarks/sim-live-sizing-20261205/matrix.py CLAUDE MIXED \
      [--refs] POLICY.yaml...
A few minutes on 2 cores per variant.
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from dynamo_thunderagent.bench.sim.command import run_case

CLAUDE, MIXED = sys.argv[1], sys.argv[2]
CASES = {
    "cal-trace": ["--regime", "calibrated", "--workload", "trace"],
    "cal-long": ["--regime", "calibrated", "--workload", "long"],
    "cal-fanout": ["--regime", "calibrated", "--workload", "fanout"],
    "cal-agentic": ["--regime", "calibrated", "--workload", "agentic-code"],
    "cal-claude": ["--regime", "calibrated", "--trace", CLAUDE],
    "cal-mixed": ["--regime", "calibrated", "--trace", MIXED],
    "tier-trace": ["--regime", "tiered", "--workload", "trace"],
    "tier-long": ["--regime", "tiered", "--workload", "long"],
    "cheap": ["--regime", "cheap-recompute"],
}


def one(task: tuple[str, int, str, str | None]) -> tuple[Any, tuple[float, float, float]]:
    name, seed, arm, policy = task
    flags = [*CASES[name], "--live-sizing", "--no-reuse-output", "--seed", str(seed),
             "--arms", arm]
    if policy:
        flags += ["--policy", policy]
    flags += (["--agents", "30", "--warmup-s", "15", "--window-s", "135"] if name == "cheap"
              else ["--agents", "24", "--warmup-s", "60", "--window-s", "540"])
    f = run_case(flags)
    return (name, seed, arm, policy), (f.steps_per_min, f.hit_rate, f.latency_p50_s)


def main(policies: list[str], with_refs: bool) -> None:
    seeds = (0, 1, 2)
    tasks = [(n, s, "ours", p) for n in CASES for s in seeds for p in [None, *policies]]
    if with_refs:
        tasks += [(n, s, a, None) for n in CASES for s in seeds
                  for a in ("stock", "dynamo-python")]
    with ProcessPoolExecutor(2) as pool:
        res = dict(pool.map(one, tasks))
    for p in policies:
        print("==", p)
        logs = []
        for n in CASES:
            ratios = [res[(n, s, "ours", p)][0] / res[(n, s, "ours", None)][0] for s in seeds]
            logs += [math.log(r) for r in ratios]
            hit, base = res[(n, 0, "ours", p)][1], res[(n, 0, "ours", None)][1]
            print(f"  {n}: " + " ".join(f"{r:.3f}" for r in ratios)
                  + f"  hit rate (seed 0) {hit:.2f} against {base:.2f}")
        print(f"  geomean {math.exp(sum(logs) / len(logs)):.4f}, "
              f"lowest {math.exp(min(logs)):.3f}")
    if with_refs:
        print("== shipped policy: ours / stock, ours / Python port, per seed")
        for n in CASES:
            ours = [res[(n, s, "ours", None)][0] for s in seeds]
            stock = [res[(n, s, "stock", None)][0] for s in seeds]
            port = [res[(n, s, "dynamo-python", None)][0] for s in seeds]
            print(f"  {n}: " + " ".join(f"{o / a:.2f}/{o / b:.2f}"
                                         for o, a, b in zip(ours, stock, port, strict=True)))


if __name__ == "__main__":
    main([a for a in sys.argv[3:] if a != "--refs"], "--refs" in sys.argv)
