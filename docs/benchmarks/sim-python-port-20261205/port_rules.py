"""Which of the Python port's rules costs it what, in the simulator: the dynamo-python arm
with one rule changed at a time, at 3x on four shapes, two seeds, windows like the live ones.

Usage (from the repository root):
    .venv/bin/python docs/benchmarks/sim-python-port-20261205/port_rules.py > port-rules.txt
Prints steps/min over stock's for the arm as shipped and for each variant.
"""

from __future__ import annotations

import argparse

from dynamo_thunderagent.bench.sim.arms import StockArm
from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.python_port import DynamoPythonArm, PortParameters
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation


class NoQueue(DynamoPythonArm):
    """A new program is admitted when a worker has room, whether or not any is paused."""

    def _admission_worker(self, usage, required):  # type: ignore[no-untyped-def]
        fits = [(e.used, w) for w, e in usage.items() if e.capacity - e.used >= required]
        return min(fits)[1] if fits else None


class AdmitBelowPauseLevel(DynamoPythonArm):
    """A new program is admitted only into room below 0.95, not the whole pool."""

    def _admission_worker(self, usage, required):  # type: ignore[no-untyped-def]
        if self.paused:
            return None
        fits = [(e.used, w) for w, e in usage.items()
                if e.capacity * self.params.pause_threshold - e.used >= required]
        return min(fits)[1] if fits else None


class NoMarks(DynamoPythonArm):
    """Programs in a turn are never marked: only programs out on a tool are paused."""

    def _pause_until_safe(self, usage):  # type: ignore[no-untyped-def]
        super()._pause_until_safe(usage)
        for program in self.programs.values():
            program.marked = False


VARIANTS = {
    "as shipped": DynamoPythonArm,
    "no queue behind paused": NoQueue,
    "admit below 0.95": AdmitBelowPauseLevel,
    "no marks": NoMarks,
    "tick 1 s": lambda: DynamoPythonArm(PortParameters(scheduler_interval_seconds=1.0)),
    "resume below 0.95": lambda: DynamoPythonArm(PortParameters(resume_hysteresis=0.0)),
}


def main() -> None:
    print("shape, agents, seed | " + " | ".join(VARIANTS))
    for shape, agents in (("trace", 35), ("long", 36), ("fanout", 22), ("agentic-code", 13)):
        for seed in (1, 2):
            parser = argparse.ArgumentParser()
            add_arguments(parser)
            spec = spec_from_args(parser.parse_args(
                ["--regime", "calibrated", "--workload", shape, "--no-reuse-output",
                 "--warmup-s", "60", "--window-s", "600"]))
            s = spec.scenario
            config = RunConfig(agents=agents, workers=s.workers, engine=s.engine(),
                               warmup_s=s.warmup_s, window_s=s.window_s,
                               client_overhead_s=s.client_overhead_s)
            stock = Simulation(config, StockArm(), s.plans(seed)).run().steps_per_min
            cells = [Simulation(config, make(), s.plans(seed)).run().steps_per_min / stock
                     for make in VARIANTS.values()]
            print(f"{shape}, {agents}, {seed} | " + " | ".join(f"{c:.2f}x" for c in cells),
                  flush=True)


if __name__ == "__main__":
    main()
