#!/usr/bin/env bash
# leave_for_empty_rank on rollouts: ours without it (minus_) and with it (the shipped extended
# policy), every calibrated shape at 1x, 2x and 3x, three seeds; per N: makespan / mean run /
# moves. About a minute.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for seed in 0 1 2; do
  for w in trace long fanout agentic-code synthetic; do
    for pol in policies/ablations/minus_leave_for_empty_rank.yaml policies/thunderagent-extended.yaml; do
      .venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --workload $w --seed $seed --arms ours --rollout --json --jobs 1 --policy $pol --agents $(.venv/bin/python -c "
from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.run import sweep_agents
import argparse
p = argparse.ArgumentParser(); add_arguments(p)
spec = spec_from_args(p.parse_args(['--regime', 'calibrated', '--workload', '$w', '--seed', '$seed']))
print(','.join(str(n) for n in sweep_agents(spec.scenario, $seed, (1.0, 2.0, 3.0))))") 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
print('$w s$seed', '$(basename $pol .yaml)', ' '.join(f\"{r['agents']}:{r['rollout']['makespan_s']:.0f}/{r['rollout']['run_mean_s']:.0f}/m{r['moves']}\" for r in d['results']))"
    done
  done
done
