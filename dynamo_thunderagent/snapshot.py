"""The scheduler's state as plain data: the router's state endpoint and the tests read it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from dynamo_thunderagent.cache_loss import CacheLossMeter
from dynamo_thunderagent.capacity import Capacity, UsageModel
from dynamo_thunderagent.costs import CostModel
from dynamo_thunderagent.idle import IdlePrograms
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import Program, WorkerKey
from dynamo_thunderagent.program_table import ProgramTable


class SchedulerView(Protocol):
    """What :func:`scheduler_snapshot` reads of a scheduler (``scheduler.Scheduler``), named
    here so that this module need not import the one that calls it."""

    params: ThunderAgentParameters
    table: ProgramTable
    capacity: Capacity
    idle: IdlePrograms
    counters: dict[str, int]
    costs: CostModel
    usage_model: UsageModel
    cache_loss: CacheLossMeter
    resume_loss: CacheLossMeter
    yield_horizon: float | None

    @property
    def sessionless_tokens(self) -> Mapping[WorkerKey, int]: ...

    @property
    def waiting_turns(self) -> Iterable[Program]: ...

    def keeps_paused(self, worker: WorkerKey) -> bool: ...

    def evicting_anyway(self) -> frozenset[WorkerKey]: ...

    def let_in_usage(self) -> dict[WorkerKey, float]: ...

    def relief(self, worker: WorkerKey, now: float) -> str: ...


def snapshot(table: ProgramTable, capacity: Capacity, idle: IdlePrograms,
             counters: Mapping[str, int], costs: CostModel, waiting_for_room: int,
             now: float, relief: Callable[[WorkerKey], str] | None = None) -> dict[str, object]:
    """Plain-data view of a scheduler's parts at ``now``; with ``relief``, each rank with a
    capacity card says whether the pause rule pauses there now, and if not why
    (``pressure.RELIEF``)."""
    paused_at: dict[WorkerKey, int] = {}  # paused programs by the rank they last ran on
    for program in table.paused():
        if program.worker is not None:
            paused_at[program.worker] = paused_at.get(program.worker, 0) + 1
    ranks: dict[str, dict[str, object]] = {}
    for worker in sorted(set(capacity.known) | set(table.assigned_workers())):
        ranks[str(worker)] = {
            "capacity_tokens": capacity.known.get(worker),
            "usage_tokens": table.usage(worker),
            "decayed_usage_tokens": table.decayed_usage(worker, now),
            "programs": len(table.members(worker)),
            "paused_programs": paused_at.get(worker, 0),
        }
        if relief is not None and worker in capacity.known:
            ranks[str(worker)]["pausing"] = relief(worker)
    programs = {
        p.session_id: {
            "phase": p.phase.value, "lifecycle": p.lifecycle.value,
            "worker": None if p.worker is None else str(p.worker), "tokens": p.tokens,
            "steps": p.steps, "marked_for_pause": p.marked_for_pause,
            "in_flight": p.current, "waiting": len(p.waiting),
            "pauses": p.pauses, "resumes": p.resumes, "moves": p.moves,
            "yielded": p.yielded,
            # Its smoothed gap between turns (null: not back after a turn yet): twice it past
            # acting_yield_seconds, it yields at its tool boundary.
            "gap_seconds": p.gap_ewma or None,
        }
        for p in table.programs.values()
    }
    return {
        "programs": programs,
        "tracked_requests": len(table.requests),
        "paused": len(table.paused()),
        "waiting_for_room": waiting_for_room,
        "dormant": len(idle.dormant),
        "return_evidence": idle.evidence.as_dict(),
        "ranks": ranks,
        "live_workers": sorted(capacity.live_worker_ids),
        "counters": dict(counters),
        "costs": costs.describe(),
    }


def scheduler_snapshot(scheduler: SchedulerView, now: float) -> dict[str, object]:
    """Plain-data view of ``scheduler`` at ``now``: its parts (:func:`snapshot`), its
    parameters, what it measured of the engines and the turns waiting for room."""
    s = scheduler
    waiting = list(s.waiting_turns)
    state = snapshot(s.table, s.capacity, s.idle, s.counters, s.costs, len(waiting), now,
                     relief=lambda worker: s.relief(worker, now))
    state["parameters"] = s.params.model_dump()
    state["cache_loss"] = s.cache_loss.snapshot()
    state["resume_loss"] = s.resume_loss.snapshot("resume_loss_ratio")
    state["keeping_paused"] = sorted(str(w) for w in s.capacity.known if s.keeps_paused(w))
    # Ranks where turns held back run without room, and what those let in hold there.
    state["evicting_anyway"] = sorted(str(w) for w in s.evicting_anyway())
    state["let_in_tokens"] = {str(w): t for w, t in sorted(s.let_in_usage().items())}
    state["acting_hold_seconds"] = s.usage_model.hold_seconds
    # Prompt tokens of requests without a session id running now, per rank, and how many
    # tokens come off its capacity for them (sessionless_kv, *_full_loss).
    held = s.sessionless_tokens
    state["sessionless_tokens"] = {str(w): t for w, t in held.items()}
    state["sessionless_reserved_tokens"] = {str(w): s.capacity.taken_off(w) for w in held}
    state["acting_yield_seconds"] = s.yield_horizon
    # The turns waiting for room, longest wait first (what `top` shows as the queue).
    state["deferred"] = [
        {"session_id": p.session_id, "tokens": p.tokens, "phase": p.phase.value,
         "worker": None if p.worker is None else str(p.worker),
         "waited_seconds": max(0.0, now - p.deferred_since)}
        for p in sorted(waiting, key=lambda p: (p.deferred_since or now, p.seq))
        if p.deferred_since is not None
    ]
    return state
