"""What the scheduler decides: the plain records the shells apply and log.

"Release" means one thing: a request is admitted (routed to a worker/rank, or any
eligible one). A program leaving the table is "removed" (its session ended, it was
evicted for room, or it was rolled back) or "expired" (idle past retention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynamo_thunderagent.program import WorkerKey


@dataclass(frozen=True)
class Release:
    """Admit ``request_id``; route it to ``worker`` (None: any eligible worker).

    ``session_final`` releases carry no turn: the shell answers them without
    touching a worker.
    """

    request_id: str
    worker: WorkerKey | None
    session_final: bool = False


@dataclass(frozen=True)
class Reject:
    request_id: str
    reason: str


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
