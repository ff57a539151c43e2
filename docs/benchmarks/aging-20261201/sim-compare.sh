#!/usr/bin/env bash
# Ours against stock in the simulator, per shape and N, for each policy given: steps/min
# ratio, hit rate (ours/stock), turn latency p50 and p99 (ours/stock) and ours' longest
# admission wait. The rows of docs/benchmarks.md, "Bounded waits". About 30 s per policy.
# Usage: docs/benchmarks/aging-20261201/sim-compare.sh POLICY...
set -euo pipefail
cd "$(dirname "$0")/../../.."
read -r -d '' ROWS <<'PY' || true
import json, os, sys
d = json.load(sys.stdin)
by = {(r["agents"], r["arm"]): r for r in d["results"]}
label, policy = os.environ["LABEL"], os.environ["POLICY"]
for n in sorted({a for a, _ in by}):
    s, o = by[(n, "stock")], by[(n, "ours")]
    ratio = o["steps_per_min"] / s["steps_per_min"]
    print(f"{label} {policy} N={n}: x{ratio:.2f}"
          f" hit {o['hit_rate']:.2f}/{s['hit_rate']:.2f}"
          f" p50 {o['latency_p50_s']:.1f}/{s['latency_p50_s']:.1f}"
          f" p99 {o['latency_p99_s']:.1f}/{s['latency_p99_s']:.1f}"
          f" waitmax {o['wait_max_s']:.0f}")
PY
cases=(
  "cal-long|--regime calibrated --workload long --agents 24,36,48"
  "cal-trace|--regime calibrated --workload trace --agents 24,36,48"
  "cal-fanout|--regime calibrated --workload fanout --agents 14,22,30"
  "cal-synth|--regime calibrated --workload synthetic --agents 16,24,32"
  "cheap-toy|--regime cheap-recompute --workload synthetic --agents 20,30,40"
  "cheap-long|--regime cheap-recompute --workload long --agents 24,36"
  "tier-long|--regime tiered --workload long --agents 24,36,48"
  "tier-trace|--regime tiered --workload trace --agents 24,36,48"
)
for c in "${cases[@]}"; do
  label=${c%%|*}
  read -r -a args <<< "${c#*|}"
  for policy in "$@"; do
    .venv/bin/python -m dynamo_thunderagent bench sim "${args[@]}" --arms stock,ours \
      --policy "$policy" --jobs 2 --json 2>/dev/null \
      | LABEL="$label" POLICY="$(basename "$policy")" .venv/bin/python -c "$ROWS"
  done
done
