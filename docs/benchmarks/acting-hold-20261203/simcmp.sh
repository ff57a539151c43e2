#!/usr/bin/env bash
# simcmp POLICY: fanout 22,30; long 24,36; trace 24,36; claude 32
cd "$(dirname "$0")/../../.."
p=$1
run() { .venv/bin/python -m dynamo_thunderagent bench sim "$@" --arms ours --policy $p --jobs 2 2>/dev/null | grep -E "^\| [0-9]+ \| ours" | awk -F'|' -v l="$1 $4" '{print l, $2, $4, $5, $9}'; }
run --regime calibrated --workload fanout --agents 22,30
run --regime calibrated --workload long --agents 24,36
run --regime calibrated --workload trace --agents 24,36
.venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --trace "${CLAUDE_TRACE:-claude-code.jsonl}" --token-scale 0.4 --time-scale 1 --agents 32 --arms ours --policy $p --jobs 2 2>/dev/null | grep -E "^\| [0-9]+ \| ours" | awk -F'|' '{print "claude", $2, $4, $5, $9}'
