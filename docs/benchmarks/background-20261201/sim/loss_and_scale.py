"""What docs/benchmarks.md says of sessionless_kv_full_loss beyond sim/run.sh: the mean cache
loss ours' ranks measured (the meter `/state` shows as `cache_loss`, sampled at every tick of
the window) with the traffic ignored and with all of its room reserved, and steps/min with
sessionless_kv_full_loss at 0.05, 0.1 and 0.2. Calibrated regime, 3x, beside --background
8:8000:640, seeds 0-2 (the loss: seed 0). Deterministic; about 2 minutes on 2 cores.

Usage: .venv/bin/python docs/benchmarks/background-20261201/sim/loss_and_scale.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from dynamo_thunderagent.bench.shapes import SHAPES, shape_token_factor
from dynamo_thunderagent.bench.sim import arms
from dynamo_thunderagent.bench.sim.run import regime_scenario, run_one
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE
from dynamo_thunderagent.bench.workload import Background
from dynamo_thunderagent.policy_files import EXTENDED_POLICY, POLICY_DIR

ABLATIONS = POLICY_DIR / "ablations"
AGENTS = {"trace": 36, "long": 36, "fanout": 22}


def scenario(shape: str):  # type: ignore[no-untyped-def]
    base = regime_scenario("calibrated")
    if shape == "trace":
        base = replace(base, trace=str(DEFAULT_TRACE))
    else:
        pool = base.blocks * base.block_size
        base = replace(base, trace=None,
                       workload=replace(SHAPES[shape], token_scale=shape_token_factor(pool)))
    return replace(base, background=Background(8, 8000, 640))


def mean_loss(shape: str, policy: Path) -> tuple[float, float]:
    """steps/min and the mean over the window's ticks of ours' ranks' mean loss ratio."""
    samples: list[float] = []
    build = arms.build_ours

    def spying(settings: arms.ArmSettings) -> arms.Arm:
        arm = build(settings.policy, settings.clock, host_blocks=settings.host_blocks)
        scheduler = arm.scheduler
        tick = scheduler.tick
        s = scenario(shape)

        def sampled(now: float):  # type: ignore[no-untyped-def]
            if s.warmup_s <= now < s.warmup_s + s.window_s:
                ratios = [r for w in scheduler.capacity.known
                          if (r := scheduler.cache_loss.loss_ratio(w)) is not None]
                if ratios:
                    samples.append(sum(ratios) / len(ratios))
            return tick(now)

        scheduler.tick = sampled  # type: ignore[method-assign]
        return arm

    arms.ARM_BUILDERS["ours"] = spying
    try:
        figures = run_one(scenario(shape), "ours", AGENTS[shape], 0, str(policy), 1.0)
    finally:
        arms.ARM_BUILDERS["ours"] = lambda s: build(s.policy, s.clock,
                                                    host_blocks=s.host_blocks)
    return figures.steps_per_min, statistics.mean(samples)


def main() -> int:
    print("mean cache loss of ours' ranks over the window (seed 0): steps/min, loss")
    for shape in AGENTS:
        for label, policy in (("ignore", ABLATIONS / "minus_sessionless_kv.yaml"),
                              ("all reserved", ABLATIONS / "minus_sessionless_kv_full_loss.yaml")):
            steps, loss = mean_loss(shape, policy)
            print(f"  {shape:7} {label:13} {steps:6.1f}  {loss:.3f}")
    print("steps/min with sessionless_kv_full_loss (seeds 0, 1, 2: mean)")
    extended = yaml.safe_load(EXTENDED_POLICY.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        for value in (0.05, 0.1, 0.2):
            extended["request_classifier"]["parameters"]["sessionless_kv_full_loss"] = value
            policy = Path(folder) / f"full-loss-{value}.yaml"
            policy.write_text(yaml.safe_dump(extended), encoding="utf-8")
            for shape in AGENTS:
                runs = [run_one(scenario(shape), "ours", AGENTS[shape], seed, str(policy),
                                1.0).steps_per_min for seed in (0, 1, 2)]
                print(f"  {value:<4} {shape:7} {', '.join(f'{r:.0f}' for r in runs)}: "
                      f"{statistics.mean(runs):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
