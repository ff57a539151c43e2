#!/usr/bin/env bash
# The extended policy's variants re-measured at live sizing (docs/benchmarks.md, "The
# simulator sized like the live runs"), into variants.txt. From the repository root, after
# run.sh: bash docs/benchmarks/sim-live-sizing-20261205/variants.sh CLAUDE_CODE_TRACE
# About 15 s a variant on 2 cores.
set -euo pipefail
claude=$1
here=docs/benchmarks/sim-live-sizing-20261205
work=$(mktemp -d)
variant() {  # variant NAME KEY=VALUE...: the shipped policy with those parameters set
  local name=$1; shift
  cp policies/thunderagent-extended.yaml "$work/$name.yaml"
  for kv in "$@"; do
    local k=${kv%%=*} v=${kv#*=}
    if grep -q "^    $k:" "$work/$name.yaml"; then
      sed -i "s/^    $k: [^ ]*/    $k: $v/" "$work/$name.yaml"
    else
      sed -i "0,/^    pause_threshold:/s//    $k: $v\n    pause_threshold:/" "$work/$name.yaml"
    fi
  done
  .venv/bin/python "$here/variants.py" "$work/$name.yaml" "$claude"
}
{
  variant acting_hold_factor-1 acting_hold_factor=1
  variant acting_hold_factor-2 acting_hold_factor=2
  variant acting_decay_tau_seconds-15 acting_decay_tau_seconds=15
  variant acting_decay_tau_seconds-60 acting_decay_tau_seconds=60
  variant resume_hysteresis-0.25 resume_hysteresis=0.25
  variant resume_timeout_seconds-180 resume_timeout_seconds=180
  variant resume_timeout_seconds-240 resume_timeout_seconds=240
  variant min_residency_seconds-15 min_residency_seconds=15
  variant pause_min_recompute_ratio-2 pause_min_recompute_ratio=2
} > "$here/variants.txt"
rm -rf "$work"
