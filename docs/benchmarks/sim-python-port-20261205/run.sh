#!/usr/bin/env bash
# The simulator's dynamo-python arm beside ours, stock and upstream, as recorded here
# (docs/benchmarks.md, "The simulator's dynamo-python arm"). From the repository root:
#   bash docs/benchmarks/sim-python-port-20261205/run.sh [OUT_DIR] [CLAUDE_CODE_TRACE]
# CLAUDE_CODE_TRACE: the real Claude Code sessions as a trace, made as section "Real Claude Code
# sessions" says (bench trace --from-kv-cache-tester ...); without it those runs are skipped.
# About a minute on 2 cores. Windows like the live ones: 60 s of warm-up and 600 s of window
# in the engine's time for the calibrated and tiered regimes (150 s on their quarter-speed
# clock), the preset's 60 s and 300 s for cheap recompute (its clock is the real one).
set -euo pipefail
out=${1:-docs/benchmarks/sim-python-port-20261205}
claude=${2:-}
sim() { .venv/bin/dynamo-thunderagent bench sim --arms ours,stock,upstream,dynamo-python \
          --no-reuse-output --jobs 2 "$@"; }
for seed in 1 2 3; do
  for regime in calibrated tiered; do
    for shape in trace long fanout agentic-code; do
      sim --regime "$regime" --workload "$shape" --seed "$seed" --warmup-s 60 --window-s 600 \
        --out "$out/$regime-$shape-seed$seed" > /dev/null
    done
  done
  sim --regime cheap-recompute --workload synthetic --seed "$seed" \
    --out "$out/cheap-recompute-synthetic-seed$seed" > /dev/null
  if [ -n "$claude" ]; then
    sim --regime calibrated --trace "$claude" --token-scale 0.4 --time-scale 1 --seed "$seed" \
      --warmup-s 60 --window-s 600 --out "$out/calibrated-claude-code-seed$seed" > /dev/null
  fi
done
