"""Where an arm's recomputed tokens come from in the simulator.

Runs one ``bench sim`` case (replies not reused, as the live driver does) and splits the
steady window's recomputed tokens (``bench sim``'s definition: the whole blocks the
program's previous turn left reusable, minus what this turn found cached) by what happened
to each later turn before it reached a worker:

* whether it waited for room: more than 0.5 s from sent to dispatched (its program was
  paused, or its turn was held back);
* whether it went to the worker its program's previous turn ran on ("same rank") or to
  another ("moved").

For each group: the turns, the share of their reusable cache they found ("reusable kept")
and their part of the recomputed tokens.

Usage (from the repository root; extra arguments go to ``bench sim``):
    .venv/bin/python docs/benchmarks/where-recompute-20261203/attrib.py trace 36 ours
    .venv/bin/python docs/benchmarks/where-recompute-20261203/attrib.py long 36 upstream
    .venv/bin/python docs/benchmarks/where-recompute-20261203/attrib.py long 36 ours \\
        --policy dynamo_thunderagent/policies/ablations/with_acting_hold.yaml

attrib.txt holds the output for trace and long at 36 agents and fan-out at 22 (3x), for
ours, upstream and stock.
"""

from __future__ import annotations

import sys
from collections import Counter

from dynamo_thunderagent.bench.sim import command
from dynamo_thunderagent.bench.sim import simulation as sim

WAITED_S = 0.5

groups: dict[tuple[str, int], str] = {}  # (session, turn) -> group
turns: Counter[str] = Counter()
reusable: Counter[str] = Counter()
recomputed: Counter[str] = Counter()
_dispatch = sim.Simulation.dispatch
_result = sim.Simulation._result


def _grouping_dispatch(self: sim.Simulation, request_id: str, worker: int) -> None:
    if request_id in self._requests:  # an agent's turn (not other tenants' traffic)
        agent, request = self._requests[request_id]
        waited = self.loop.now - request.sent_at > WAITED_S
        moved = agent.worker is not None and agent.worker != worker
        groups[(request.session_id, request.turn)] = (
            ("waited, " if waited else "no wait, ") + ("moved" if moved else "same rank"))
    _dispatch(self, request_id, worker)


def _counting_result(self: sim.Simulation, drained: bool) -> sim.SimFigures:
    start, end = self._window_start, self._window_end
    for record in self.records:
        if record.kind != "turn" or not start <= record.end < end or not record.reusable_tokens:
            continue
        group = groups.get((record.session_id, record.turn), "not dispatched")
        turns[group] += 1
        reusable[group] += record.reusable_tokens
        recomputed[group] += max(0, record.reusable_tokens - (record.cached_tokens or 0))
    return _result(self, drained)


def main() -> None:
    workload, agents, arm, *rest = sys.argv[1:]
    sim.Simulation.dispatch = _grouping_dispatch  # type: ignore[method-assign]
    sim.Simulation._result = _counting_result  # type: ignore[method-assign]
    figures = command.run_case(["--workload", workload, "--agents", agents, "--arms", arm,
                                "--no-reuse-output", *rest])
    total = sum(recomputed.values()) or 1
    print(f"{workload}, {agents} agents, {arm} {' '.join(rest)}".rstrip()
          + f": {figures.steps_per_min:.1f} steps/min, hit rate {figures.hit_rate:.3f}, "
          f"{figures.recomputed_tokens:,} recomputed tokens")
    for group in sorted(turns):
        kept = 1 - recomputed[group] / reusable[group]
        print(f"  {group:<20} turns {turns[group]:>5}  reusable kept {kept:.2f}  "
              f"recomputed {recomputed[group]:>11,} ({recomputed[group] / total:.0%})")


if __name__ == "__main__":
    main()
