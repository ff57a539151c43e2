"""The table of docs/benchmarks.md's section "The simulator sized like the live runs", from
the sim.json files run.sh wrote. Usage: .venv/bin/python summary.py [DIR] (default: here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CASES = [("calibrated", s) for s in ("trace", "long", "fanout", "agentic-code", "claude-code")] \
    + [("tiered", s) for s in ("trace", "long", "agentic-code")] \
    + [("cheap-recompute", "synthetic")]


def main(root: Path) -> None:
    print("| regime, shape | seed | steps/min: stock / ours / Python port | ours / stock | "
          "Python port / stock | ours / Python port | hit rate: stock / ours / Python port "
          "| median turn (s): stock / ours / Python port |")
    print("|---|---|---|---|---|---|---|---|")
    for regime, shape in CASES:
        for seed in ("0", "1", "2", "0, 1x"):
            name = f"{regime}-{shape}-" + ("1x" if seed.endswith("1x") else f"seed{seed}")
            path = root / name / "sim.json"
            if not path.is_file():
                continue
            by = {r["arm"]: r for r in json.loads(path.read_text())["results"]}
            s, o, p = by["stock"], by["ours"], by["dynamo-python"]
            print(f"| {regime}, {shape} | {seed} | {s['steps_per_min']:.1f} / "
                  f"{o['steps_per_min']:.1f} / {p['steps_per_min']:.1f} | "
                  f"{o['steps_per_min'] / s['steps_per_min']:.2f}x | "
                  f"{p['steps_per_min'] / s['steps_per_min']:.2f}x | "
                  f"{o['steps_per_min'] / p['steps_per_min']:.2f}x | "
                  f"{s['hit_rate']:.2f} / {o['hit_rate']:.2f} / {p['hit_rate']:.2f} | "
                  f"{s['latency_p50_s']:.1f} / {o['latency_p50_s']:.1f} / "
                  f"{p['latency_p50_s']:.1f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
