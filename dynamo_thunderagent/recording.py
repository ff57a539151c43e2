"""A scheduler that also records why: one :class:`ProgramEvent` per program-changing step.

:class:`~dynamo_thunderagent.decisions.Decisions` name the programs a call paused, resumed or
removed, but not the reason, the rank, the tokens or the wait, and not the moves at all.
Those are known only at the moment the scheduler takes each step, so this subclass wraps the
scheduler's own step methods (``_pause``, ``_resume``, ``_move``, ``_release``, ``_drop``,
``_reject``) and records each step as it happens, leaving the algorithm untouched: every
recorded event is a step the scheduler took, never a recount. The counters in
``Scheduler.counters`` and the recorded events therefore agree by construction (a unit test
pins it over random runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamo_thunderagent.config import ThunderAgentParameters
from dynamo_thunderagent.decisions import Decisions
from dynamo_thunderagent.program import Lifecycle, Program, RequestState, TrackedRequest, WorkerKey
from dynamo_thunderagent.program_log import EventKind, PauseReason, ProgramEvent
from dynamo_thunderagent.scheduler import Scheduler

# Why a request was rejected, as a bounded label (the message itself names the limit and
# the values). Keyed by a phrase of each message in scheduler.py; "other" if none matches.
REJECTION_REASONS = (
    ("is already in flight", "duplicate_request_id"),
    ("input_tokens must be", "invalid_input_tokens"),
    ("already tracks", "max_tracked_requests"),
    ("more than the KV capacity", "prompt_exceeds_capacity"),
    ("already retains", "max_tracked_programs"),
    ("turns in flight or queued", "max_turns_per_session"),
    ("is already ending", "session_ending"),
    ("is ending", "session_ending"),
)


def rejection_reason(message: str) -> str:
    """The bounded label of a rejection message (``other`` if unknown)."""
    for phrase, label in REJECTION_REASONS:
        if phrase in message:
            return label
    return "other"


@dataclass
class Record:
    """What the scheduler did since the last drain, in order."""

    events: list[ProgramEvent] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)  # reason labels


class RecordingScheduler(Scheduler):
    """:class:`Scheduler` with a record of each program-changing step (see module doc)."""

    def __init__(self, params: ThunderAgentParameters) -> None:
        super().__init__(params)
        self.record = Record()
        # What the step in progress is part of (a drop or a move means different things
        # in an expiry sweep, an eviction, a resume or a report of where a turn ran).
        self._drop_reason: EventKind | None = None
        self._move_reason = "placed"

    @property
    def waiting_for_room(self) -> int:
        """Paused programs whose turn waits for room (read-only)."""
        return len(self._deferred)

    def drain(self) -> Record:
        """Everything recorded since the last drain."""
        record, self.record = self.record, Record()
        return record

    def _emit(self, kind: EventKind, program: Program, worker: WorkerKey | None, reason: str,
              wait: float = 0.0) -> None:
        self.record.events.append(
            ProgramEvent(kind, program.session_id, worker, program.tokens, reason, wait))

    # ---- admission -------------------------------------------------------------
    def _start_turn(self, program: Program, request: TrackedRequest, now: float,
                    d: Decisions) -> None:
        super()._start_turn(program, request, now, d)
        if request.state is RequestState.DEFERRED and program.lifecycle is Lifecycle.PAUSED:
            self._emit(EventKind.DEFERRED, program, program.worker, "program_paused")

    def _release(self, program: Program, request: TrackedRequest, worker: WorkerKey | None,
                 now: float, d: Decisions) -> None:
        waited = 0.0 if program.deferred_since is None else now - program.deferred_since
        if worker is None:
            reason = "no_capacity_known"
        elif self._move_reason == "resume":
            reason = "resumed"
        elif program.worker == worker:
            reason = "sticky"
        else:
            reason = "placed"
        super()._release(program, request, worker, now, d)
        self._emit(EventKind.ADMITTED, program, worker, reason, waited)

    def _reject(self, d: Decisions, request_id: str, reason: str) -> Decisions:
        self.record.rejections.append(rejection_reason(reason))
        return super()._reject(d, request_id, reason)

    # ---- pause / resume / move ---------------------------------------------------
    def _pause(self, program: Program, now: float, d: Decisions, *, idle: bool = False) -> None:
        if idle:
            reason = PauseReason.IDLE
        elif program.marked_for_pause:
            reason = PauseReason.TOOL_BOUNDARY
        elif program.current is not None:
            reason = PauseReason.NO_ROOM
        else:
            reason = PauseReason.PRESSURE
        super()._pause(program, now, d, idle=idle)
        self._emit(EventKind.PAUSED, program, program.worker, reason.value)

    def _resume(self, program: Program, worker: WorkerKey | None, now: float,
                d: Decisions) -> None:
        forced = bool(d.forced) and d.forced[-1] == program.session_id
        waited = 0.0 if program.deferred_since is None else now - program.deferred_since
        self._emit(EventKind.FORCED if forced else EventKind.RESUMED, program,
                   worker if worker is not None else program.worker,
                   "resume_timeout" if forced else "room", waited)
        before, self._move_reason = self._move_reason, "resume"
        try:
            super()._resume(program, worker, now, d)
        finally:
            self._move_reason = before

    def _move(self, program: Program, worker: WorkerKey | None) -> None:
        moving = program.worker is not None and worker is not None and worker != program.worker
        super()._move(program, worker)
        if moving:
            self._emit(EventKind.MOVED, program, worker, self._move_reason)

    def sent(self, request_id: str, worker: WorkerKey, now: float) -> Decisions:
        before, self._move_reason = self._move_reason, "served_elsewhere"
        try:
            return super().sent(request_id, worker, now)
        finally:
            self._move_reason = before

    # ---- programs leaving the table ------------------------------------------------
    def _drop(self, program: Program) -> None:
        kind = self._drop_reason
        worker = program.worker
        super()._drop(program)
        if kind is EventKind.EXPIRED:
            self._emit(kind, program, worker, "session_retention")
        elif kind is EventKind.EVICTED:
            self._emit(kind, program, worker, "max_tracked_requests")
        else:
            self._emit(EventKind.ENDED, program, worker,
                       "session_final" if program.final_request is not None else "rolled_back")

    def _sweep(self, now: float, d: Decisions) -> None:
        self._drop_reason = EventKind.EXPIRED  # the sweep drops only expired programs
        try:
            super()._sweep(now, d)
        finally:
            self._drop_reason = None

    def _evict_oldest_idle(self, d: Decisions) -> bool:
        self._drop_reason = EventKind.EVICTED
        try:
            return super()._evict_oldest_idle(d)
        finally:
            self._drop_reason = None
