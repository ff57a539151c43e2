#!/usr/bin/env bash
# Generality probes: ours against stock in the simulator on settings no policy was tuned on
# (other seeds, 4 and 8 workers, tool times x0.25 and x4, tokens x0.5 and x2, engine limits,
# twice the KV, clients that do not send replies back) besides every regime and shape at 1x-4x
# the KV capacity (aiperf's agentic-code sessions included). Prints one markdown row per case,
# sorted, and the cases where ours is below stock by more than 1%. About 2 minutes on 2 cores.
# Usage: docs/benchmarks/sim/run-probes.sh [POLICY]   (default: the shipped extended policy)
set -euo pipefail
cd "$(dirname "$0")/../../.."
policy=${1:-policies/thunderagent-extended.yaml}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

probe() {  # probe LABEL ARGS...: one sweep of stock and ours, rows prefixed with LABEL
  local label=$1
  shift
  .venv/bin/python -m dynamo_thunderagent bench sim "$@" --arms stock,ours \
    --policy "$policy" --jobs 1 2>/dev/null \
    | grep -E '^\| [0-9]+ \| [0-9.]+ \| ' | sed "s/^/| $label /" > "$tmp/$label.md"
}

cases=(
  "cheap-recompute toy|--regime cheap-recompute --workload synthetic --agents 10,20,30,40,50"
  "cheap-recompute long|--regime cheap-recompute --workload long --agents 12,24,36,48"
  "cheap-recompute fanout|--regime cheap-recompute --workload fanout --agents 7,14,22,30"
  "cheap-recompute toy, seed 2|--regime cheap-recompute --workload synthetic --seed 2 --agents 20,30,40"
  "cheap-recompute toy, tools x4|--regime cheap-recompute --workload synthetic --time-scale 4 --agents 30,60,90"
  "cheap-recompute toy, tokens x2|--regime cheap-recompute --workload synthetic --token-scale 2 --agents 10,15,20"
  "calibrated trace|--regime calibrated --workload trace --agents 12,24,36,48"
  "calibrated trace, seed 2|--regime calibrated --workload trace --seed 2 --agents 24,36"
  "calibrated trace, 4 workers|--regime calibrated --workload trace --workers 4 --agents 24,48,72"
  "calibrated long|--regime calibrated --workload long --agents 12,24,36,48"
  "calibrated long, 4 workers|--regime calibrated --workload long --workers 4 --agents 24,48,72"
  "calibrated long, tools x0.25|--regime calibrated --workload long --time-scale 0.25 --agents 24,36"
  "calibrated fanout|--regime calibrated --workload fanout --agents 7,14,22,30,40"
  "calibrated fanout, seed 2|--regime calibrated --workload fanout --seed 2 --agents 14,22,30"
  "calibrated fanout, 4 workers|--regime calibrated --workload fanout --workers 4 --agents 28,44,60"
  "calibrated synthetic SWE|--regime calibrated --workload synthetic --agents 8,16,24,32"
  "calibrated synthetic SWE, tools x0.25|--regime calibrated --workload synthetic --time-scale 0.25 --agents 16,24,32"
  "calibrated synthetic SWE, tools x4|--regime calibrated --workload synthetic --time-scale 4 --agents 16,32,48"
  "tiered trace|--regime tiered --workload trace --agents 24,36,48"
  "tiered long|--regime tiered --workload long --agents 24,36,48"
  "tiered fanout|--regime tiered --workload fanout --agents 14,22,30"
  "tiered synthetic SWE|--regime tiered --workload synthetic --agents 16,24,32"
  # Engines, fleets and clients no policy was tuned on either.
  "cheap-recompute toy, max-num-seqs 8|--regime cheap-recompute --workload synthetic --max-num-seqs 8 --agents 10,20,30"
  "cheap-recompute toy, 512-token passes|--regime cheap-recompute --workload synthetic --max-num-batched-tokens 512 --agents 20,30"
  "cheap-recompute toy, replies not reused|--regime cheap-recompute --workload synthetic --no-reuse-output --agents 20,30"
  "cheap-recompute toy, 8 workers|--regime cheap-recompute --workload synthetic --workers 8 --agents 40,80,120"
  "cheap-recompute toy, KV x2|--regime cheap-recompute --workload synthetic --blocks 2816 --agents 30,50,70"
  "cheap-recompute long, tokens x2|--regime cheap-recompute --workload long --token-scale 2 --agents 12,24"
  "cheap-recompute fanout, tokens x2|--regime cheap-recompute --workload fanout --token-scale 2 --agents 14,22"
  "calibrated trace, max-num-seqs 16|--regime calibrated --workload trace --max-num-seqs 16 --agents 24,36"
  "calibrated trace, 8 workers|--regime calibrated --workload trace --workers 8 --agents 48,96"
  "calibrated trace, tokens x0.5|--regime calibrated --workload trace --token-scale 0.5 --agents 48,72"
  "calibrated long, max-num-seqs 8|--regime calibrated --workload long --max-num-seqs 8 --agents 24,36"
  "calibrated fanout, tokens x2|--regime calibrated --workload fanout --token-scale 2 --agents 11,16,22"
  "calibrated fanout, tools x4|--regime calibrated --workload fanout --time-scale 4 --agents 22,44"
  "tiered long, tools x4|--regime tiered --workload long --time-scale 4 --agents 24,48"
  # aiperf's agentic-code distributions: turns that are mostly decode.
  "calibrated agentic-code|--regime calibrated --workload agentic-code --agents 5,9,14,18"
  "calibrated agentic-code, seed 2|--regime calibrated --workload agentic-code --seed 2 --agents 9,14"
  "cheap-recompute agentic-code|--regime cheap-recompute --workload agentic-code --agents 9,14"
  "tiered agentic-code|--regime tiered --workload agentic-code --agents 9,14"
  # Tools that return within a second (tool times x0.1) on the mocker's own timing.
  "cheap-recompute toy, tools x0.1|--regime cheap-recompute --workload synthetic --time-scale 0.1 --agents 20,30"
  "cheap-recompute long, tools x0.1|--regime cheap-recompute --workload long --time-scale 0.1 --agents 24,36"
  "cheap-recompute fanout, tools x0.1|--regime cheap-recompute --workload fanout --time-scale 0.1 --agents 14,22"
  "cheap-recompute agentic-code, tools x0.1|--regime cheap-recompute --workload agentic-code --time-scale 0.1 --agents 7,9,14"
  "calibrated agentic-code, tools x0.1|--regime calibrated --workload agentic-code --time-scale 0.1 --agents 9,14"
)
running=0
for case in "${cases[@]}"; do
  label=${case%%|*}
  # shellcheck disable=SC2086
  probe "$label" ${case#*|} &
  running=$((running + 1))
  if (( running >= 2 )); then wait -n; running=$((running - 1)); fi
done
wait
echo "policy: $policy"
echo
echo "| case | N | stock | ours (x stock) |"
echo "|---|---|---|---|"
cat "$tmp"/*.md | sed 's/ | $/ |/' | sort -t'|' -k2,2 -k3n
echo
echo "Below stock by more than 1%:"
cat "$tmp"/*.md | grep -E '\((0\.[0-8][0-9]|0\.9[0-8])x\)' || echo "none"
