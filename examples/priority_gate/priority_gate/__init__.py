"""``priority-gate``: an example request classifier for dynamo-thunderagent.

A deliberately small admission policy, written to show the plugin seam rather
than to compete with ``thunderagent``:

* At most ``max_sessions`` agent sessions hold a *slot* at a time. A session
  takes a slot with its first turn and gives it back with its session-final
  request, or after ``idle_release_seconds`` without a request in flight.
* Turns of a session that holds a slot are admitted at once.
* Subagents come first: a session whose parent holds a slot is admitted at
  once without a slot of its own. The parent is usually blocked on that
  subagent's answer, so queueing the subagent behind strangers would leave the
  parent's slot occupied by a program that cannot make progress.
* Every other request waits, in arrival order, for a slot to free up; when
  ``max_waiting`` requests already wait, the next one is rejected.
* Requests without a session id pass through untouched.

The gate names no preferred worker: the worker selector falls back to the
least-loaded eligible worker.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from dynamo_thunderagent.classifier import (
    Aborted,
    Admission,
    AdmissionRejected,
    ClassifyRequest,
    Clock,
    Completed,
    RequestClassifier,
    RequestEvent,
)

__all__ = ["PriorityGate", "PriorityGateParameters"]


class PriorityGateParameters(BaseModel):
    """The ``parameters:`` block of ``type: priority-gate`` (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_sessions: int = Field(64, gt=0, description="sessions that may hold a slot at once")
    max_waiting: int = Field(1024, ge=0, description="requests that may wait for a slot")
    idle_release_seconds: float = Field(
        600.0, gt=0.0, allow_inf_nan=False,
        description="a slot with nothing in flight for this long is given back",
    )


@dataclass
class _Slot:
    last_seen: float
    in_flight: set[str] = field(default_factory=set)  # admitted request ids not yet ended


@dataclass(eq=False)  # identity equality: the queue removes exactly this waiter
class _Waiter:
    request: ClassifyRequest
    future: asyncio.Future[None]


class PriorityGate(RequestClassifier):
    """Cap concurrently running sessions; subagents of running sessions go first."""

    Parameters: ClassVar[type[BaseModel]] = PriorityGateParameters

    def __init__(self, parameters: BaseModel, *, clock: Clock = time.monotonic) -> None:
        super().__init__(parameters, clock=clock)
        if not isinstance(parameters, PriorityGateParameters):
            raise TypeError(f"priority-gate needs PriorityGateParameters, got {parameters!r}")
        self.params = parameters
        self._slots: dict[str, _Slot] = {}  # session id -> its slot
        self._queue: deque[_Waiter] = deque()
        self._slot_of: dict[str, str] = {}  # admitted request id -> session whose slot it uses

    # ---- admission --------------------------------------------------------------
    async def classify(self, request: ClassifyRequest) -> Admission:
        session = request.session_id
        if session is None:
            return Admission(preferred=None, tracked=False)
        arrived = self.clock()
        if request.session_final:
            self._give_back(session)
            return Admission(preferred=None, session_final=True)
        holder = self._holder(request)
        while holder is None:
            if not self._queue and len(self._slots) < self.params.max_sessions:
                holder = self._take_slot(session, self.clock())
            else:
                # _wake grants the slot before it wakes us; the loop covers the
                # rare slot that was given back again before we ran.
                await self._wait(request, session)
                holder = self._holder(request)
        now = self.clock()
        slot = self._slots[holder]
        slot.last_seen = now
        slot.in_flight.add(request.request_id)
        self._slot_of[request.request_id] = holder
        return Admission(preferred=None, waited_seconds=now - arrived)

    def _holder(self, request: ClassifyRequest) -> str | None:
        """The session whose slot this request may use now, if any."""
        if request.session_id in self._slots:
            return request.session_id
        if request.parent_session_id in self._slots:
            return request.parent_session_id
        return None

    async def _wait(self, request: ClassifyRequest, session: str) -> None:
        if len(self._queue) >= self.params.max_waiting:
            raise AdmissionRejected(
                request.request_id,
                f"all {self.params.max_sessions} session slots are taken and "
                f"{len(self._queue)} requests already wait (max_waiting="
                f"{self.params.max_waiting}); retry later",
            )
        waiter = _Waiter(request, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            # The client gave up (disconnect, timeout): leave the queue, or, if
            # a slot was granted to this session in the same instant and
            # nothing runs on it, pass the slot on at once.
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.future.done():
                slot = self._slots.get(session)
                if slot is not None and not slot.in_flight:
                    self._give_back(session)
            raise

    def _take_slot(self, session: str, now: float) -> str:
        self._slots[session] = _Slot(last_seen=now)
        return session

    def _give_back(self, session: str) -> None:
        slot = self._slots.pop(session, None)
        if slot is not None:
            for request_id in slot.in_flight:
                self._slot_of.pop(request_id, None)
            self._wake()

    def _wake(self) -> None:
        """Admit every waiting request that may run now, oldest first.

        A request that needs a new slot when none is free stays in the queue,
        but requests behind it whose session (or parent) already holds a slot
        still go: they add no session.
        """
        now = self.clock()
        for waiter in list(self._queue):
            request = waiter.request
            holder = self._holder(request)
            if holder is None and len(self._slots) < self.params.max_sessions:
                assert request.session_id is not None
                holder = self._take_slot(request.session_id, now)
            if holder is not None:
                self._queue.remove(waiter)
                if not waiter.future.done():
                    waiter.future.set_result(None)

    # ---- lifecycle ----------------------------------------------------------------
    def on_event(self, event: RequestEvent) -> None:
        holder = self._slot_of.get(event.request_id)
        slot = None if holder is None else self._slots.get(holder)
        if slot is None:
            return  # unknown, or its session already ended
        slot.last_seen = self.clock()
        if isinstance(event, (Completed, Aborted)):
            slot.in_flight.discard(event.request_id)
            del self._slot_of[event.request_id]

    @property
    def tick_interval(self) -> float:
        return min(5.0, self.params.idle_release_seconds)

    def tick(self) -> None:
        """Give back the slots of sessions that went quiet without a session-final."""
        now = self.clock()
        idle = [
            session for session, slot in self._slots.items()
            if not slot.in_flight and now - slot.last_seen >= self.params.idle_release_seconds
        ]
        for session in idle:
            self._give_back(session)

    def snapshot(self) -> dict[str, Any]:
        return {
            "sessions": sorted(self._slots),
            "max_sessions": self.params.max_sessions,
            "waiting": len(self._queue),
        }
