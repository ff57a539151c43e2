"""Program lifecycle notifications and the recent decisions, from the scheduler's Decisions.

The classifier hands every :class:`~dynamo_thunderagent.decisions.Decisions` it applies
to its listeners; :class:`LifecycleNotifier` is one. It turns the program lifecycle
moments a tool runtime cares about (paused, resuming and where, ended, expired) into
:class:`~dynamo_thunderagent.events.LifecycleEvent` messages, publishes them on a
loopback ZeroMQ PUB socket (:class:`EventPublisher`, ``serve --events-port``) and keeps
the last few decisions (marks for pause too) for the router's /state, which
``dynamo-thunderagent top`` shows.

Publishing happens while the decisions are applied, before a resumed program's waiting
turn is forwarded, so ``resuming`` really comes first. A PUB socket never blocks the
router: a subscriber that is too slow loses messages (and sees a gap in ``seq``).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import structlog

from dynamo_thunderagent.decisions import Decisions, EventKind
from dynamo_thunderagent.events import EVENT_KINDS, LifecycleEvent, topic
from dynamo_thunderagent.program import WorkerKey

log = structlog.get_logger("dynamo_thunderagent.notify")

# How many recent decisions /state keeps (what `top` shows).
RECENT_DECISIONS = 50
# Messages a PUB socket queues per subscriber before it drops (a slow harness).
SEND_HIGH_WATER_MARK = 100_000

WorkerOf = Callable[[str], WorkerKey | None]


def lifecycle_events(decisions: Decisions, worker_of: WorkerOf,
                     at: float) -> list[LifecycleEvent]:
    """The lifecycle events in ``decisions`` (``seq`` left 0), in a stable order:
    paused, ended, expired, then resuming (what one call frees comes before what it
    resumes into that room, so a harness reclaims before it prepares). ``worker_of``
    names a program's worker/rank."""
    events: list[LifecycleEvent] = []

    def add(kind: Any, session_id: str, worker: WorkerKey | None, reason: str) -> None:
        events.append(LifecycleEvent(
            kind, session_id, None if worker is None else worker.worker_id,
            None if worker is None else worker.dp_rank, at, reason))

    # Why each was paused or left, as the scheduler's steps say it (metrics' reason labels,
    # in words): "no room", "pressure", "tool boundary", "session final", "rolled back", ...
    why = {(step.kind, step.program): step.reason.replace("_", " ")
           for step in decisions.steps}
    for session_id in decisions.paused:
        add("paused", session_id, worker_of(session_id),
            why.get((EventKind.PAUSED, session_id), "no room"))
    for session_id in decisions.removed:
        add("ended", session_id, None, why.get((EventKind.ENDED, session_id))
            or why.get((EventKind.EVICTED, session_id), "removed"))
    for session_id in decisions.expired:
        add("expired", session_id, None, "idle past session_retention_seconds")
    forced = set(decisions.forced)
    for session_id, worker in decisions.resumed:
        add("resuming", session_id, worker, "forced" if session_id in forced else "room")
    return events


class EventPublisher:
    """A ZeroMQ PUB socket bound on ``host:port`` (loopback); never blocks."""

    def __init__(self, host: str, port: int) -> None:
        import zmq

        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, SEND_HIGH_WATER_MARK)
        self.url = f"tcp://{host}:{port}"
        try:
            self._socket.bind(self.url)
        except zmq.ZMQError as error:  # a port taken: an OSError, as for any socket
            self.close()
            raise OSError(f"cannot bind {self.url}: {error}") from None
        self.dropped = 0

    def publish(self, event: LifecycleEvent) -> bool:
        """Send ``event``; False where it was dropped (the send queue is full)."""
        try:
            self._socket.send_multipart([topic(event.event), event.to_json()],
                                        flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            self.dropped += 1
            return False
        return True

    def close(self) -> None:
        self._socket.close()
        self._context.term()


class LifecycleNotifier:
    """A decisions listener: publishes lifecycle events and keeps the recent decisions."""

    def __init__(self, worker_of: WorkerOf, publisher: EventPublisher | None = None, *,
                 recent: int = RECENT_DECISIONS,
                 clock: Callable[[], float] = time.time) -> None:
        self.worker_of = worker_of
        self.publisher = publisher
        self.clock = clock
        self.seq = 0
        self.published: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=recent)

    def __call__(self, decisions: Decisions) -> None:
        at = self.clock()
        for session_id in decisions.marked:
            self.recent.append({"at": at, "decision": "marked", "session_id": session_id,
                                "worker": _worker(self.worker_of(session_id)),
                                "reason": "pauses at its next tool boundary"})
        for event in lifecycle_events(decisions, self.worker_of, at):
            self.seq += 1
            event = LifecycleEvent(event.event, event.session_id, event.worker_id,
                                   event.dp_rank, event.at, event.reason, self.seq)
            worker = (None if event.worker_id is None
                      else str(WorkerKey(event.worker_id, event.dp_rank or 0)))
            self.recent.append({"at": at, "decision": event.event,
                                "session_id": event.session_id, "worker": worker,
                                "reason": event.reason})
            # Counted as published once sent: not without --events-port, nor where dropped.
            if self.publisher is not None and self.publisher.publish(event):
                self.published[event.event] += 1

    def state(self) -> dict[str, Any]:
        """The ``lifecycle`` part of the router's /state."""
        return {
            "events_url": None if self.publisher is None else self.publisher.url,
            "published": {kind: self.published[kind] for kind in EVENT_KINDS},
            "dropped": 0 if self.publisher is None else self.publisher.dropped,
            "recent_decisions": list(self.recent),
        }


def _worker(worker: WorkerKey | None) -> str | None:
    return None if worker is None else str(worker)


def table_worker_of(programs: Any) -> WorkerOf:
    """``worker_of`` over a scheduler's program table (``{session_id: Program}``)."""

    def worker_of(session_id: str) -> WorkerKey | None:
        program = programs.get(session_id)
        return None if program is None else program.worker

    return worker_of
