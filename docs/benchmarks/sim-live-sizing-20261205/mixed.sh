#!/usr/bin/env bash
# A population the policy was not tuned on: the shared SWE-agent trace's agents and the real
# Claude Code sessions (section "Real Claude Code sessions") in one trace, so that short,
# fast programs and long ones of 80k tokens share the pool. Sized as bench live sizes it (3x,
# 24 agents, live's window), seeds 0-2, stock, ours and the Python port, then ours with
# acting_hold_factor 1. From the repository root:
#   bash docs/benchmarks/sim-live-sizing-20261205/mixed.sh CLAUDE_CODE_TRACE [OUT_DIR]
# About 20 s on 2 cores.
set -euo pipefail
claude=$1
out=${2:-docs/benchmarks/sim-live-sizing-20261205}
work=$(mktemp -d)
cat ../shared/traces/swe-agent-lite-glm45.jsonl "$claude" > "$work/mixed.jsonl"
cp policies/thunderagent-extended.yaml "$work/hold1.yaml"
sed -i "0,/^    pause_threshold:/s//    acting_hold_factor: 1\n    pause_threshold:/" "$work/hold1.yaml"
for seed in 0 1 2; do
  for variant in shipped hold1; do
    if [ "$variant" = shipped ]; then arms=stock,ours,dynamo-python; policy=(); else
      arms=ours; policy=(--policy "$work/hold1.yaml"); fi
    .venv/bin/dynamo-thunderagent bench sim --regime calibrated --trace "$work/mixed.jsonl" \
      --live-sizing --agents 24 --arms "$arms" "${policy[@]}" --no-reuse-output --jobs 2 \
      --seed "$seed" --warmup-s 60 --window-s 540 \
      --out "$out/calibrated-mixed-$variant-seed$seed" > /dev/null
  done
done
rm -rf "$work"
