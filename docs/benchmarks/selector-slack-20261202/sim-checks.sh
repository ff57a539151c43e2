#!/usr/bin/env bash
# The simulator figures of docs/benchmarks.md "Leaving a busy home" that no probe file holds:
# ours with nothing pausing (no-pause.yaml: the extended policy without the selector's slack and
# pause_min_recompute_ratio 8), and the toy agents on twice the KV with and without the slack,
# over four seeds. Output: sim-checks.txt. Run from the repository root.
set -euo pipefail
d=docs/benchmarks/selector-slack-20261202
sim=(.venv/bin/python -m dynamo_thunderagent bench sim --jobs 1)
without=policies/ablations/minus_preferred_load_slack.yaml
{
  echo "## nothing pausing (no-pause.yaml)"
  "${sim[@]}" --arms stock,ours --regime cheap-recompute --workload synthetic --time-scale 4 --agents 60 --policy $d/no-pause.yaml
  "${sim[@]}" --arms stock,ours --regime cheap-recompute --workload synthetic --token-scale 2 --agents 10 --policy $d/no-pause.yaml
  "${sim[@]}" --arms stock,ours --workload agentic-code --agents 5 --policy $d/no-pause.yaml
  for seed in 0 1 2 3; do
    echo "## toy agents, KV x2, seed $seed, without the slack"
    "${sim[@]}" --arms stock,ours --regime cheap-recompute --workload synthetic --blocks 2816 --agents 70,80 --seed $seed --policy $without
  done
  echo "## toy agents, KV x2, with the slack (shipped)"
  "${sim[@]}" --arms ours --regime cheap-recompute --workload synthetic --blocks 2816 --agents 70
} 2>/dev/null | grep -E '^(##|\| [0-9]+ \| (stock|ours) |\| [0-9]+ \| [0-9.]+ \| )'
