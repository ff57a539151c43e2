#!/usr/bin/env bash
# The no-eviction ceiling of docs/benchmarks.md ("How far any scheduler can go"): the same 24
# agents of each calibrated shape, first on four times the KV blocks (nothing is ever
# evicted: what any scheduler could reach at best), then stock on the usual blocks (3x
# capacity), one 150 s window each. About 25 minutes.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-bench-results/ceiling}
# Four times each shape's blocks per worker at 3x (trace 1,084, long 1,088, fan-out 1,784).
for spec in "long 4352" "trace 4336" "fanout 7136"; do
  read -r shape blocks <<< "$spec"
  .venv/bin/dynamo-thunderagent bench live --regime calibrated --workload "$shape" --agents 24 \
    --blocks "$blocks" --arms stock,ours --window 150 --warmup 15 --repeats 1 --no-plots \
    --out "$out/$shape"
done
for shape in long trace fanout; do
  .venv/bin/dynamo-thunderagent bench live --regime calibrated --workload "$shape" --agents 24 \
    --arms stock --window 150 --warmup 15 --repeats 1 --no-plots --out "$out/$shape-pressure"
done
