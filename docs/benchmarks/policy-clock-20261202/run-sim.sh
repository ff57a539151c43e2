#!/usr/bin/env bash
# The simulator (real clock: tokens and seconds unscaled) with the shipped extended policy and
# with every duration x4 (what the calibrated live harness ran before --policy-clock).
# Usage: docs/benchmarks/policy-clock-20261202/run-sim.sh > docs/benchmarks/policy-clock-20261202/sim.md
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=docs/benchmarks/policy-clock-20261202
sim() { .venv/bin/python -m dynamo_thunderagent bench sim "$@" --arms stock,ours --jobs 1 2>/dev/null \
          | grep -E '^\| [0-9]+ \| (stock|ours) '; }
echo "| shape | N | arm | steps/min | hit rate | recomputed tok | turn p50/p99 s | wait p50/p99/max s | pauses | resumes | moves | busy | problems |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for policy in policies/thunderagent-extended.yaml $here/thunderagent-extended-clock4.yaml; do
  label=$([ "$policy" = policies/thunderagent-extended.yaml ] && echo shipped || echo "durations x4")
  for case in "trace|--workload trace --agents 24,36" "long|--workload long --agents 24,36" \
              "fanout|--workload fanout --agents 22,30" \
              "agentic-code|--workload agentic-code --agents 9,14 --window-s 7200"; do
    sim --regime calibrated ${case#*|} --policy "$policy" | sed "s/^| /| ${case%%|*}, $label | /"
  done
done
