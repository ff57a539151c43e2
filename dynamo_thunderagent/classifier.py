"""The request-classifier role: an async admission gate over the scheduler core.

``classify`` admits a request (naming a preferred worker/rank), defers it
(awaits until the scheduler releases it) or rejects it with
:class:`AdmissionRejected`. ``on_event`` feeds the request's lifecycle back.
The shell (the Dynamo router component) calls ``update_workers`` when workers
join, leave or publish capacity, and ``tick`` every ``tick_interval`` seconds.

The only state here is the futures of deferred requests; everything that
decides lives in :class:`~dynamo_thunderagent.scheduler.Scheduler`, which
takes ``now`` from the injected clock.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.costs import TurnTiming
from dynamo_thunderagent.decisions import Decisions, Reject, Release
from dynamo_thunderagent.parameters import EmptyParameters, ThunderAgentParameters
from dynamo_thunderagent.program import NO_PREFIX, PrefixBlocks, RequestState, WorkerKey
from dynamo_thunderagent.program_log import SchedulerObserver, log_event
from dynamo_thunderagent.scheduler import Scheduler

log = structlog.get_logger("dynamo_thunderagent")

Clock = Callable[[], float]
# Called with every Decisions a classifier applies (the lifecycle notifications and the
# recent-decisions view of /state listen here).
DecisionListener = Callable[[Decisions], None]


@dataclass(frozen=True)
class ClassifyRequest:
    """What admission needs of a request (from its ``agent_context`` and tokens)."""

    request_id: str
    session_id: str | None
    input_tokens: int
    session_final: bool = False
    # The parent's session id when a subagent sends one (X-Dynamo-Parent-Session-ID):
    # for custom classifiers; the ThunderAgent scheduler does not use it.
    parent_session_id: str | None = None
    # The prompt's leading KV blocks, filled in only for classifiers whose
    # ``prefix_blocks_wanted`` is non-zero.
    prefix: PrefixBlocks = NO_PREFIX


@dataclass(frozen=True)
class Admission:
    """An admitted request: route it to ``preferred`` (None: any eligible worker).

    ``session_final`` admissions carry no turn: answer without a worker.
    ``tracked`` is False for requests the classifier does not follow (no
    session, or a turn run alongside its session's running turn), which need no
    lifecycle events.
    """

    preferred: WorkerKey | None
    session_final: bool = False
    tracked: bool = True
    waited_seconds: float = 0.0


class AdmissionRejected(Exception):
    """The request cannot be admitted; ``reason`` says why and which limit."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(reason)
        self.request_id = request_id
        self.reason = reason


class AdmissionLost(Exception):
    """A request waited for admission and the scheduler no longer tracks it (a scheduler
    step that raised part-way dropped it without deciding its outcome): it is not admitted,
    and its client gets an error instead of waiting for ever."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id}: the scheduler lost track of it while it "
                         "waited for admission (a scheduler error: see the router's log for "
                         "scheduler.tick_failed or a traceback); send it again")
        self.request_id = request_id


# ---- lifecycle events ------------------------------------------------------------
@dataclass(frozen=True)
class Sent:
    request_id: str
    worker: WorkerKey


@dataclass(frozen=True)
class Responding:
    request_id: str


@dataclass(frozen=True)
class Completed:
    request_id: str
    context_tokens: int  # prompt + generated tokens now in the program's cache
    cached_tokens: int | None = None  # of the prompt, found cached by the engine (if told)


@dataclass(frozen=True)
class Aborted:
    request_id: str
    reason: str = ""


RequestEvent = Sent | Responding | Completed | Aborted


class RequestClassifier(ABC):
    """Admission gate run before a request is routed."""

    Parameters: ClassVar[type[BaseModel]] = EmptyParameters

    def __init__(self, parameters: BaseModel, *, clock: Clock = time.monotonic) -> None:
        self.parameters = parameters
        self.clock = clock
        self.decision_listeners: list[DecisionListener] = []

    def reconfigure(self, parameters: BaseModel) -> bool:
        """Run with new ``parameters`` (already validated) without losing state; False if
        this type cannot change them live (the shell then keeps the old ones)."""
        return False

    @abstractmethod
    async def classify(self, request: ClassifyRequest) -> Admission:
        """Admit (maybe after waiting) or raise AdmissionRejected."""

    def on_event(self, event: RequestEvent) -> None:
        """Learn a request's lifecycle; events may arrive in any network order."""

    def update_workers(
        self, live_worker_ids: Iterable[int], cards: Mapping[WorkerKey, CapacityCard]
    ) -> None:
        """The runtime's live worker ids and the capacity cards of their ranks."""

    @property
    def tick_interval(self) -> float | None:
        """Seconds between ``tick`` calls; None if this classifier needs none."""
        return None

    def observe_turn(self, timing: TurnTiming) -> None:
        """A completed turn's engine timings (its uncached prefill and its decode)."""

    @property
    def prefix_blocks_wanted(self) -> int:
        """How many leading block hashes per request the shell should compute (0: none)."""
        return 0

    @property
    def prefix_tokens_wanted(self) -> int:
        """How many leading tokens those hashes should span (0: one KV block each)."""
        return 0

    def tick(self) -> None:
        """Periodic decisions (pressure, resume, expiry)."""

    def sessionless_started(self, request_id: str, worker: WorkerKey, tokens: int) -> None:
        """A request without a session id (passed through) runs on ``worker`` with
        ``tokens`` prompt tokens. Unlike ``on_event``'s events, these two come in order:
        the router calls ``sessionless_ended`` after the request's ``sessionless_started``,
        once for each (a move to another worker ends it on the old one, then starts it on
        the new)."""

    def sessionless_ended(self, request_id: str) -> None:
        """That request ended, whichever way (an end with no start before it is ignored)."""

    def reconcile(self) -> list[str]:
        """Answer the admission waits that the classifier's own decisions left unanswered
        (ids returned); a safety net, run by the shell after each tick."""
        return []

    def admitted(self) -> Mapping[str, float]:
        """Requests admitted and not yet ended, with when (this classifier's clock).

        The shell ends any that it is not forwarding (a safety net: an admitted
        request nobody forwards would hold its session's turn for ever).
        """
        return {}

    def snapshot(self) -> dict[str, Any]:
        """Plain-data state for the router's state endpoint."""
        return {}


class ThunderAgentClassifier(RequestClassifier):
    """ThunderAgent program-aware admission (mission.md, parity baseline)."""

    Parameters: ClassVar[type[BaseModel]] = ThunderAgentParameters

    def __init__(self, parameters: BaseModel, *, clock: Clock = time.monotonic) -> None:
        super().__init__(parameters, clock=clock)
        assert isinstance(parameters, ThunderAgentParameters)
        self.scheduler = Scheduler(parameters)
        self._waiters: dict[str, asyncio.Future[Release | Reject]] = {}
        # Told of every program-changing step, rejection and tick (the router's metrics).
        self.observers: list[SchedulerObserver] = []

    def reconfigure(self, parameters: BaseModel) -> bool:
        """Every ThunderAgent parameter can change live; programs, waiting turns and
        counters are kept (docs/operate.md)."""
        assert isinstance(parameters, ThunderAgentParameters)
        self.scheduler.reconfigure(parameters)
        self.parameters = parameters
        return True

    @property
    def tick_interval(self) -> float:
        return self.scheduler.params.scheduler_interval_seconds

    @property
    def deferred_requests(self) -> int:
        """Turns waiting for admission now."""
        return len(self._waiters)

    @property
    def prefix_blocks_wanted(self) -> int:
        params = self.scheduler.params
        return params.shared_prefix_max_blocks if params.shared_prefix_accounting else 0

    @property
    def prefix_tokens_wanted(self) -> int:
        params = self.scheduler.params
        return params.shared_prefix_max_tokens if params.shared_prefix_accounting else 0

    async def classify(self, request: ClassifyRequest) -> Admission:
        if request.session_id is None:
            return Admission(preferred=None, tracked=False)
        arrived = self.clock()
        decisions = self.scheduler.submit(
            request.request_id, request.session_id, request.input_tokens, arrived,
            session_final=request.session_final, prefix=request.prefix,
        )
        outcome = decisions.outcome(request.request_id)
        # This call's own outcome is answered here, never through a waiter: a rejected
        # duplicate id must not answer the earlier request that holds that id.
        self._apply(decisions, own=request.request_id)
        if outcome is None:
            waiter: asyncio.Future[Release | Reject] = asyncio.get_running_loop().create_future()
            self._waiters[request.request_id] = waiter
        if outcome is None:
            log.debug("request.deferred", request_id=request.request_id,
                      session_id=request.session_id)
            try:
                outcome = await waiter
            except asyncio.CancelledError:
                self._waiters.pop(request.request_id, None)
                # A session-final whose client left stays queued behind its session's
                # turn, so the session still ends when that turn does (nobody is
                # answered): the client said it was done. Dropped, it left the program
                # in the table, and a charge on its rank, until retention expired it.
                if not request.session_final:
                    self._apply(self.scheduler.aborted(request.request_id, self.clock()))
                raise
        if isinstance(outcome, Reject):
            raise AdmissionRejected(outcome.request_id, outcome.reason)
        return Admission(
            preferred=outcome.worker,
            session_final=outcome.session_final,
            tracked=outcome.tracked,
            waited_seconds=self.clock() - arrived,
        )

    def on_event(self, event: RequestEvent) -> None:
        now = self.clock()
        if isinstance(event, Sent):
            decisions = self.scheduler.sent(event.request_id, event.worker, now)
        elif isinstance(event, Responding):
            decisions = self.scheduler.responding(event.request_id, now)
        elif isinstance(event, Completed):
            decisions = self.scheduler.completed(event.request_id, event.context_tokens, now,
                                                event.cached_tokens)
        else:
            decisions = self.scheduler.aborted(event.request_id, now)
        self._apply(decisions)

    def observe_turn(self, timing: TurnTiming) -> None:
        self.scheduler.observe_turn(timing)

    def sessionless_started(self, request_id: str, worker: WorkerKey, tokens: int) -> None:
        self._apply(self.scheduler.sessionless_started(request_id, worker, tokens,
                                                       self.clock()))

    def sessionless_ended(self, request_id: str) -> None:
        self._apply(self.scheduler.sessionless_ended(request_id, self.clock()))

    def update_workers(
        self, live_worker_ids: Iterable[int], cards: Mapping[WorkerKey, CapacityCard]
    ) -> None:
        self._apply(self.scheduler.set_workers(frozenset(live_worker_ids), dict(cards),
                                               self.clock()))

    def tick(self) -> None:
        started = time.perf_counter()
        decisions = self.scheduler.tick(self.clock())
        elapsed = time.perf_counter() - started
        self._apply(decisions)
        for observer in self.observers:
            observer.ticked(elapsed)
        if decisions.changed:
            log.info("scheduler.tick", elapsed_ms=round(elapsed * 1e3, 3),
                     paused=len(decisions.paused), resumed=len(decisions.resumed),
                     marked=len(decisions.marked), expired=len(decisions.expired),
                     forced=len(decisions.forced), waiting=len(self._waiters))

    def admitted(self) -> Mapping[str, float]:
        # A released request whose waiter is still here is not the shell's to end: its
        # handler was never told (reconcile answers it).
        return {rid: request.released_at
                for rid, request in self.scheduler.table.requests.items()
                if request.state is RequestState.RELEASED and request.released_at is not None
                and rid not in self._waiters}

    def reconcile(self) -> list[str]:
        """Between calls every waiter's request is one the scheduler holds back. A call that
        raised part-way (its decisions never applied) can leave a waiter behind whose
        request the scheduler released (it is sent to its program's worker/rank, as the
        scheduler holds it) or no longer tracks (the wait fails with AdmissionLost, so the
        client gets an error, not a wait that never ends)."""
        requests = self.scheduler.table.requests
        answered = []
        for request_id, waiter in list(self._waiters.items()):
            request = requests.get(request_id)
            if request is not None and request.state is not RequestState.RELEASED:
                continue  # still held back, as the scheduler knows
            del self._waiters[request_id]
            answered.append(request_id)
            if waiter.done():
                continue
            if request is None:
                waiter.set_exception(AdmissionLost(request_id))
                log.error("request.wait_lost", request_id=request_id,
                          effect="the scheduler no longer tracks it; its client gets an error")
            else:
                program = self.scheduler.table.programs.get(request.session_id)
                worker = program.worker if program is not None else None
                # Admitted now, as far as the shell can tell: the reaper gives its handler
                # the usual time to forward it.
                request.released_at = self.clock()
                waiter.set_result(Release(request_id, worker))
                log.error("request.release_recovered", request_id=request_id,
                          worker=str(worker), effect="released by the scheduler, its handler "
                                                     "never told; sent now")
        return answered

    def snapshot(self) -> dict[str, Any]:
        state = self.scheduler.snapshot(self.clock())
        state["deferred_requests"] = len(self._waiters)
        return state

    def _apply(self, decisions: Decisions, own: str | None = None) -> None:
        """Wake deferred requests (all but ``own``, the caller's) and log what changed."""
        outcomes: list[Release | Reject] = [*decisions.released, *decisions.rejected]
        for outcome in outcomes:
            if outcome.request_id == own:
                continue
            waiter = self._waiters.pop(outcome.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(outcome)
        for reject in decisions.rejected:
            log.warning("request.rejected", request_id=reject.request_id, reason=reject.reason)
        for session_id in decisions.created:
            log.debug("program.created", session_id=session_id)
        for session_id in decisions.marked:
            log.info("program.marked_for_pause", session_id=session_id)
        # One event per program-changing step, with its reason, rank, tokens and wait, as
        # the scheduler took it (Decisions.steps); the observers count the same steps.
        for event in decisions.steps:
            log_event(event)
            for observer in self.observers:
                observer.program_event(event)
        for reject in decisions.rejected:
            for observer in self.observers:
                observer.rejected(reject.limit)
        if decisions.changed:
            for listener in self.decision_listeners:
                try:
                    listener(decisions)
                except Exception as error:  # a listener must never stop admission
                    log.exception("decisions.listener_failed", error=repr(error))
