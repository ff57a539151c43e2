#!/usr/bin/env bash
# The probes docs/benchmarks.md quotes beside the table (section "The simulator's
# dynamo-python arm"), written to probes.txt. From the repository root:
#   bash docs/benchmarks/sim-python-port-20261205/probes.sh CLAUDE_CODE_TRACE
set -euo pipefail
dir=docs/benchmarks/sim-python-port-20261205
claude=$1
live=(--no-reuse-output --warmup-s 60 --window-s 600)
{
  echo "# 1. The longest waits of the port in one agentic-code run and one cheap-recompute trace run"
  .venv/bin/python "$dir/waits.py" calibrated agentic-code 13 1 "${live[@]}"
  .venv/bin/python "$dir/waits.py" cheap-recompute trace 1 1 "${live[@]}"
  echo "# 2. The SWE trace at 1 and 2 agents with cheap recompute, seeds 1-3"
  for seed in 1 2 3; do
    .venv/bin/dynamo-thunderagent bench sim --regime cheap-recompute --workload trace \
      --agents 1,2 --arms stock,dynamo-python --seed "$seed" "${live[@]}" 2>/dev/null \
      | grep -E '^\| [0-9]+ \| [0-9]'
  done
  echo "# 3. Claude Code sessions with contexts half again as large (token scale 0.6), seed 1"
  .venv/bin/dynamo-thunderagent bench sim --regime calibrated --trace "$claude" \
    --token-scale 0.6 --time-scale 1 --agents 32 --arms stock,ours,dynamo-python --seed 1 \
    "${live[@]}" 2>/dev/null | grep -E '^\| 32 \| [a-z]'
} > "$dir/probes.txt"
