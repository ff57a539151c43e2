"""Program lifecycle notifications: the message schema and a small subscriber.

The paper's second half manages the tools around the model: reclaim an agent's sandbox
when its program ends, prepare it before the program resumes. The router cannot run
sandboxes, but it knows when those moments come, and ``dynamo-thunderagent serve
--events-port PORT`` publishes them on a ZeroMQ PUB socket at
``tcp://127.0.0.1:PORT`` (the transport Dynamo itself uses for KV events). Each
message is two frames: the topic (``program.paused``, ``program.resuming``,
``program.ended``, ``program.expired``) and one JSON object::

    {"v": 1, "seq": 17, "event": "resuming", "session_id": "agent-42",
     "worker_id": 7587890000000001, "dp_rank": 0, "at": 1764532800.25, "reason": "room"}

* ``paused``: the program gave way (KV pressure, or an idle program's room was needed);
  its next turn waits. Its tools may be parked.
* ``resuming``: the program is about to run again on ``worker_id``/``dp_rank`` (sent
  before its waiting turn is forwarded; ``reason`` is ``room`` or ``forced`` when it
  waited past ``resume_timeout_seconds``). Prepare its tools now.
* ``ended``: the program left the table (its session ended, it was evicted for room,
  or a first turn that never ran was rolled back). Reclaim its tools.
* ``expired``: the program was idle past ``session_retention_seconds``. Reclaim too.

``seq`` counts messages from 1 per router process: a gap means messages were lost (a
PUB socket drops what a subscriber is too slow, or too late, to take). ``at`` is Unix
time. ``worker_id``/``dp_rank`` are null where the router does not know them (an
ended or expired program).

Usage (a harness; needs ``pyzmq``)::

    from dynamo_thunderagent.events import Subscriber

    with Subscriber("tcp://127.0.0.1:5557") as events:
        for event in events:
            if event.event == "resuming":
                prepare_sandbox(event.session_id)

``async for event in subscribe_async(url)`` is the asyncio form.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, Literal, cast

SCHEMA_VERSION = 1
EventKind = Literal["paused", "resuming", "ended", "expired"]
EVENT_KINDS: tuple[EventKind, ...] = ("paused", "resuming", "ended", "expired")
TOPIC_PREFIX = "program."


def topic(kind: str) -> bytes:
    """The ZeroMQ topic of an event kind (subscribe to a prefix of it)."""
    return f"{TOPIC_PREFIX}{kind}".encode()


@dataclass(frozen=True)
class LifecycleEvent:
    """One program lifecycle notification (see the module docstring for each kind)."""

    event: EventKind
    session_id: str
    worker_id: int | None
    dp_rank: int | None
    at: float
    reason: str = ""
    seq: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"v": SCHEMA_VERSION, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, payload: bytes | str) -> LifecycleEvent:
        """Parse one message body; ValueError names what is wrong with it."""
        try:
            data = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"lifecycle event is not JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError("lifecycle event must be a JSON object")
        if data.get("event") not in EVENT_KINDS:
            raise ValueError(f"lifecycle event kind must be one of {', '.join(EVENT_KINDS)}, "
                             f"got {data.get('event')!r}")
        if not isinstance(data.get("session_id"), str):
            raise ValueError("lifecycle event needs a string session_id")
        return cls(
            event=cast(EventKind, data["event"]), session_id=data["session_id"],
            worker_id=_optional_int(data.get("worker_id")),
            dp_rank=_optional_int(data.get("dp_rank")), at=float(data.get("at", 0.0)),
            reason=str(data.get("reason", "")), seq=int(data.get("seq", 0)),
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:  # pragma: no cover - pyzmq is in the `dynamo` extra
        raise ImportError("lifecycle events need pyzmq: pip install pyzmq") from None
    return zmq


def _topics(kinds: Iterable[str] | None) -> list[bytes]:
    if kinds is None:
        return [TOPIC_PREFIX.encode()]
    unknown = sorted(set(kinds) - set(EVENT_KINDS))
    if unknown:
        raise ValueError(f"unknown lifecycle event kinds {unknown}; "
                         f"known: {', '.join(EVENT_KINDS)}")
    return [topic(kind) for kind in kinds]


class Subscriber:
    """A blocking subscription to a router's lifecycle notifications.

    ``kinds``: the event kinds wanted (default: all). Iterating yields events as they
    come; :meth:`receive` waits at most ``timeout`` seconds. Connecting is
    asynchronous: messages published before the subscription reaches the router are
    not received (see ``seq``).
    """

    def __init__(self, url: str, kinds: Iterable[str] | None = None) -> None:
        zmq = _zmq()
        self.url = url
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        for prefix in _topics(kinds):
            self._socket.setsockopt(zmq.SUBSCRIBE, prefix)
        self._socket.connect(url)

    def receive(self, timeout: float | None = None) -> LifecycleEvent | None:
        """The next event, or None if none came within ``timeout`` seconds."""
        if timeout is not None and not self._socket.poll(int(timeout * 1000)):
            return None
        _, payload = self._socket.recv_multipart()
        return LifecycleEvent.from_json(payload)

    def __iter__(self) -> Iterator[LifecycleEvent]:
        while True:
            event = self.receive()
            if event is not None:
                yield event

    def close(self) -> None:
        self._socket.close()
        self._context.term()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


async def subscribe_async(url: str,
                          kinds: Iterable[str] | None = None) -> AsyncIterator[LifecycleEvent]:
    """The router's lifecycle notifications as an async iterator (asyncio)."""
    zmq = _zmq()
    from zmq import asyncio as zmq_asyncio

    context = zmq_asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        for prefix in _topics(kinds):
            socket.setsockopt(zmq.SUBSCRIBE, prefix)
        socket.connect(url)
        while True:
            _, payload = await socket.recv_multipart()
            yield LifecycleEvent.from_json(payload)
    finally:
        socket.close()
        context.term()
