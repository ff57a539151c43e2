"""Ours with a policy variant on every shape, sized as the live runs are (3x, seeds 0-2), set
against stock, the Python port and the shipped policy of run.sh's runs in this folder.

Usage, from the repository root, after run.sh (it reads that script's sim.json files):
  .venv/bin/python docs/benchmarks/sim-live-sizing-20261205/variants.py POLICY.yaml CLAUDE_TRACE
Prints one line per case (steps/min, its ratio to the shipped policy, to stock and to the port,
hit rate and median turn against the shipped policy's) and then a line per shape.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dynamo_thunderagent.bench.sim.command import run_case

HERE = Path(__file__).resolve().parent


def cases(claude: str) -> dict[str, list[str]]:
    return {
        "calibrated-trace": ["--regime", "calibrated", "--workload", "trace"],
        "calibrated-long": ["--regime", "calibrated", "--workload", "long"],
        "calibrated-fanout": ["--regime", "calibrated", "--workload", "fanout"],
        "calibrated-agentic-code": ["--regime", "calibrated", "--workload", "agentic-code"],
        "calibrated-claude-code": ["--regime", "calibrated", "--trace", claude],
        "tiered-trace": ["--regime", "tiered", "--workload", "trace"],
        "tiered-long": ["--regime", "tiered", "--workload", "long"],
        "cheap-recompute-synthetic": ["--regime", "cheap-recompute"],
    }


def one(task: tuple[str, list[str], int, str]) -> tuple[str, int, float, float, float]:
    name, flags, seed, policy = task
    flags = [*flags, "--live-sizing", "--no-reuse-output", "--seed", str(seed), "--arms",
             "ours", "--policy", policy]
    if name.startswith("cheap"):
        flags += ["--agents", "30", "--warmup-s", "15", "--window-s", "135"]
    else:
        flags += ["--agents", "24", "--warmup-s", "60", "--window-s", "540"]
    f = run_case(flags)
    return name, seed, f.steps_per_min, f.hit_rate, f.latency_p50_s


def main(policy: str, claude: str) -> None:
    tasks = [(n, f, s, policy) for n, f in cases(claude).items() for s in (0, 1, 2)]
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(one, tasks))
    per_shape: dict[str, list[tuple[float, float, float]]] = {}
    for name, seed, spm, hit, p50 in results:
        data = json.loads((HERE / f"{name}-seed{seed}" / "sim.json").read_text())
        by = {r["arm"]: r for r in data["results"]}
        base = by["ours"]
        ratio = spm / base["steps_per_min"]
        print(f"{name} seed {seed}: {spm:.1f} steps/min, {ratio:.3f}x the shipped policy, "
              f"{spm / by['stock']['steps_per_min']:.2f}x stock, "
              f"{spm / by['dynamo-python']['steps_per_min']:.2f}x the Python port; hit rate "
              f"{hit:.2f} ({base['hit_rate']:.2f}), median turn {p50:.1f} s "
              f"({base['latency_p50_s']:.1f} s)")
        per_shape.setdefault(name, []).append(
            (ratio, hit - base["hit_rate"], p50 / base["latency_p50_s"]))
    ratios = [r for rows in per_shape.values() for r, _, _ in rows]
    print(f"{Path(policy).name}: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}x "
          f"the shipped policy, lowest {min(ratios):.3f}x")
    for name, rows in per_shape.items():
        lo, hi = min(r for r, _, _ in rows), max(r for r, _, _ in rows)
        hit = sum(h for _, h, _ in rows) / len(rows)
        p50 = sum(m for _, _, m in rows) / len(rows)
        print(f"  {name}: {lo:.3f}-{hi:.3f}x, hit rate {hit:+.2f}, median turn {p50:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
