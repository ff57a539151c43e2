"""The router component: classifier + selector in front of Dynamo workers.

Request path (one asyncio task per request, driven by Dynamo)::

    frontend --tokenized request--> ThunderAgentRouter.generate
        classify (admit / defer / reject)  ->  select worker/rank  ->
        KvRouter.generate_from_request pinned to that worker/rank  ->
        chunks streamed back unchanged, lifecycle events to the classifier
        (a worker that fails the stream: the rest from another one, _fail_over)

Background tasks: a worker watch (live instance ids + capacity cards, read through
``workers.py``, and streams stalled on a worker that left, every ``refresh_interval``
seconds), the scheduler tick (every ``classifier.tick_interval``), and an optional loopback
HTTP server with the router's state for operators and tests.

(About 760 lines: ``generate`` is one handler because every request must end in exactly
one terminal state, and its ``try`` blocks are what guarantee that, failover included; the
chunk-level translation and the lifecycle tracking it calls live in ``translate.py``, what
a worker's error says and a failed turn's continuation in ``failover.py``, which streams
are stalled in ``stalls.py``, waiting while the client may leave in ``waiting.py``, and the
view of the workers in ``workers.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from asyncio import current_task, ensure_future
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import structlog

from dynamo_thunderagent.classifier import (
    Aborted,
    Admission,
    AdmissionLost,
    AdmissionRejected,
    ClassifyRequest,
    Completed,
    RequestClassifier,
    RequestEvent,
    Responding,
    Sent,
)
from dynamo_thunderagent.costs import TurnTiming
from dynamo_thunderagent.dynamo.failover import (
    Continuation,
    may_fail_over,
    refusal,
    worker_lost,
)
from dynamo_thunderagent.dynamo.stalls import StallWatch, Watched, WorkerLeft
from dynamo_thunderagent.dynamo.stats import (
    PROBE_SESSION_PREFIX,
    RouterObserver,
    RouterStats,
    bounded_state,
    missing_sessions_due,
)
from dynamo_thunderagent.dynamo.translate import (
    BadSessionHeader,
    StreamTracker,
    asks_for_stop_strings,
    classify_request,
    for_frontend,
    pin_request,
    session_final_response,
    worker_loads,
)
from dynamo_thunderagent.dynamo.waiting import until_stopped, watch_the_client
from dynamo_thunderagent.dynamo.workers import CardSource, ClientLike, WorkerWatch
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.selector import NoEligibleWorker, WorkerLoad, WorkerSelector

log = structlog.get_logger("dynamo_thunderagent.router")

# A turn whose worker fails it mid-stream or before its first chunk goes on on another
# live worker, at most this many times (each move is logged as request.failover).
FAILOVER_LIMIT = 2
# An admitted request that the router is not forwarding this long after admission is
# ended as aborted (see reap_orphans). Forwarding starts in the same loop step as
# admission, so any positive bound is safe; a few seconds keeps the log quiet.
ORPHAN_SECONDS = 5.0
# The longest the scheduler tick sleeps before it reads its interval again: a policy reload
# that shortens ``scheduler_interval_seconds`` takes effect within this.
TICK_RECHECK_SECONDS = 1.0


class StreamCut(Exception):
    """A worker's stream ended without a finish reason."""


class ClientGone(Exception):
    """Dynamo stopped the request (its client left) while its worker sent nothing."""


class EngineError(Exception):
    """The engine ended a request with an error finish (its message kept)."""

    def __init__(self, message: str, *, streamed: bool) -> None:
        super().__init__(message)
        self.message = message
        self.streamed = streamed


def _client_error(message: str) -> Exception:
    """An exception Dynamo's frontend turns into an HTTP error that keeps ``message``."""
    from dynamo.llm.exceptions import InvalidArgument  # the runtime's, loaded on first use

    error: Exception = InvalidArgument(message)
    return error


