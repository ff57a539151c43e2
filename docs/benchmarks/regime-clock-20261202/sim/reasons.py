"""Where ours' re-prefill comes from in the simulator: moves and pauses, by reason.

Runs one ``bench sim`` case for arm ``ours`` (replies not reused, as the live driver does)
and counts the moves of a program to another rank and the pauses, each by the reason the
scheduler gives, with the mean context size: read from ``Decisions.steps`` (the events the
router logs and counts) as the simulator's arm applies each decision.

Usage (from the repository root):
    .venv/bin/python docs/benchmarks/regime-clock-20261202/sim/reasons.py trace 36
    .venv/bin/python docs/benchmarks/regime-clock-20261202/sim/reasons.py long 36 [POLICY]

reasons.txt is the shipped policy's output for both, reasons-resume-below-target.txt that of
resume-below-target.yaml.
"""

from __future__ import annotations

import sys
from collections import Counter

from dynamo_thunderagent.bench.sim import command
from dynamo_thunderagent.bench.sim.arms import ProgramArm
from dynamo_thunderagent.decisions import Decisions, EventKind

counts: Counter[tuple[str, str]] = Counter()
tokens: Counter[tuple[str, str]] = Counter()
_apply = ProgramArm._apply


def _counting_apply(self: ProgramArm, decisions: Decisions) -> None:
    for event in decisions.steps:
        if event.kind in (EventKind.MOVED, EventKind.PAUSED):
            counts[(event.kind.value, event.reason)] += 1
            tokens[(event.kind.value, event.reason)] += event.tokens
    _apply(self, decisions)


def main() -> None:
    workload, agents = sys.argv[1], sys.argv[2]
    policy = sys.argv[3:4]
    ProgramArm._apply = _counting_apply  # type: ignore[method-assign]
    figures = command.run_case(["--workload", workload, "--agents", agents, "--arms", "ours",
                                "--no-reuse-output"]
                               + (["--policy", policy[0]] if policy else []))
    print(f"{workload}, {agents} agents: {figures.steps_per_min:.1f} steps/min, hit rate "
          f"{figures.hit_rate:.3f}, {figures.recomputed_tokens:,} recomputed tokens, "
          f"{figures.forced_resumes} forced releases")
    for (kind, reason), n in sorted(counts.items()):
        print(f"  {kind:<8} {reason:<16} {n:>6}  mean context {tokens[(kind, reason)] // n:,}")


if __name__ == "__main__":
    main()
