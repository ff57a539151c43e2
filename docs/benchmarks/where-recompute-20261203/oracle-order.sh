#!/bin/bash
# Every mode of oracle_order.py on each shape, seeds 1 and 2 (about 1 minute in all).
# Run from the repository root: bash docs/benchmarks/where-recompute-20261203/oracle-order.sh
set -euo pipefail
script=docs/benchmarks/where-recompute-20261203/oracle_order.py
for mode in base cached_first lost_tokens; do
  for seed in 1 2; do
    for case in "trace 36" "long 36" "long 24" "fanout 22" "agentic-code 14" "agentic-code 9"; do
      set -- $case
      .venv/bin/python "$script" "$mode" "$1" "$2" ours --seed "$seed"
    done
    .venv/bin/python "$script" "$mode" synthetic 30 ours --regime cheap-recompute --seed "$seed"
  done
done
