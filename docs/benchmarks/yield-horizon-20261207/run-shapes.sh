#!/usr/bin/env bash
# The four shapes of gen_shapes.py, seeds 3 and 4, in the simulator (calibrated regime, stock and
# ours at 1x, 2x and 3x the KV capacity). About a minute on 2 cores.
# Usage: docs/benchmarks/yield-horizon-20261207/run-shapes.sh [POLICY]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
policy=${1:-policies/thunderagent-extended.yaml}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for shape in chat research reasoning bimodal; do
  for seed in 3 4; do
    .venv/bin/python "$here/gen_shapes.py" "$shape" "$tmp/$shape-$seed.jsonl" "$seed"
    echo "### $shape, seed $seed"
    .venv/bin/python -m dynamo_thunderagent bench sim --trace "$tmp/$shape-$seed.jsonl" \
      --arms stock,ours --factors 1,2,3 --policy "$policy" --jobs 2 2>/dev/null \
      | grep -E '^\| (N|---|[0-9]+ \| [0-9.]+ \| )'
  done
done
