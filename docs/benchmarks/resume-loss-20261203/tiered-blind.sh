#!/bin/bash
# Simulator, tiered regime, ours blind to the tier (host_kv_blocks: 0): before pause_min_resume_loss
# (blind-before.yaml) and with it (policies/ablations/minus_host_tier.yaml), beside stock and ours
# told the tier. Prints sim-tiered-blind.md's table (about a minute on 2 cores).
cd "$(dirname "$0")/../../.."
row() { # label args...
  label=$1; shift
  s=$(.venv/bin/python -m dynamo_thunderagent bench sim --jobs 1 --json --arms stock,ours "$@" 2>/dev/null)
  o=$(.venv/bin/python -m dynamo_thunderagent bench sim --jobs 1 --json --arms ours --policy docs/benchmarks/resume-loss-20261203/blind-before.yaml "$@" 2>/dev/null)
  n=$(.venv/bin/python -m dynamo_thunderagent bench sim --jobs 1 --json --arms ours --policy policies/ablations/minus_host_tier.yaml "$@" 2>/dev/null)
  python3 - "$label" "$s" "$o" "$n" <<'PY'
import json,sys
label=sys.argv[1]; s,o,n=(json.loads(x)["results"] for x in sys.argv[2:5])
st={r["agents"]:r for r in s if r["arm"]=="stock"}; aw={r["agents"]:r for r in s if r["arm"]=="ours"}
for ro,rn in zip(o,n):
    N=ro["agents"]; b=st[N]["steps_per_min"]
    print(f'| {label} | {N} | {b:.1f} | {aw[N]["steps_per_min"]:.1f} ({aw[N]["steps_per_min"]/b:.2f}x) | {ro["steps_per_min"]:.1f} ({ro["steps_per_min"]/b:.2f}x), {ro["pauses"]} pauses, wait max {ro["wait_max_s"]:.0f} s | {rn["steps_per_min"]:.1f} ({rn["steps_per_min"]/b:.2f}x), {rn["pauses"]} pauses, wait max {rn["wait_max_s"]:.0f} s |')
PY
}
echo "| shape | N | stock | ours told the tier | ours blind, before | ours blind, with pause_min_resume_loss (shipped) |"
echo "|---|---|---|---|---|---|"
row "trace" --regime tiered --workload trace --agents 24,36,48 &
row "long" --regime tiered --workload long --agents 24,36,48 &
wait
row "fanout" --regime tiered --workload fanout --agents 14,22,30 &
row "synthetic SWE" --regime tiered --workload synthetic --agents 16,24,32 &
wait
row "agentic-code" --regime tiered --workload agentic-code --agents 9,14 &
row "long, tools x4" --regime tiered --workload long --time-scale 4 --agents 24,48 &
wait
row "trace, 60 and 84 (5x, 7x)" --regime tiered --workload trace --agents 60,84
