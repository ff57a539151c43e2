"""What paused programs find of their prompt when they come back home, in the simulator.

For each case, one ``bench sim`` run of arm ``ours`` with the extended policy without
``pause_min_resume_loss`` (so that the measurement does not change what it measures) and,
in the tiered regime, not told of the tier: the turns of programs that were paused and came
back to the rank they were paused on, and the share of the prompt they had left there that
the engine still had (what ``Scheduler.resume_loss`` follows, summed over the whole run
instead of decayed). Prints one markdown row per case.

Usage (from the repository root):
    .venv/bin/python docs/benchmarks/resume-loss-20261203/survival.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dynamo_thunderagent.bench.sim import command, run
from dynamo_thunderagent.cache_loss import CacheLossMeter
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.scheduler import Scheduler

POLICY = Path("policies/ablations/minus_pause_min_resume_loss.yaml")
CASES = [
    ("calibrated", "trace", 24), ("calibrated", "trace", 36),
    ("calibrated", "long", 24), ("calibrated", "long", 36),
    ("calibrated", "fanout", 14), ("calibrated", "fanout", 22),
    ("calibrated", "agentic-code", 14),
    ("cheap-recompute", "synthetic", 30), ("cheap-recompute", "fanout", 14),
    ("tiered", "trace", 36), ("tiered", "long", 36), ("tiered", "fanout", 22),
    ("tiered", "agentic-code", 14),
]


class Totals(CacheLossMeter):
    """A resume-loss meter that also keeps plain totals over the run."""

    expected_total = 0
    found_total = 0
    samples = 0

    def observe(self, worker: WorkerKey, expected_tokens: int, cached_tokens: int) -> None:
        super().observe(worker, expected_tokens, cached_tokens)
        if expected_tokens > 0:
            Totals.samples += 1
            Totals.expected_total += expected_tokens
            Totals.found_total += min(expected_tokens, max(0, cached_tokens))


def main() -> None:
    init = Scheduler.__init__

    def counting_init(self: Scheduler, params: object) -> None:
        init(self, params)  # type: ignore[arg-type]
        self.resume_loss = Totals()  # the policy has no pause_min_resume_loss: only measured

    Scheduler.__init__ = counting_init  # type: ignore[method-assign]
    print("| regime | shape | N | paused programs back home | share of their prompt found |")
    print("|---|---|---|---|---|")
    for regime, workload, agents in CASES:
        Totals.samples = Totals.expected_total = Totals.found_total = 0
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        policy = POLICY
        if regime == "tiered":  # not told of the tier: what minus_host_tier does
            policy = Path("/tmp") / "survival-blind.yaml"
            text = POLICY.read_text(encoding="utf-8")
            policy.write_text(text.replace("    hold_max_cache_loss: 0.5\n",
                                           "    hold_max_cache_loss: 0.5\n"
                                           "    host_kv_blocks: 0\n"), encoding="utf-8")
        args = parser.parse_args(["--regime", regime, "--workload", workload, "--agents",
                                  str(agents), "--arms", "ours", "--policy", str(policy)])
        spec = command.spec_from_args(args)
        run.run_one(spec.scenario, "ours", agents, spec.seed, spec.policy, spec.ttl_s)
        share = Totals.found_total / Totals.expected_total if Totals.expected_total else 0.0
        print(f"| {regime} | {workload} | {agents} | {Totals.samples} | {share:.2f} |")


if __name__ == "__main__":
    main()