# The KV router's stream is read on demand, with no read-ahead task of Dynamo's between it
# and the handler: a stream the handler drops is then dropped at once, which cancels the
# worker's request, also one whose worker sends nothing (a read-ahead task waits on such a
# worker for ever and keeps the stream, so the worker was never told; docs/reliability.md).
# Read so, Dynamo 1.6.1's binding passes a worker's errors on as text that starts with the
# kind (a refusal as "InvalidRequest: ...", which failover.py reads), and its log line for
# each request's routing span says "cancelled" (stream_drop) even for a stream read to its
# end: the worker is told nothing then, and Dynamo's router metrics count the request as
# done (docs/metrics.md, "Structured events").
DEMAND_DRIVEN = 0


class KvRouterLike(Protocol):
    async def generate_from_request(self, request: Any,
                                    response_buffer_size: int = ...) -> AsyncIterator[Any]: ...
    async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]: ...


class ThunderAgentRouter:
    """Applies classifier and selector decisions to a Dynamo KV router."""

    def __init__(
        self,
        classifier: RequestClassifier,
        selector: WorkerSelector,
        kv_router: KvRouterLike,
        client: ClientLike,
        cards: CardSource | None,
        *,
        block_size: int = 16,
        refresh_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        exposed: ClientLike | None = None,
        exposed_endpoint: str | None = None,
    ) -> None:
        self.classifier = classifier
        self.selector = selector
        self.kv_router = kv_router
        self.workers = WorkerWatch(client, cards, clock=clock, exposed=exposed,
                                   exposed_endpoint=exposed_endpoint)
        self.block_size = block_size
        self.refresh_interval = refresh_interval
        self.clock = clock
        self.stats = RouterStats()
        self.observer: RouterObserver | None = None  # the metrics, when served
        self._tickets = itertools.count()
        # Tracked (session) requests being forwarded, by id: what reap_orphans checks
        # against. Requests without a session are only counted: their ids are not the
        # scheduler's business and may even repeat a tracked one's.
        self.in_flight: dict[str, StreamTracker] = {}
        self.passthrough_in_flight = 0
        # Prompt tokens of failovers sent to each worker/rank and not yet answered.
        self._pending_failovers: dict[WorkerKey, int] = {}
        # Every stream being forwarded, by ticket: the worker watch cuts those stalled on a
        # worker that has left (stalls.py), and failover carries them on.
        self.stalls = StallWatch()
        self._tasks: list[asyncio.Task[None]] = []
        self._sessions_notice_at: float | None = None
        # More parts of /state, by key (the policy reloader, the lifecycle notifications).
        self.state_extensions: dict[str, Callable[[], Any]] = {}

    # ---- request path -------------------------------------------------------------
    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[Any]:
        """Dynamo's handler: classify, select, forward, report the lifecycle."""
        request_id = _request_id(context)
        self.stats.requests += 1
        try:
            classify_input = classify_request(
                request, request_id, block_tokens=self.block_size,
                prefix_blocks=self.classifier.prefix_blocks_wanted,
                prefix_tokens=self.classifier.prefix_tokens_wanted)
        except BadSessionHeader as bad:
            self.stats.rejected += 1
            if self.observer is not None:
                self.observer.rejected("bad_session_header")
            raise _client_error(f"request {request_id}: {bad}") from None
        self._observe_session(classify_input)
        started = self.clock()

        ended = False  # counted as orphaned or cancelled already

        def orphaned(admission: Admission) -> None:
            # Admitted in the same loop step in which this handler was cancelled: nobody
            # will forward it, so end it now or its session waits behind it for ever.
            nonlocal ended
            ended = True
            if admission.tracked:
                self._report(admission, [Aborted(request_id, "handler cancelled at admission")])
            else:
                self.stats.cancelled += 1

        ticket = next(self._tickets)
        self.stats.waiting[ticket] = started
        try:
            admission = await until_stopped(self.classifier.classify(classify_input), context,
                                             orphaned)
        except asyncio.CancelledError:  # the handler itself was cancelled while it waited
            if not ended:
                self.stats.cancelled += 1
                self._wait_given_up(classify_input, started)
            raise
        except AdmissionLost as error:  # reconcile's answer: ended by the safety net
            self.stats.orphans += 1
            raise RuntimeError(str(error)) from None
        except AdmissionRejected as rejected:
            self.stats.rejected += 1
            raise _client_error(
                f"thunderagent admission rejected request {request_id}: {rejected.reason}"
            ) from None
        finally:
            del self.stats.waiting[ticket]
        if admission is None:  # the client left while its request waited: nobody to answer
            self.stats.cancelled += 1
            self._wait_given_up(classify_input, started)
            log.info("request.cancelled", request_id=request_id,
                     reason="client went away while waiting for admission")
            return
        if not admission.tracked:
            self.stats.passthrough += 1
        if classify_input.session_id is not None and not admission.session_final:
            # Every turn of a session, one run alongside its session's turn included (it
            # may have waited with that turn for room).
            waited = self.clock() - started
            self.stats.admission_wait_s.append(waited)
            if self.observer is not None:
                self.observer.admission_waited(waited)
        if admission.session_final:
            self.stats.session_final += 1
            yield session_final_response(request)
            return
        tracker = StreamTracker(request_id, classify_input.input_tokens)
        if admission.tracked:
            self.in_flight[request_id] = tracker
        else:
            self.passthrough_in_flight += 1
        # A request without a session id is no program's; the scheduler may still want to
        # know the room it takes while it runs (sessionless_kv).
        sessionless = (classify_input.input_tokens
                       if not admission.tracked and classify_input.session_id is None else None)
        target: WorkerKey | None = None
        # First token and finish as this router saw them: a turn's decode time for the cost
        # model, whichever timing fields the engine reports.
        first_token_at: float | None = None
        finished_at: float | None = None
        # What has reached the client, so that a worker lost mid-turn costs the turn nothing.
        continuation = Continuation(request)
        watched = self.stalls.streams[ticket] = Watched(tracker)
        client = watch_the_client(context, watched)
        try:
            forwarded, target = await self._forward(request, admission)
            while True:
                watched.worker_id = None if target is None else target.worker_id
                # Only what the worker's stream raises is the worker's failure; what the
                # body raises (an engine's error finish, a bug of ours) ends the request.
                lost: Exception | None = None
                next_chunk: Callable[[], Awaitable[Any]] | None = None
                try:
                    stream = await self.kv_router.generate_from_request(
                        forwarded, response_buffer_size=DEMAND_DRIVEN)
                    next_chunk = stream.__aiter__().__anext__
                    del stream  # held by next_chunk while it streams, and no longer
                except Exception as error:
                    lost = error
                while next_chunk is not None:
                    try:
                        # The read of the worker's next chunk, where the stall watch may
                        # cut it.
                        watched.pending = ensure_future(next_chunk())
                        if watched.client_gone:  # it left before this read began
                            watched.pending.cancel()
                        chunk = await watched.pending
                    except StopAsyncIteration:
                        break
                    except asyncio.CancelledError:
                        if _cut_for_the_client(watched):
                            raise ClientGone from None
                        if not _cut_by_the_watch(watched):
                            raise  # the client's (or a shutdown's)
                        lost = WorkerLeft(f"worker {watched.worker_id} left discovery and "
                                          f"its stream stalled")
                        break
                    except Exception as error:
                        lost = error
                        break
                    watched.pending = None
                    if continuation.pending is not None:  # checked here: once a chunk
                        self._landed(continuation)
                    chunk = continuation.as_one_stream(chunk)
                    events = tracker.observe(chunk)
                    first = False
                    if events:  # only on the first chunk, the first token and the finish
                        first = any(isinstance(e, Sent) for e in events)
                        if first and tracker.sent_to is not None:
                            watched.worker_id = tracker.sent_to.worker_id
                        for event in events:
                            if isinstance(event, Responding):
                                first_token_at = self.clock()
                            elif isinstance(event, Completed):
                                finished_at = self.clock()
                    self._report(admission, events, sessionless)
                    if tracker.engine_error is not None:
                        raise EngineError(tracker.engine_error, streamed=tracker.responding)
                    continuation.carry(chunk)
                    yield for_frontend(chunk, tracker.sent_to if first else None)
                self._landed(continuation)
                next_chunk = watched.pending = None  # the failed stream is not kept
                if tracker.terminal is not None:
                    break  # it finished: an error after the finish costs the client nothing
                if lost is None:
                    lost = StreamCut("stream ended without a finish reason")
                try:
                    moved = await self._fail_over(lost, continuation, tracker, target,
                                                  sessionless, context)
                except Exception as error:  # the turn fails with the worker's error
                    log.warning("request.failover_failed", request_id=request_id,
                                error=repr(error))
                    moved = None
                if moved is not None:
                    forwarded, target = moved
                elif isinstance(lost, StreamCut) and (continuation.budget_spent
                                                      or _stopped(context)):
                    # Every token asked for reached the client, only the finish is missing;
                    # or the client has gone: nobody to tell.
                    self._report(admission, tracker.abort(str(lost)), sessionless)
                    break
                else:  # not carried on: the client gets the error, never a cut-short 200
                    raise lost
        except (GeneratorExit, asyncio.CancelledError) as error:  # the client went away
            # (or, with stop strings, the text reached one: cut_by_the_frontend)
            self._report(admission, tracker.cut_by_the_frontend(
                f"{type(error).__name__}: {error}",
                stop_strings=asks_for_stop_strings(request)), sessionless)
            raise
        except ClientGone:  # nobody to answer; the stream, dropped with this frame, cancels
            # the worker's request (read on demand: DEMAND_DRIVEN)
            cut = tracker.cut_by_the_frontend(
                "the client went away while the worker sent nothing",
                stop_strings=asks_for_stop_strings(request))
            self._report(admission, cut, sessionless)
            if any(isinstance(event, Aborted) for event in cut):
                log.info("request.cancelled", request_id=request_id,
                         worker=str(tracker.sent_to or target),
                         reason="client went away while its worker sent nothing")
            return
        except EngineError as error:  # already reported as aborted by the tracker
            self.stats.errors += 1
            serving = tracker.sent_to or target  # a request the KV router placed: its chunk's
            log.warning("request.engine_error", request_id=request_id, worker=str(serving),
                        error=error.message)
            if error.streamed:
                raise RuntimeError(f"request {request_id}: the engine failed it mid-stream: "
                                   f"{error.message}") from None
            # Refused before any token: the request as sent cannot run (say, a prompt
            # longer than the engine accepts); the client gets the engine's reason.
            on = "" if serving is None else f" on worker {serving}"
            raise _client_error(f"request {request_id} was refused by the engine{on}: "
                                f"{error.message}") from None
        except Exception as error:
            self._report(admission, tracker.abort(f"{type(error).__name__}: {error}"),
                         sessionless)
            self.stats.errors += 1
            serving = tracker.sent_to or target  # a request the KV router placed: its chunk's
            log.warning("request.failed", request_id=request_id, worker=str(serving),
                        error=repr(error))
            # (A lost worker was put aside in _fail_over, which every stream error meets.)
            # A plain RuntimeError reaches the client as a 500 (the KV router's own errors
            # would surface as a bare 400); Dynamo 1.6.1's frontend sends the client a canned
            # message for it and logs this one, where an operator finds the worker and why.
            where = f"worker {serving}" if serving is not None else "routing"
            refused = refusal(error)
            if refused is not None:  # the request's own fault: a 400 with the reason
                # (Refused before the first chunk of a request the KV router placed, the
                # worker is not known: the refusal is most likely its engine's, not routing's.)
                at = f" at {where}" if serving is not None else ""
                raise _client_error(f"request {request_id} was refused{at}: {refused}") from None
            raise RuntimeError(
                f"request {request_id} failed at {where}: {type(error).__name__}: {error}"
            ) from error
        finally:
            if client is not None:
                client.cancel()
            self._landed(continuation)
            del self.stalls.streams[ticket]
            if not admission.tracked:
                self.passthrough_in_flight -= 1
            elif self.in_flight.get(request_id) is tracker:  # not another request's entry
                del self.in_flight[request_id]
            if tracker.terminal is not None and tracker.cached_tokens is not None:
                self.stats.prompt_tokens += tracker.usage_prompt_tokens or tracker.prompt_tokens
                self.stats.cached_tokens += tracker.cached_tokens
            # Engine costs are learned from agent turns only: a sessionless request (a
            # health check, a client's one-token calibration) or a doctor probe says
            # nothing about them, and one such near-zero decode would become the
            # yardstick (CostMeter keeps the least smoothed decode time it has seen).
            learn = admission.tracked and not continuation.failovers and not (
                classify_input.session_id or "").startswith(PROBE_SESSION_PREFIX)
            if learn and isinstance(tracker.terminal, Completed):
                decode = (None if first_token_at is None or finished_at is None
                          else max(0.0, finished_at - first_token_at))
                self.classifier.observe_turn(TurnTiming(
                    tracker.uncached_tokens,
                    None if tracker.prefill_ms is None else tracker.prefill_ms / 1e3,
                    decode, tracker.output_tokens))

    def _wait_given_up(self, request: ClassifyRequest, started: float) -> None:
        """A turn's wait for admission ended without it (its client left, or its handler
        was cancelled): a censored wait, its length a lower bound (a benchmark's clients
        leave as its window closes, before its figures are read)."""
        if request.session_id is not None and not request.session_final:
            self.stats.wait_given_up(self.clock() - started)

    def _observe_session(self, request: ClassifyRequest) -> None:
        """Count whether the request carried a session id; say so when most recent ones did
        not (INFO, at most once a minute): those requests bypass the program table."""
        session = request.session_id
        if session is not None and request.session_final and session.startswith(
                PROBE_SESSION_PREFIX):
            self.stats.doctor_probes += 1
            return
        has_session = session is not None
        if has_session:
            self.stats.with_session += 1
        else:
            self.stats.without_session += 1
        now = self.clock()
        self.stats.recent.observe(has_session, now)
        with_session, without_session = self.stats.recent.counts(now)
        if missing_sessions_due(with_session, without_session, self._sessions_notice_at, now):
            self._sessions_notice_at = now
            log.info("router.sessions_missing", recent_requests=with_session + without_session,
                     without_session=without_session,
                     hint="requests without X-Dynamo-Session-ID get plain KV routing and no "
                          "program; send it on every turn of an agent (examples/agent_loop.py)")

    async def _forward(
        self, request: dict[str, Any], admission: Admission
    ) -> tuple[dict[str, Any], WorkerKey | None]:
        """The request to send and the worker/rank it is pinned to (None: KV router's pick)."""
        live = self.workers.live_ids()
        if not admission.tracked:
            # No session: the KV router's own choice. A turn run alongside its session's
            # running one: pinned where that turn runs (their shared prompt is cached there).
            side = admission.preferred
            if side is not None and side.worker_id in live:
                return pin_request(request, side), side
            if not self.workers.prefill_only:
                return request, None
            # Beside prefill-only workers the KV router may pick one (it holds the
            # prompt's cache), which would answer with the first token alone: the least
            # loaded live worker instead.
            token_ids = list(request.get("token_ids") or [])
            loads = await self.kv_router.get_potential_loads(token_ids)
            candidates = self.workers.holding(worker_loads(loads, live), len(token_ids))
            if not candidates:
                raise NoEligibleWorker("no live worker that decodes serves this model")
            target = self.selector.select(candidates, None, self.block_size)
            return pin_request(request, target), target
        preferred = admission.preferred
        home = preferred if preferred is not None and preferred.worker_id in live else None
        if home is not None and self.selector.takes_live_preferred:
            return pin_request(request, home), home
        try:
            loads = await self.kv_router.get_potential_loads(list(request.get("token_ids") or []))
        except Exception as error:
            if home is None:
                raise
            # A selector that weighs a live home against the loads: without loads, the
            # turn goes home, as it would with a selector that never asks. Logged for the
            # first such turn and every 1,000th after (the count is in /state).
            if self.stats.loads_unavailable % 1000 == 0:
                log.warning("router.loads_unavailable", error=repr(error), pinned=str(home),
                            turns_so_far=self.stats.loads_unavailable + 1)
            self.stats.loads_unavailable += 1
            return pin_request(request, home), home
        candidates = self.workers.holding(worker_loads(loads, live),
                                          len(request.get("token_ids") or []))
        if home is not None and all(c.worker != home for c in candidates):
            # The KV router does not know the home rank (yet): nothing to weigh it against.
            self.stats.loads_unavailable += 1
            return pin_request(request, home), home
        if not candidates:
            raise NoEligibleWorker("no live worker serves this model")
        target = self.selector.select(candidates, admission.preferred, self.block_size)
        return pin_request(request, target), target

    async def _fail_over(
        self, lost: Exception, continuation: Continuation, tracker: StreamTracker,
        target: WorkerKey | None, sessionless: int | None, context: Any,
    ) -> tuple[dict[str, Any], WorkerKey] | None:
        """After the stream of the worker serving a turn failed (it raised ``lost``, or it
        was cut without a finish), the request that carries the turn on and the live
        worker/rank it is pinned to: the least loaded live one that has not failed this turn,
        as the selector picks without a home, counting failovers sent there and not yet
        answered.

        None where the turn ends as before: it had ended, the client left, the error is not
        the worker's (:func:`may_fail_over`) or came again as it was on the last worker (the
        request's own fault; not a lost worker's error, nor a cut stream), it moved
        FAILOVER_LIMIT times, its budget is spent or its output cannot be resumed midway, or
        no other live worker is known. Anything raised here (the KV router's loads, say) the
        caller logs, and the turn fails with the worker's error. A worker that is gone or
        unreachable (:func:`worker_lost`) is avoided for UNREACHABLE_SECONDS (where another
        is live), whether or not the turn goes on (its client may have left).
        """
        gone = worker_lost(lost)
        failed = self._failed_worker(tracker.sent_to or target, lost if gone else None)
        if gone and failed is not None:  # whether or not the turn goes on
            self._mark_unreachable(failed)
        if tracker.terminal is not None or _stopped(context) or not may_fail_over(lost):
            return None
        if failed is not None:
            continuation.failed_workers.add(failed)  # not asked again for this turn
        # The same error from the next worker is the request's own fault; a lost worker's
        # error, or a cut stream, says nothing about the request (two may fail in turn).
        signature = f"{type(lost).__name__}: {lost}"
        repeated, continuation.last_error = continuation.last_error == signature, signature
        if continuation.failovers >= FAILOVER_LIMIT or (
                repeated and not gone and not isinstance(lost, StreamCut)):
            return None
        following = continuation.next_request()
        if following is None:
            return None
        token_ids = list(following.get("token_ids") or [])
        loads = await self.kv_router.get_potential_loads(token_ids)
        pending = self._pending_failovers
        candidates = self.workers.holding([
            WorkerLoad(c.worker, c.prefill_tokens + pending.get(c.worker, 0), c.decode_blocks)
            for c in worker_loads(loads, self.workers.live_ids())
            if c.worker.worker_id not in continuation.failed_workers], len(token_ids))
        try:
            chosen = self.selector.select(candidates, None, self.block_size)
        except NoEligibleWorker:
            return None
        tracker.rerouted()  # the scheduler follows the program to where it runs now
        if sessionless is not None:
            self.classifier.sessionless_ended(tracker.request_id)
        pending[chosen] = pending.get(chosen, 0) + len(token_ids)
        continuation.pending = (chosen, len(token_ids))
        self.stats.failovers += 1
        log.warning("request.failover", request_id=tracker.request_id, failed=failed,
                    to=str(chosen), streamed_tokens=continuation.carried, error=signature)
        return pin_request(following, chosen), chosen

    def _failed_worker(self, serving: WorkerKey | None, lost: Exception | None) -> int | None:
        """The id of the worker that failed a turn: the one serving it, when known; else
        (a request the KV router placed itself, lost before its first chunk) the one whose
        request-plane address the lost worker's error names, as Dynamo 1.6.1's connection
        and deadline errors do. None when neither tells."""
        if serving is not None:
            return serving.worker_id
        return None if lost is None else self.workers.worker_at_address(lost)

    def _landed(self, continuation: Continuation) -> None:
        """A failover's stream answered or ended: its load is the KV router's to count."""
        if continuation.pending is None:
            return
        worker, tokens = continuation.pending
        continuation.pending = None
        left = self._pending_failovers.get(worker, 0) - tokens
        if left > 0:
            self._pending_failovers[worker] = left
        else:
            self._pending_failovers.pop(worker, None)

    def _mark_unreachable(self, worker_id: int) -> None:
        if self.workers.put_aside(worker_id):
            with contextlib.suppress(Exception):
                self.refresh_workers()  # move its programs now, not at the next refresh

    def _report(self, admission: Admission, events: list[RequestEvent],
                sessionless_tokens: int | None = None) -> None:
        """Tell the classifier of a tracked request's events; of a request without a
        session id (``sessionless_tokens``: its prompt tokens), when it starts running on
        a worker and when it ends."""
        if not admission.tracked:
            if sessionless_tokens is not None:
                for event in events:
                    if isinstance(event, Sent):
                        self.classifier.sessionless_started(event.request_id, event.worker,
                                                            sessionless_tokens)
                    elif isinstance(event, (Completed, Aborted)):
                        self.classifier.sessionless_ended(event.request_id)
            return
        for event in events:
            self.classifier.on_event(event)
            if isinstance(event, Completed):
                self.stats.completed += 1
            elif isinstance(event, Aborted):
                self.stats.aborted += 1

    # ---- background -------------------------------------------------------------
    def refresh_workers(self) -> bool:
        """Read liveness and capacity cards; tell the classifier. True if changed."""
        read = self.workers.read()
        self.classifier.update_workers(read.live, read.cards)
        block_sizes = {card.block_size for card in read.cards.values()}
        if len(block_sizes) == 1:
            self.block_size = block_sizes.pop()
        self.workers.commit(read)
        try:  # a warning for operators: whatever it meets, the scheduler has been told
            self.workers.check_exposed()
        except Exception as error:
            log.warning("workers.exposed_check_failed", error=repr(error))
        return read.changed

    def cut_stalled_streams(self) -> int:
        """Cut the streams stalled on a worker that discovery no longer lists (see
        stalls.py): each fails over as its worker's failure. A silent stream its client
        stopped is cut as well, for the client: its turn ends. Returns how many were cut
        for their worker."""
        listed = self.workers.listed()
        cut = 0
        for watched in self.stalls.stalled(listed, self.clock()):
            if watched.pending is None or not watched.pending.cancel():
                continue
            if watched.client_stopped:
                watched.client_gone = True
                continue
            watched.cut = True
            cut += 1
            log.warning("request.stalled", request_id=watched.tracker.request_id,
                        worker=watched.worker_id, seconds=self.stalls.stall_seconds)
        self.stats.stalled += cut
        return cut

    async def _watch_workers(self) -> None:
        while True:
            try:
                self.refresh_workers()
            except Exception as error:  # keep watching; log what failed
                log.warning("workers.refresh_failed", error=repr(error))
            try:
                self.cut_stalled_streams()
            except Exception as error:
                log.warning("workers.stall_check_failed", error=repr(error))
            await asyncio.sleep(self.refresh_interval)

    async def _tick(self, interval: float) -> None:
        last = time.monotonic()
        while True:
            # Read each time: a policy reload may change the interval. The sleep is cut in
            # slices so that a shorter one applies within TICK_RECHECK_SECONDS, not after a
            # sleep begun under the old one (an hour's, say, typed by mistake).
            left = last + (self.classifier.tick_interval or interval) - time.monotonic()
            if left > 0:
                await asyncio.sleep(min(left, TICK_RECHECK_SECONDS))
                continue
            self.tick_once()
            last = time.monotonic()

    def tick_once(self) -> None:
        """The scheduler's tick, then the safety nets: waits its decisions left unanswered
        (``reconcile``), then admitted requests nothing forwards (``reap_orphans``). Each
        runs whatever the one before raised: a bug must not stop scheduling, nor the nets
        that catch what a bug left behind."""
        steps: tuple[tuple[str, Callable[[], object]], ...] = (
            ("scheduler.tick_failed", self.classifier.tick),
            ("scheduler.reconcile_failed", self.classifier.reconcile),
            ("router.reap_failed", self.reap_orphans),
        )
        for failed, step in steps:
            try:
                step()
            except Exception as error:
                log.exception(failed, error=repr(error))

    def reap_orphans(self) -> list[str]:
        """End admitted requests that nothing forwards (ids returned); see ORPHAN_SECONDS."""
        now = self.classifier.clock()
        orphans = [rid for rid, at in self.classifier.admitted().items()
                   if rid not in self.in_flight and now - at >= ORPHAN_SECONDS]
        for rid in orphans:
            log.warning("request.orphaned", request_id=rid,
                        reason="admitted but not forwarded; ended as aborted")
            self.classifier.on_event(Aborted(rid, "admitted but never forwarded"))
            self.stats.orphans += 1
        return orphans

    def start(self) -> None:
        """Start the worker watch and the scheduler tick on the running loop."""
        self._tasks.append(asyncio.create_task(self._watch_workers()))
        interval = self.classifier.tick_interval
        if interval is not None:
            self._tasks.append(asyncio.create_task(self._tick(interval)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def state(self) -> dict[str, Any]:
        return {
            "scheduler": bounded_state(self.classifier.snapshot()),
            "router": self.stats.as_dict(self.clock()),
            "in_flight": len(self.in_flight) + self.passthrough_in_flight,
            **self.workers.state(),
            "block_size": self.block_size,
            **{key: part() for key, part in self.state_extensions.items()},
        }


def _cut_by_the_watch(watched: Watched) -> bool:
    """Whether the cancellation being handled is the stall watch's cut of ``watched``'s read
    (consumed here): not where the handler's task itself was cancelled too (a client that
    left, a shutdown), which must go on as a cancellation. (Python 3.10 cannot tell; there
    the client check in ``_fail_over`` still ends the turn of a client that left.)"""
    cut, watched.cut = watched.cut, False
    return cut and not _handler_cancelled()


def _cut_for_the_client(watched: Watched) -> bool:
    """Whether the cancellation being handled is a cut for ``watched``'s client (see
    :func:`watch_the_client`): not where the handler's task itself was cancelled (that goes
    on as a cancellation). A stall cut at the same time is moot: there is nobody left to
    fail over for."""
    if not watched.client_gone or _handler_cancelled():
        return False
    watched.cut = False
    return True


def _handler_cancelled() -> bool:
    """Whether this handler's own task is being cancelled (Python 3.11's ``cancelling``)."""
    cancelling = getattr(current_task(), "cancelling", None)
    return cancelling is not None and bool(cancelling())


def _stopped(context: Any) -> bool:
    """Whether the client has gone (Dynamo's context stopped or killed)."""
    for name in ("is_stopped", "is_killed"):
        check = getattr(context, name, None)
        if check is not None:
            with contextlib.suppress(Exception):
                if check():
                    return True
    return False


def _request_id(context: Any) -> str:
    if context is not None:
        with contextlib.suppress(Exception):
            return str(context.id())
    return uuid.uuid4().hex
