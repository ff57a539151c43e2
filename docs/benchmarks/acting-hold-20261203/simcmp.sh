#!/usr/bin/env bash
# The simulator on the shapes of docs/benchmarks.md, "The hold on real Claude Code sessions":
# ours with POLICY on fan-out (22, 30 agents), long (24, 36), the SWE trace (24, 36) and the
# Claude Code trace (32; token scale 0.4, time scale 1). One line per run:
# shape, agents, steps/min, hit rate, pauses.
# Usage: docs/benchmarks/acting-hold-20261203/simcmp.sh POLICY
#   (from the repository root after `make setup`; CLAUDE_TRACE names the trace that
#   `dynamo-thunderagent bench trace --from-kv-cache-tester` wrote, default claude-code.jsonl)
set -euo pipefail
policy=$(realpath "${1:?usage: simcmp.sh POLICY}")
trace=$(realpath "${CLAUDE_TRACE:-claude-code.jsonl}")
cd "$(dirname "$0")/../../.."
python=${PYTHON:-.venv/bin/python}
run() {  # run LABEL ARGS...
  local label=$1
  shift
  "$python" -m dynamo_thunderagent bench sim --regime calibrated "$@" --arms ours \
    --policy "$policy" --jobs 2 | grep -E '^\| [0-9]+ \| ours' \
    | awk -F'|' -v l="$label" '{print l, $2, $4, $5, $9}'
}
run fanout --workload fanout --agents 22,30
run long --workload long --agents 24,36
run trace --workload trace --agents 24,36
run claude --trace "$trace" --token-scale 0.4 --time-scale 1 --agents 32
