#!/usr/bin/env bash
# Rollouts in the simulator: one batch of N agents run to its end, every shape, 1x and 3x the
# KV capacity, three seeds; the batch's makespan and mean run time per arm, and ours against
# stock. Usage: docs/benchmarks/rollout-20261204/sim.sh [CLAUDE_TRACE]  (a trace written by
# `bench trace --from-kv-cache-tester`; its rows are skipped without it). About a minute.
set -euo pipefail
cd "$(dirname "$0")/../../.."
claude=${1:-}
arms=stock,ours,upstream,ttl-pinning
summary() {  # summary LABEL: one row per N from bench sim --json on stdin
  .venv/bin/python -c '
import json, sys
label = sys.argv[1]
data = json.load(sys.stdin)
by = {}
for r in data["results"]:
    by.setdefault(r["agents"], {})[r["arm"]] = r
for n, arms in sorted(by.items()):
    base = arms["stock"]["rollout"]["makespan_s"]
    cells = []
    for name in ("stock", "ours", "upstream", "ttl-pinning"):
        b = arms[name]["rollout"]
        m = b["makespan_s"]
        ratio = "" if name == "stock" or m is None else f" ({base / m:.2f}x)"
        mean = "-" if b["run_mean_s"] is None else format(b["run_mean_s"], ".0f")
        cells.append(("cut" if m is None else f"{m:.0f}") + ratio + f" / {mean}")
    print(f"| {label} | {n} | " + " | ".join(cells) + " |")
' "$1"
}
echo "| case | N | stock | ours | upstream | ttl-pinning |"
echo "|---|---|---|---|---|---|"
for seed in 0 1 2; do
  for w in trace long fanout agentic-code synthetic; do
    n1=$(.venv/bin/python -c "
from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.run import sweep_agents
import argparse
p = argparse.ArgumentParser(); add_arguments(p)
spec = spec_from_args(p.parse_args(['--regime', 'calibrated', '--workload', '$w', '--seed', '$seed']))
print(','.join(str(n) for n in sweep_agents(spec.scenario, $seed, (1.0, 3.0))))")
    .venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --workload "$w" \
      --seed "$seed" --agents "$n1" --arms "$arms" --rollout --json --jobs 2 2>/dev/null \
      | summary "calibrated $w, seed $seed"
  done
  .venv/bin/python -m dynamo_thunderagent bench sim --regime cheap-recompute --seed "$seed" \
    --agents 10,30 --arms "$arms" --rollout --json --jobs 2 2>/dev/null \
    | summary "cheap-recompute toy, seed $seed"
  if [[ -n "$claude" ]]; then
    .venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --trace "$claude" \
      --token-scale 0.4 --time-scale 1 --seed "$seed" --agents 11,32 --arms "$arms" \
      --rollout --json --jobs 2 2>/dev/null | summary "Claude Code sessions, seed $seed"
  fi
done
