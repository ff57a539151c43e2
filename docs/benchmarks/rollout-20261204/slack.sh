#!/usr/bin/env bash
# The selector's load slack at 0.25 instead of 1.0 on rollouts, against the extended policy
# as it was before leave_for_empty_rank (policies/ablations/minus_leave_for_empty_rank.yaml):
# makespan / mean run of ours per case. About 30 seconds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
base=policies/ablations/minus_leave_for_empty_rank.yaml
slack=$(mktemp --suffix=.yaml)
trap 'rm -f "$slack"' EXIT
sed "s/preferred_load_slack: 1.0/preferred_load_slack: 0.25/" "$base" > "$slack"
grep -q "preferred_load_slack: 0.25" "$slack"
for w in "agentic-code 5,14" "trace 12,36" "long 12,36" "fanout 7,22"; do
  set -- $w
  for seed in 0 1 2; do
    for policy in "$base" "$slack"; do
      label=$([[ $policy == "$base" ]] && echo "slack 1.0 " || echo "slack 0.25")
      .venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --workload "$1" \
        --seed "$seed" --agents "$2" --arms ours --rollout --json --jobs 1 --policy "$policy" \
        2>/dev/null | .venv/bin/python -c '
import json, sys
d = json.load(sys.stdin)
cells = []
for r in d["results"]:
    b = r["rollout"]
    cells.append("%d: %.0f / %.0f" % (r["agents"], b["makespan_s"], b["run_mean_s"]))
print(sys.argv[1], "|", "  ".join(cells))' "$1 seed $seed, $label"
    done
  done
done
