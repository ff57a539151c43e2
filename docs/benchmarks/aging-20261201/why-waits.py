"""Why aged turns keep waiting: runs one simulator case of arm ours and, at every resume
pass, classifies each turn past ``max_wait_seconds`` that the pass left waiting: held at home
(``price_moves``), no rank with room for it, or a rank with room that it did not get.

Usage: .venv/bin/python docs/benchmarks/aging-20261201/why-waits.py REGIME WORKLOAD N [flags]
(e.g. ``calibrated trace 48``; flags as for ``bench sim``, e.g. ``--policy FILE``).
"""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Any

from dynamo_thunderagent import resume
from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.run import run_one

counts: collections.Counter[str] = collections.Counter()
original = resume.ResumePlanner.plan


def plan(self: resume.ResumePlanner, paused: Any, table: Any, capacity: Any, now: float,
         batch: float, evicting: Any = frozenset()) -> resume.ResumePlan:
    result = original(self, paused, table, capacity, now, batch, evicting)
    resumed = {r.program.session_id for r in result.resumptions}
    held = {p.session_id for p in result.held_home}
    room = {w: cap * self.level - table.decayed_usage(w, now)
            for w, cap in capacity.known.items()}
    for program in paused:
        if not self.aged(program, now) or program.session_id in resumed or not room:
            continue
        need = self.need(program, capacity)
        if program.session_id in held:
            counts["held at home"] += 1
        elif max(room.values()) < need:
            counts["no rank with room"] += 1
        else:
            counts["a rank with room, not taken"] += 1
    return result


def main() -> None:
    regime, workload, agents = sys.argv[1], sys.argv[2], int(sys.argv[3])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(
        ["--regime", regime, "--workload", workload, "--agents", str(agents), "--arms", "ours",
         *sys.argv[4:]]))
    resume.ResumePlanner.plan = plan  # type: ignore[method-assign]
    figures = run_one(spec.scenario, "ours", agents, spec.seed, spec.policy, 1.0)
    print(f"steps/min {figures.steps_per_min:.0f}, longest wait {figures.wait_max_s:.0f} s")
    for reason, count in counts.most_common():
        print(f"{count:>8}  {reason}")


if __name__ == "__main__":
    main()
