"""What the order of resumes can buy: resume first the paused programs whose cache the
engine still holds, read off the simulated engine.

The scheduler does not read the engine's cache (the router could ask Dynamo's KV router
for each waiting turn's overlap, at a query a turn); the simulator knows it exactly. This
script replaces the resume planner's order (``ResumePlanner.order``) inside each of its
classes (a waiting turn, a program that never ran, a paused tool-caller; aged turns stay
oldest first) by what an oracle reads off the simulated engine: the share of the program's
tokens still resident on its last worker (its own blocks; the shared system prompt's are
left out). If even these orders buy little, an estimate of them (the most recently active
first, section "Where the lost hit rate goes") is unlikely to buy more.

Modes:
* ``base``: the shipped order (smallest first);
* ``cached_first``: the largest resident share first;
* ``lost_tokens``: the fewest tokens to re-prefill first (tokens times the share lost).

Usage (from the repository root; extra arguments go to ``bench sim``; about 1.5 s a case):
    .venv/bin/python docs/benchmarks/where-recompute-20261203/oracle_order.py \\
        cached_first long 36 ours --seed 1

oracle-order.txt holds the output of every mode on the trace, long sessions (24 and 36
agents), fan-out (22), aiperf's agentic-code shape (9 and 14) and the cheap-recompute toy
agents (30), seeds 1 and 2 (oracle-order.sh).
"""

from __future__ import annotations

import sys
from typing import Any

from dynamo_thunderagent import resume
from dynamo_thunderagent.bench.sim import command
from dynamo_thunderagent.bench.sim import simulation as sim
from dynamo_thunderagent.program import Program

MODES = ("base", "cached_first", "lost_tokens")
_simulations: list[sim.Simulation] = []
_init = sim.Simulation.__init__
_order = resume.ResumePlanner.order
_mode = "base"


def _remembering_init(self: sim.Simulation, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    _simulations.append(self)


def _resident_share(program: Program) -> float:
    """The share of ``program``'s tokens resident on its last worker in the simulator."""
    if not _simulations or program.worker is None or program.tokens <= 0:
        return 0.0
    worker = _simulations[-1].cluster[program.worker.worker_id]
    resident = worker.kv.resident(program.session_id) * worker.config.block_size
    return min(1.0, resident / program.tokens)


def _oracle_order(self: resume.ResumePlanner, program: Program,
                  now: float) -> tuple[float, ...]:
    klass, tokens, seq = _order(self, program, now)
    if klass < 0:  # aged: the oldest waiter first, as shipped
        return (klass, tokens, seq)
    share = _resident_share(program)
    if _mode == "cached_first":
        return (klass, -share, tokens, seq)
    return (klass, program.tokens * (1 - share), tokens, seq)  # lost_tokens


def main() -> None:
    global _mode
    if len(sys.argv) < 5:
        raise SystemExit(f"usage: {sys.argv[0]} MODE WORKLOAD AGENTS ARM [bench sim options]")
    _mode, workload, agents, arm, *rest = sys.argv[1:]
    if _mode not in MODES:
        raise SystemExit(f"mode must be one of {', '.join(MODES)}, not {_mode!r}")
    sim.Simulation.__init__ = _remembering_init  # type: ignore[method-assign]
    if _mode != "base":
        resume.ResumePlanner.order = _oracle_order  # type: ignore[method-assign,assignment]
    figures = command.run_case(["--workload", workload, "--agents", agents, "--arms", arm,
                                "--no-reuse-output", *rest])
    print(f"{_mode:<13} {workload} {agents} {' '.join(rest)}: "
          f"{figures.steps_per_min:.1f} steps/min, hit rate {figures.hit_rate:.3f}, "
          f"{figures.recomputed_tokens:,} recomputed tokens", flush=True)


if __name__ == "__main__":
    main()
