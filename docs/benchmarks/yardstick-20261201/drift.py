"""Does the decode yardstick drift with uptime? One simulator run of ours (the extended
policy, or ``--policy``) with ``bench sim``'s scenario flags; every 2,000 completed turns it
prints the yardstick (the least smoothed decode time seen so far), the smoothed value, the
mean raw decode time of those 2,000 turns and the pauses so far.

It runs ours only, at the last ``--agents`` value, without a host tier (so not for
``--regime tiered``); ``--arms``, ``--jobs``, ``--json``, ``--out`` and ``--ttl-s`` are
accepted and ignored. The ratios to stock come from ``bench sim`` itself (the ``sim-*``
folders next to this script).

Usage: .venv/bin/python docs/benchmarks/yardstick-20261201/drift.py \
           --regime cheap-recompute --agents 30 --window-s 14400
"""

from __future__ import annotations

import argparse
import sys

from dynamo_thunderagent.bench.sim.arms import ProgramArm, build_arm
from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation
from dynamo_thunderagent.costs import TurnTiming

EVERY = 2000


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(argv))
    scenario, agents = spec.scenario, spec.agents[-1]
    if scenario.host_blocks:
        sys.exit("drift.py: this script runs without a host tier; choose another --regime")
    config = RunConfig(agents=agents, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s,
                       client_overhead_s=scenario.client_overhead_s)
    sim: Simulation | None = None
    arm = build_arm("ours", policy=spec.policy, ttl_s=1.0,
                    clock=lambda: sim.now() if sim is not None else 0.0)
    assert isinstance(arm, ProgramArm)
    scheduler = arm.scheduler
    meter = scheduler.costs.meter  # type: ignore[attr-defined]
    observe = scheduler.observe_turn
    recent: list[float] = []
    turns = 0

    def watched(timing: TurnTiming) -> None:
        nonlocal turns
        observe(timing)
        if timing.decode_seconds is not None and (timing.output_tokens or 2) > 1:
            recent.append(timing.decode_seconds)
        turns += 1
        if turns % EVERY == 0 and sim is not None and recent:
            print(f"t={sim.now():7.0f}s turns={turns:6d} yardstick={meter.decode_seconds:.3f}"
                  f" smoothed={meter._decode_ewma:.3f} mean={sum(recent) / len(recent):.3f}"
                  f" pauses={scheduler.counters['pauses']}", flush=True)
            recent.clear()

    scheduler.observe_turn = watched  # type: ignore[method-assign]
    sim = Simulation(config, arm, scenario.plans(spec.seed))
    figures = sim.run()
    print(f"steps/min {figures.steps_per_min:.1f} hit rate {figures.hit_rate:.3f}"
          f" pauses {figures.pauses}")


if __name__ == "__main__":
    main(sys.argv[1:])
