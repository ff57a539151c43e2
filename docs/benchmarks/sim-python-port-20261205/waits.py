"""The turns the simulator's dynamo-python arm held longest in one run, and why.

Usage (from the repository root): .venv/bin/python docs/benchmarks/sim-python-port-20261205/waits.py
REGIME WORKLOAD AGENTS SEED [bench sim flags...]. Prints each turn that waited over 100 s with
its program's tokens and turn number when it began to wait (turn 1: a new program) and how
many programs were paused then, and the turns still waiting when the run ended.
"""

from __future__ import annotations

import argparse
import sys

from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.python_port import DynamoPythonArm
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation


class WatchedArm(DynamoPythonArm):
    """The arm, noting when each held turn begins to wait and when it is let go."""

    def __init__(self) -> None:
        super().__init__()
        self.began: dict[str, tuple[float, int, int, int]] = {}
        self.waited: list[tuple[float, str, int, int, int]] = []

    def _wait(self, program, request_id):  # type: ignore[no-untyped-def]
        self.began[request_id] = (self.host.now(), program.tokens, program.steps,
                                  len(self.paused))
        super()._wait(program, request_id)

    def _send(self, program, request_id, worker):  # type: ignore[no-untyped-def]
        if request_id in self.began:
            since, tokens, steps, paused = self.began.pop(request_id)
            self.waited.append((self.host.now() - since, request_id, tokens, steps, paused))
        super()._send(program, request_id, worker)


def main(argv: list[str]) -> None:
    regime, workload, agents, seed, *flags = argv
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(
        ["--regime", regime, "--workload", workload, "--seed", seed, *flags]))
    s = spec.scenario
    config = RunConfig(agents=int(agents), workers=s.workers, engine=s.engine(),
                       warmup_s=s.warmup_s, window_s=s.window_s,
                       client_overhead_s=s.client_overhead_s)
    arm = WatchedArm()
    figures = Simulation(config, arm, s.plans(int(seed))).run()
    pool = s.blocks * s.block_size
    print(f"{regime} {workload} {agents} agents seed {seed}: {figures.steps_per_min:.1f} "
          f"steps/min; a worker holds {pool:,} tokens, {int(pool * 0.85):,} below 0.85")
    for waited, request_id, tokens, steps, paused in sorted(arm.waited, reverse=True):
        if waited > 100:
            print(f"  waited {waited:5.0f} s  {request_id}  {tokens:,} tokens, turn {steps}, "
                  f"{paused} paused when it came")
    for request_id, (since, tokens, steps, _) in arm.began.items():
        print(f"  still waiting since {since:.0f} s  {request_id}  {tokens:,} tokens, turn {steps}")


if __name__ == "__main__":
    main(sys.argv[1:])
