"""What the scheduler decides: the plain records the shells apply and log.

"Release" means one thing: a request is admitted (routed to a worker/rank, or any
eligible one). A program leaving the table is "removed" (its session ended, it was
evicted for room, or it was rolled back) or "expired" (idle past retention).

Each decision also says *why*, in bounded labels that logs and metrics can use as they are:
a :class:`Reject` names the limit it hit, and :attr:`Decisions.steps` holds one
:class:`ProgramEvent` per program-changing step (its kind, rank, tokens, reason and wait),
written by the scheduler at the moment it takes the step, when the reason is known. The
shell therefore never recounts or guesses a reason: what it counts is what was decided.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from dynamo_thunderagent.program import WorkerKey

RejectLimit = Literal[
    "duplicate_request_id",
    "invalid_input_tokens",
    "max_tracked_requests",
    "prompt_exceeds_capacity",
    "max_tracked_programs",
    "max_turns_per_session",
    "session_ending",
]
REJECT_LIMITS: tuple[RejectLimit, ...] = get_args(RejectLimit)


class EventKind(enum.Enum):
    """Every scheduling decision that changes a program."""

    ADMITTED = "admitted"  # a turn was released to a worker/rank (or any, cold start)
    DEFERRED = "deferred"  # a turn waits: its program is paused
    PAUSED = "paused"
    RESUMED = "resumed"
    MOVED = "moved"  # the program's worker/rank changed
    FORCED = "forced"  # resumed because its turn waited past resume_timeout_seconds
    EXPIRED = "expired"  # idle past session_retention_seconds
    EVICTED = "evicted"  # removed to make room in the table (max_tracked_requests)
    ENDED = "ended"  # session-final, or rolled back (a new program whose turn never ran)


class PauseReason(enum.Enum):
    PRESSURE = "pressure"  # its rank was over pause_threshold; it was ACTING
    TOOL_BOUNDARY = "tool_boundary"  # marked while REASONING; paused when its turn ended
    NO_ROOM = "no_room"  # its new turn fits no rank, or programs already wait for room
    IDLE = "idle"  # dormant (past its idle horizon): gives way first
    AGING = "aging"  # gives way to a turn that waited max_wait_seconds (aging_makes_room)


@dataclass(frozen=True)
class ProgramEvent:
    """One program-changing decision. ``wait``: seconds the program's turn had waited for
    room when it was admitted, resumed or forced (0 otherwise)."""

    kind: EventKind
    program: str
    worker: WorkerKey | None
    tokens: int
    reason: str
    wait: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The log line's fields: the same keys for every kind."""
        return {
            "program": self.program,
            "worker_id": None if self.worker is None else self.worker.worker_id,
            "dp_rank": None if self.worker is None else self.worker.dp_rank,
            "tokens": self.tokens,
            "reason": self.reason,
            "wait_s": round(self.wait, 3),
        }


@dataclass(frozen=True)
class Release:
    """Admit ``request_id``; route it to ``worker`` (None: any eligible worker).

    ``session_final`` releases carry no turn: the shell answers them without
    touching a worker. ``tracked`` is False for a turn run alongside its session's
    running turn (``concurrent_turns: alongside``), on that turn's worker/rank: the
    scheduler keeps nothing of it, so the shell reports none of its events.
    """

    request_id: str
    worker: WorkerKey | None
    session_final: bool = False
    tracked: bool = True


@dataclass(frozen=True)
class Reject:
    """Refuse ``request_id``. ``reason`` is for the user (the limit, the values, what to
    do); ``limit`` names the limit as a bounded label (for metrics)."""

    request_id: str
    reason: str
    limit: RejectLimit


@dataclass
class Decisions:
    """What one call decided, in order; the shell applies and logs them."""

    released: list[Release] = field(default_factory=list)
    rejected: list[Reject] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)
    resumed: list[tuple[str, WorkerKey | None]] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    unassigned: list[str] = field(default_factory=list)
    # Why: one event per program-changing step, in the order taken. A step can come with
    # no other decision (a move reported by ``sent``, a turn deferred behind its paused
    # program), so ``changed`` does not read it: it says whether there is anything to apply.
    steps: list[ProgramEvent] = field(default_factory=list)

    def outcome(self, request_id: str) -> Release | Reject | None:
        """This request's release or rejection, or None if it was deferred."""
        for release in self.released:
            if release.request_id == request_id:
                return release
        for reject in self.rejected:
            if reject.request_id == request_id:
                return reject
        return None

    @property
    def changed(self) -> bool:
        return any(
            (self.released, self.rejected, self.created, self.removed, self.expired,
             self.paused, self.marked, self.resumed, self.forced, self.unassigned)
        )
