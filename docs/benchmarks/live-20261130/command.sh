#!/bin/bash
# Full live sweep, run from a snapshot of commit 5094a82 (git archive) so that concurrent edits
# to the working tree do not change arm 'ours' mid-sweep.
cd /work/live-snapshot  # was: git archive 5094a82 | tar -x -C /work/live-snapshot (removed after the run)
export DTA_CODE_VERSION=5094a82
exec /work/main/.venv/bin/python -m dynamo_thunderagent bench live --regime all \
  --arms stock,builtin,dynamo-python,ours --policy policies/thunderagent-extended.yaml \
  --arm-policy parity=policies/thunderagent.yaml \
  --repeats 2 --window 35 --warmup 8 --out /work/main/bench-results/full-20261130T095622Z
