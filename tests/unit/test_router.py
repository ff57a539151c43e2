"""The router component's request path and worker watch, with fake Dynamo objects.

The classifier and selector are the real ones (with a fake clock); the KV
router, the endpoint client and the model-card source are small fakes whose
streams are async generators shaped like Dynamo 1.6.1's chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.classifier import (
    Aborted,
    Completed,
    RequestEvent,
    Responding,
    Sent,
    ThunderAgentClassifier,
)
from dynamo_thunderagent.dynamo.router import DEMAND_DRIVEN, FAILOVER_LIMIT, ThunderAgentRouter
from dynamo_thunderagent.dynamo.router_card import CardSettings
from dynamo_thunderagent.dynamo.stalls import STALL_SECONDS
from dynamo_thunderagent.parameters import ThunderAgentParameters, ThunderAgentSelectorParameters
from dynamo_thunderagent.program import Lifecycle, Phase, RequestState, WorkerKey
from dynamo_thunderagent.selector import ThunderAgentSelector

A, B, C = 11, 22, 33  # worker instance ids


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chunk_stream(worker: int, rank: int, prompt: int, tokens: int) -> list[dict[str, Any]]:
    """The chunks a mocker worker sends for one request: one token each, then a finish."""
    chunks: list[dict[str, Any]] = []
    for i in range(tokens):
        chunk: dict[str, Any] = {"token_ids": [1000 + i], "finish_reason": None}
        if i == 0:
            chunk["routing_data"] = {"worker_id": {"decode_worker_id": worker,
                                                   "decode_dp_rank": rank}}
            chunk["completion_usage"] = {"prompt_tokens": prompt, "completion_tokens": 1,
                                         "prompt_tokens_details": {"cached_tokens": 0}}
        chunks.append(chunk)
    chunks.append({"token_ids": [], "finish_reason": "length",
                   "completion_usage": {"prompt_tokens": prompt, "completion_tokens": tokens,
                                        "prompt_tokens_details": {"cached_tokens": 0}}})
    return chunks


class FakeKvRouter:
    """Serves each request on the worker/rank it is pinned to (like Dynamo's KvRouter).

    ``hold`` (if set) is awaited after the first chunk, so a test can look at a
    request while it is in flight; ``fail_after_first`` raises instead of finishing
    (``fail_after_first_on``: on those workers only). It generates at most the
    request's ``max_tokens``.
    """

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.requests: list[dict[str, Any]] = []
        self.buffer_sizes: list[int] = []
        self.load_queries = 0
        self.loads: dict[int, int] = {A: 0, B: 0}  # worker -> potential prefill tokens
        self.hold: asyncio.Event | None = None
        self.fail_after_first: Exception | None = None
        self.fail_after_first_on: dict[int, Exception] = {}  # worker -> error mid-stream
        self.fail_before_first: dict[int, Exception] = {}  # worker -> error at connect
        self.end_without_finish = False
        self.end_without_finish_on: set[int] = set()  # workers that cut the stream
        self.error_finish: str | None = None  # end with {"error": ...} as the engine does
        self.hang_on: set[int] = set()  # workers that send one token, then nothing (hung)
        self.cancelled_streams = 0  # hung streams the router cancelled
        self.token_delay = 0.0  # seconds between chunks (wall clock)

    async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]:
        self.load_queries += 1
        return [{"worker_id": w, "dp_rank": 0, "potential_prefill_tokens": load,
                 "potential_decode_blocks": 0, "active_requests": 0}
                for w, load in self.loads.items()]

    async def generate_from_request(self, request: Any,
                                    response_buffer_size: int = 100) -> AsyncIterator[Any]:
        self.requests.append(request)
        self.buffer_sizes.append(response_buffer_size)
        return self._stream(request, self.hold)  # a later change of hold: the next stream's

    async def _stream(self, request: dict[str, Any],
                      hold: asyncio.Event | None) -> AsyncIterator[Any]:
        routing = request.get("routing") or {}
        worker = routing.get("backend_instance_id", A)
        rank = routing.get("dp_rank", 0)
        if worker in self.fail_before_first:
            raise self.fail_before_first[worker]
        budget = (request.get("stop_conditions") or {}).get("max_tokens")
        tokens = self.tokens if budget is None else min(self.tokens, budget)
        chunks = chunk_stream(worker, rank, len(request["token_ids"]), tokens)
        if self.end_without_finish:
            chunks = chunks[:-1]
        elif worker in self.end_without_finish_on:
            chunks = chunks[:1]  # one token, then the stream just ends
        if self.error_finish is not None:
            chunks = [{"token_ids": [], "finish_reason": {"error": self.error_finish},
                       "routing_data": chunks[0]["routing_data"]}]
        for index, chunk in enumerate(chunks):
            if index and self.token_delay:
                await asyncio.sleep(self.token_delay)
            yield chunk
            if index == 0:
                if hold is not None:
                    await hold.wait()
                if self.fail_after_first is not None:
                    raise self.fail_after_first
                if worker in self.fail_after_first_on:
                    raise self.fail_after_first_on[worker]
                if worker in self.hang_on:
                    try:
                        await asyncio.Event().wait()  # never set: only a cancel ends this
                    except asyncio.CancelledError:
                        self.cancelled_streams += 1
                        raise


class FakeClient:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def instance_ids(self) -> list[int]:
        return list(self.ids)

    def instances(self) -> list[Any]:
        """Dynamo's instance views: each worker's TCP request-plane address."""
        from types import SimpleNamespace

        return [SimpleNamespace(instance_id=i, transport=SimpleNamespace(
            kind="tcp", address=f"127.0.0.1:{4000 + i}/{i:x}/ta-workers/backend/generate"))
            for i in self.ids]


class FakeCards:
    def __init__(self, cards: dict[str, str]) -> None:
        self.cards = cards

    def get_model_cards(self) -> dict[str, str]:
        return dict(self.cards)


def model_card(blocks: int, block_size: int = 16) -> str:
    return json.dumps({"kv_cache_block_size": block_size,
                       "runtime_config": {"total_kv_blocks": blocks}})


class FakeContext:
    """The request context Dynamo passes to a handler: an id and a stop signal."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.stopped = asyncio.Event()
        self.killed = False

    def id(self) -> str:
        return self.request_id

    def is_stopped(self) -> bool:
        return self.stopped.is_set()

    def is_killed(self) -> bool:
        return self.killed

    def kill(self) -> None:
        """As Dynamo's frontend does when the client disconnects."""
        self.killed = True
        self.stopped.set()

    async def async_killed_or_stopped(self) -> bool:
        await self.stopped.wait()
        return True


class Harness:
    def __init__(self, blocks: int = 256, **params: Any) -> None:
        self.clock = FakeClock()
        self.classifier = ThunderAgentClassifier(ThunderAgentParameters(**params),
                                                 clock=self.clock)
        self.events: list[RequestEvent] = []
        learn = self.classifier.on_event

        def spy(event: RequestEvent) -> None:
            self.events.append(event)
            learn(event)

        self.classifier.on_event = spy  # type: ignore[method-assign]
        self.kv = FakeKvRouter()
        self.client = FakeClient([A, B])
        self.cards = FakeCards({str(A): model_card(blocks), str(B): model_card(blocks)})
        self.router = ThunderAgentRouter(
            self.classifier, ThunderAgentSelector(ThunderAgentSelectorParameters()), self.kv,
            self.client, self.cards, clock=self.clock)
        self.router.refresh_workers()

    def program(self, session: str) -> Any:
        return self.classifier.scheduler.table.programs[session]

    def events_of(self, request_id: str) -> list[RequestEvent]:
        return [e for e in self.events if e.request_id == request_id]


def turn(session: str | None, tokens: int = 10, final: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "token_ids": list(range(tokens)), "routing": {},
                            "stop_conditions": {"max_tokens": 3}}
    if session is not None:
        body["agent_context"] = {"session_id": session, "session_final": final}
    return body


async def collect(router: ThunderAgentRouter, request: dict[str, Any],
                  request_id: str) -> list[dict[str, Any]]:
    return [chunk async for chunk in router.generate(request, FakeContext(request_id))]


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let other tasks run until ``condition`` holds (bounded: no test hangs)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    pytest.fail(f"never happened: {what}")


# ---- admission and forwarding ----------------------------------------------------------
async def test_admitted_request_is_forwarded_pinned_to_the_selected_worker() -> None:
    h = Harness()
    request = turn("s", tokens=10)
    chunks = await collect(h.router, request, "r1")

    forwarded = h.kv.requests[0]
    assert forwarded["routing"] == {"backend_instance_id": A, "dp_rank": 0}
    assert request["routing"] == {}, "the frontend's request dict was modified"
    assert chunks[0]["engine_data"]["thunderagent"] == {"worker_id": A, "dp_rank": 0}
    assert all("engine_data" not in c for c in chunks[1:])
    assert chunks[-1]["finish_reason"] == "length"
    assert h.events_of("r1") == [Sent("r1", WorkerKey(A)), Responding("r1"),
                                 Completed("r1", 10 + 3, cached_tokens=0)]
    program = h.program("s")
    assert program.worker == WorkerKey(A) and program.phase is Phase.ACTING
    assert program.tokens == 13 and program.steps == 1
    assert h.router.in_flight == {} and h.router.stats.completed == 1


async def test_later_turns_stay_on_the_programs_worker_even_when_another_is_idler() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    h.kv.loads = {A: 5_000, B: 0}  # the KV router alone would pick B now
    await collect(h.router, turn("s", tokens=20), "r2")
    assert h.kv.requests[1]["routing"]["backend_instance_id"] == A
    assert h.program("s").steps == 2


async def test_a_turn_pinned_to_a_live_worker_skips_the_load_query() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")  # placed by the scheduler on a live worker
    await collect(h.router, turn("s", tokens=20), "r2")  # sticky and live
    assert h.kv.load_queries == 0
    h.cards.cards = {}  # no capacity known: the scheduler names no worker for a new
    h.router.refresh_workers()  # program, and the selector chooses from the KV router's loads
    h.kv.loads = {A: 5_000, B: 0}
    await collect(h.router, turn("t", tokens=30), "r3")
    assert h.kv.load_queries == 1
    assert h.kv.requests[2]["routing"]["backend_instance_id"] == B


async def slack_harness() -> Harness:
    """A router whose selector has a load slack of 0.5, after session "s"'s first turn on A."""
    h = Harness()
    h.router.selector = ThunderAgentSelector(
        ThunderAgentSelectorParameters(preferred_load_slack=0.5))
    await collect(h.router, turn("s"), "r1")
    assert h.program("s").worker == WorkerKey(A)
    return h


async def test_with_a_load_slack_a_turn_leaves_a_home_much_busier_than_another() -> None:
    h = await slack_harness()
    h.kv.loads = {A: 1_400, B: 1_000}  # within the slack: it stays where its cache is
    await collect(h.router, turn("s", tokens=20), "r2")
    assert h.kv.load_queries == 2  # the loads of every turn are read
    assert h.kv.requests[1]["routing"]["backend_instance_id"] == A
    h.kv.loads = {A: 1_600, B: 1_000}  # past it: the turn goes to B and the program with it
    await collect(h.router, turn("s", tokens=30), "r3")
    assert h.kv.requests[2]["routing"]["backend_instance_id"] == B
    assert h.program("s").worker == WorkerKey(B)
    assert h.classifier.scheduler.counters["moves"] == 1


async def test_with_a_load_slack_a_turn_never_leaves_for_a_pool_too_small_to_hold_it() -> None:
    # Workers of unequal pools: the least-loaded one (A, 1,024 tokens) cannot hold this
    # 2,000-token prompt (its engine would refuse it), so the turn stays home on B however
    # busy B is.
    h = Harness()
    h.cards.cards[str(A)] = model_card(64)  # 1,024 tokens; B: 4,096
    h.router.refresh_workers()
    h.router.selector = ThunderAgentSelector(
        ThunderAgentSelectorParameters(preferred_load_slack=0.5))
    await collect(h.router, turn("big", tokens=2_000), "r1")
    assert h.program("big").worker == WorkerKey(B)
    h.kv.loads = {A: 0, B: 5_000}  # far past the slack
    await collect(h.router, turn("big", tokens=2_100), "r2")
    assert h.kv.requests[1]["routing"]["backend_instance_id"] == B
    assert h.program("big").worker == WorkerKey(B)


async def test_with_a_load_slack_a_turn_goes_home_when_the_loads_cannot_be_weighed() -> None:
    h = await slack_harness()
    h.kv.loads = {B: 0}  # the KV router does not list the home rank
    await collect(h.router, turn("s", tokens=20), "r2")
    assert h.kv.requests[1]["routing"]["backend_instance_id"] == A

    async def broken(token_ids: list[int]) -> list[dict[str, int]]:
        raise RuntimeError("kv router unavailable")

    h.kv.get_potential_loads = broken  # type: ignore[method-assign]
    chunks = await collect(h.router, turn("s", tokens=30), "r3")
    assert h.kv.requests[2]["routing"]["backend_instance_id"] == A
    assert chunks[-1]["finish_reason"] == "length"  # served, not failed
    assert h.router.stats.loads_unavailable == 2
    assert h.program("s").worker == WorkerKey(A) and h.program("s").steps == 3


async def test_requests_without_a_session_pass_through_unpinned_and_untracked() -> None:
    h = Harness()
    request = turn(None)
    chunks = await collect(h.router, request, "r1")
    assert h.kv.requests == [request]  # forwarded as the frontend sent it
    assert chunks[-1]["finish_reason"] == "length"
    assert h.events == [] and h.classifier.scheduler.table.programs == {}
    assert h.router.stats.passthrough == 1 and h.kv.load_queries == 0


def disaggregated(h: Harness) -> None:
    """Worker A's card now says it only prefills (a disaggregated deployment's prefill
    worker, which answers a request with its first token alone); B decodes."""
    card = json.loads(h.cards.cards[str(A)])
    h.cards.cards[str(A)] = json.dumps({**card, "worker_type": "prefill"})
    h.cards.cards[str(B)] = json.dumps({**json.loads(h.cards.cards[str(B)]),
                                        "worker_type": "decode"})
    h.router.refresh_workers()


async def test_a_prefill_only_worker_is_never_a_requests_target() -> None:
    # Found live: behind ours, a mocker started with --disaggregation-mode prefill answered
    # requests without a session (the KV router picked it: it holds the prompts' cache)
    # with one token and finish "length"; stock's frontend prefilled there and decoded on
    # the decode worker. The router leaves such workers out: the others serve everything.
    h = Harness()
    disaggregated(h)
    h.kv.loads = {A: 0, B: 500}  # the KV router would rather pick A
    with capture_logs() as logs:
        h.router.refresh_workers()  # read again: said once, when the set changed
    assert [e for e in logs if e["event"] == "workers.prefill_only"] == []
    assert h.router.workers.live_ids() == {B}
    assert h.router.state()["prefill_only_workers"] == [A]
    assert set(h.classifier.scheduler.capacity.known) == {WorkerKey(B)}
    await collect(h.router, turn(None), "r1")  # no session
    await collect(h.router, turn("s"), "r2")  # a program's turn
    assert [r["routing"].get("backend_instance_id") for r in h.kv.requests] == [B, B]
    assert h.router.stats.completed == 1 and h.router.stats.passthrough == 1


async def test_a_prefill_only_worker_is_said_once_and_forgotten_when_it_decodes() -> None:
    h = Harness()
    with capture_logs() as logs:
        disaggregated(h)
    [said] = [e for e in logs if e["event"] == "workers.prefill_only"]
    assert said["instances"] == [A] and "sends them nothing" in said["effect"]
    h.cards.cards[str(A)] = model_card(256)  # restarted aggregated
    h.router.refresh_workers()
    assert h.router.workers.live_ids() == {A, B}
    assert h.router.state()["prefill_only_workers"] == []


async def test_a_request_without_a_session_holds_its_room_only_while_it_runs() -> None:
    h = Harness(sessionless_kv="reserve")
    scheduler = h.classifier.scheduler
    whole = scheduler.capacity.known[WorkerKey(A)]
    h.kv.hold = asyncio.Event()
    task = asyncio.create_task(collect(h.router, turn(None, tokens=40), "r1"))
    await until(lambda: scheduler.capacity.known[WorkerKey(A)] == whole - 40,
                "the chat's prompt is taken off the capacity of the worker serving it")
    assert h.events == [] and scheduler.table.programs == {}  # still no program's
    h.kv.hold.set()
    await asyncio.wait_for(task, 5)
    assert scheduler.capacity.known[WorkerKey(A)] == whole


async def test_a_request_without_a_session_that_fails_gives_its_room_back() -> None:
    h = Harness(sessionless_kv="reserve")
    scheduler = h.classifier.scheduler
    whole = scheduler.capacity.known[WorkerKey(A)]
    calls: list[tuple[str, ...]] = []
    started, ended = h.classifier.sessionless_started, h.classifier.sessionless_ended

    def spy_started(request_id: str, worker: WorkerKey, tokens: int) -> None:
        calls.append(("started", request_id, str(worker), str(tokens)))
        started(request_id, worker, tokens)

    def spy_ended(request_id: str) -> None:
        calls.append(("ended", request_id))
        ended(request_id)

    h.classifier.sessionless_started = spy_started  # type: ignore[method-assign]
    h.classifier.sessionless_ended = spy_ended  # type: ignore[method-assign]
    h.kv.fail_after_first = RuntimeError("worker died")
    with pytest.raises(RuntimeError):
        await collect(h.router, turn(None, tokens=40), "r1")
    # It failed on A, went on on B (failover), and failed there too.
    assert calls == [("started", "r1", str(WorkerKey(A)), "40"), ("ended", "r1"),
                     ("started", "r1", str(WorkerKey(B)), "40"), ("ended", "r1")]
    assert scheduler.capacity.known[WorkerKey(B)] == whole  # A is put aside for a while
    assert scheduler.snapshot(h.clock())["sessionless_tokens"] == {}


@pytest.mark.parametrize("ending", ["no_finish", "engine_error", "client_left"])
async def test_a_request_without_a_session_gives_its_room_back_however_it_ends(
        ending: str) -> None:
    h = Harness(sessionless_kv="reserve")
    scheduler = h.classifier.scheduler
    whole = scheduler.capacity.known[WorkerKey(A)]
    if ending == "no_finish":
        h.kv.end_without_finish = True
    elif ending == "engine_error":
        h.kv.error_finish = "out of blocks"
    else:
        h.kv.hold = asyncio.Event()
    stream = h.router.generate(turn(None, tokens=40), FakeContext("r1"))
    if ending == "client_left":
        await stream.__anext__()
        assert scheduler.capacity.known[WorkerKey(A)] == whole - 40
        await stream.aclose()  # the client went away mid-stream
    else:
        with contextlib.suppress(Exception):
            async for _ in stream:
                pass
    # (A stream cut without a finish puts its worker aside for a while: every rank left.)
    assert set(scheduler.capacity.known.values()) == {whole}
    assert scheduler.snapshot(h.clock())["sessionless_tokens"] == {}


async def test_a_turn_run_alongside_is_not_taken_for_sessionless_traffic() -> None:
    h = Harness(concurrent_turns="alongside", sessionless_kv="reserve")
    scheduler = h.classifier.scheduler
    h.kv.hold = asyncio.Event()
    first = asyncio.create_task(collect(h.router, turn("s"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the first turn is forwarded")
    second = asyncio.create_task(collect(h.router, turn("s", tokens=14), "r2"))
    await until(lambda: len(h.kv.requests) == 2, "the second turn is forwarded alongside")
    assert scheduler.snapshot(h.clock())["sessionless_tokens"] == {}  # its session's room
    h.kv.hold.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)


async def test_a_concurrent_turn_runs_alongside_on_its_sessions_worker_untracked() -> None:
    h = Harness(concurrent_turns="alongside")
    h.kv.hold = asyncio.Event()
    first = asyncio.create_task(collect(h.router, turn("s"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the first turn is forwarded")
    second = asyncio.create_task(collect(h.router, turn("s", tokens=14), "r2"))
    await until(lambda: len(h.kv.requests) == 2, "the second turn is forwarded alongside")
    # Pinned where the running turn is: the prompt they share is cached there.
    assert h.kv.requests[1]["routing"] == h.kv.requests[0]["routing"] == {
        "backend_instance_id": A, "dp_rank": 0}
    h.kv.hold.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert h.events_of("r2") == [] and h.router.stats.passthrough == 1
    assert h.program("s").steps == 1 and h.router.in_flight == {}
    assert h.classifier.scheduler.counters["alongside"] == 1
    assert len(h.router.stats.admission_wait_s) == 2  # a session's turn: its wait counts


# ---- deferral and rejection ------------------------------------------------------------
async def test_a_second_turn_of_a_session_waits_for_the_first_to_complete() -> None:
    h = Harness()
    h.kv.hold = asyncio.Event()
    first = asyncio.create_task(collect(h.router, turn("s"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the first turn is forwarded")
    second = asyncio.create_task(collect(h.router, turn("s", tokens=14), "r2"))
    await until(lambda: len(h.program("s").waiting) == 1, "the second turn queues")
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(h.kv.requests) == 1 and not second.done()

    h.kv.hold.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert len(h.kv.requests) == 2
    order = [type(e).__name__ + ":" + e.request_id for e in h.events
             if isinstance(e, (Sent, Completed))]
    assert order == ["Sent:r1", "Completed:r1", "Sent:r2", "Completed:r2"]


async def _small_waits_behind_big(tau: float) -> tuple[Harness, asyncio.Task[Any]]:
    """One worker of 160 tokens (usage may reach 152, 0.95; resumes below 136, 0.85): "big"
    ran a turn and is ACTING with 123 tokens; "small"'s first turn (100) waits for room."""
    h = Harness(blocks=10, buffer_per_program=0, acting_decay_tau_seconds=tau)
    h.client.ids = [A]
    h.cards.cards = {str(A): model_card(10)}
    h.kv.loads = {A: 0}
    h.router.refresh_workers()
    await collect(h.router, turn("big", tokens=120), "r1")
    waiting = asyncio.create_task(collect(h.router, turn("small", tokens=100), "r2"))
    await until(lambda: "small" in h.classifier.scheduler.table.programs, "admission ran")
    return h, waiting


async def test_a_new_program_without_room_is_deferred_until_a_tick_resumes_it() -> None:
    h, waiting = await _small_waits_behind_big(tau=1.0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done() and len(h.kv.requests) == 1
    assert h.program("small").lifecycle is Lifecycle.PAUSED

    h.clock.now += 30  # the big program's tool has run long: its ACTING tokens decayed
    router = h.router.state()["router"]  # a wait in progress is reported, censored
    assert (router["admission_waiting"], router["admission_wait_censored_max_s"]) == (1, 30)
    h.classifier.tick()
    chunks = await asyncio.wait_for(waiting, 5)
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[1]["routing"]["backend_instance_id"] == A
    assert h.program("small").resumes == 1
    assert h.router.stats.admission_wait_s[-1] == 30
    router = h.router.state()["router"]
    assert router["admission_waiting"] == 0 and router["admission_wait_censored_max_s"] is None
    assert router["admission_wait_max_s"] == 30


async def test_a_wait_its_client_gave_up_on_stays_censored_after_it_ends() -> None:
    h, waiting = await _small_waits_behind_big(tau=1e9)  # "big" keeps its room
    h.clock.now += 12
    waiting.cancel()  # the client leaves, as a benchmark's do when its window closes
    with pytest.raises(asyncio.CancelledError):
        await waiting
    router = h.router.state()["router"]
    assert router["admission_waiting"] == 0 and router["cancelled"] == 1
    assert router["admission_wait_censored_max_s"] == 12  # a lower bound, not lost
    assert router["admission_wait_max_s"] == 0  # the only admitted turn did not wait


async def test_rejected_request_raises_an_error_that_says_why() -> None:
    h = Harness(max_tracked_requests=1)
    h.kv.hold = asyncio.Event()
    holder = asyncio.create_task(collect(h.router, turn("holder"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the holder is forwarded")

    with pytest.raises(Exception, match=r"max_tracked_requests=1") as rejected:
        await collect(h.router, turn("other"), "r2")
    assert "rejected request r2" in str(rejected.value)
    assert h.router.stats.rejected == 1 and len(h.kv.requests) == 1
    assert "other" not in h.classifier.scheduler.table.programs

    h.kv.hold.set()
    await asyncio.wait_for(holder, 5)


# ---- session final ---------------------------------------------------------------------
async def test_session_final_yields_one_chunk_and_never_touches_the_kv_router() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    forwarded, queries = len(h.kv.requests), h.kv.load_queries

    chunks = await collect(h.router, turn("s", tokens=4, final=True), "r2")
    assert len(h.router.stats.admission_wait_s) == 1  # the turn's wait; a final has none
    assert len(chunks) == 1 and chunks[0]["finish_reason"] == "stop"
    assert chunks[0]["token_ids"] == []
    assert (len(h.kv.requests), h.kv.load_queries) == (forwarded, queries)
    assert "s" not in h.classifier.scheduler.table.programs
    assert h.events_of("r2") == [] and h.router.stats.session_final == 1


# ---- failures, disconnects, cancellation -----------------------------------------------
async def test_an_error_from_the_kv_stream_aborts_once_and_the_program_is_acting_again() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    h.kv.fail_after_first = ConnectionError("worker went away")

    with pytest.raises(RuntimeError, match="worker went away"):  # a 500 that says what failed
        await collect(h.router, turn("s", tokens=20), "r2")
    terminal = [e for e in h.events_of("r2") if isinstance(e, (Aborted, Completed))]
    assert len(terminal) == 1 and isinstance(terminal[0], Aborted)
    assert "worker went away" in terminal[0].reason
    program = h.program("s")
    assert program.phase is Phase.ACTING and program.lifecycle is Lifecycle.ACTIVE
    assert program.current is None and h.classifier.scheduler.table.requests == {}
    assert h.router.stats.errors == 1 and h.router.stats.aborted == 1
    assert h.router.in_flight == {}

    h.kv.fail_after_first = None  # the session carries on
    await collect(h.router, turn("s", tokens=30), "r3")
    assert h.program("s").steps == 2


async def test_a_worker_that_fails_before_its_first_chunk_is_avoided_until_discovery_catches_up(
) -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    home = h.program("s").worker.worker_id
    other = B if home == A else A
    h.kv.fail_before_first[home] = ConnectionError("connection refused")
    chunks = await collect(h.router, turn("s"), "r2")  # served by the other worker
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[-1]["routing"]["backend_instance_id"] == other
    assert h.router.state()["unreachable_workers"] == [home]
    # Discovery still lists the dead worker, but the next turn stays on the other one.
    await collect(h.router, turn("s"), "r3")
    assert h.kv.requests[-1]["routing"]["backend_instance_id"] == other
    assert h.program("s").worker.worker_id == other and h.program("s").steps == 3
    h.clock.now += 16  # the quarantine ends; the worker is back if discovery still lists it
    h.router.refresh_workers()
    assert h.router.state()["unreachable_workers"] == []


async def test_a_turn_whose_worker_fails_mid_stream_goes_on_on_another_worker() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    assert h.program("s").worker == WorkerKey(A)
    h.kv.fail_after_first_on[A] = ConnectionError("worker went away")
    learned: list[Any] = []
    h.classifier.observe_turn = learned.append  # type: ignore[method-assign]
    request = turn("s", tokens=20)
    chunks = await collect(h.router, request, "r2")
    assert learned == []  # a turn split over two workers says nothing of an engine's costs

    # The client sees one stream: the token A sent, then B's two, then B's finish.
    assert [t for c in chunks for t in c["token_ids"]] == [1000, 1000, 1001]
    assert chunks[-1]["finish_reason"] == "length"
    assert chunks[-1]["completion_usage"]["prompt_tokens"] == 20  # the client's prompt
    assert chunks[-1]["completion_usage"]["completion_tokens"] == 3
    assert chunks[1]["engine_data"]["thunderagent"] == {"worker_id": B, "dp_rank": 0}
    # B was asked for the prompt plus what A had streamed, for what was left of the budget.
    continued = h.kv.requests[-1]
    assert continued["token_ids"] == [*range(20), 1000]
    assert continued["stop_conditions"] == {"max_tokens": 2}
    assert continued["routing"] == {"backend_instance_id": B, "dp_rank": 0}
    assert request["token_ids"] == list(range(20)), "the frontend's request was modified"
    # The scheduler followed the program to B and the turn completed once.
    assert h.events_of("r2") == [Sent("r2", WorkerKey(A)), Responding("r2"),
                                 Sent("r2", WorkerKey(B)),
                                 Completed("r2", 20 + 3, cached_tokens=0)]
    assert h.program("s").worker == WorkerKey(B) and h.program("s").steps == 2
    assert h.router.state()["unreachable_workers"] == [A]
    stats = h.router.stats
    assert (stats.failovers, stats.errors, stats.completed, stats.aborted) == (1, 0, 2, 0)
    assert h.router.state()["router"]["failovers"] == 1
    assert h.router.in_flight == {} and h.classifier.scheduler.table.requests == {}


async def test_a_turn_fails_over_at_most_the_limit_and_then_fails_with_its_error() -> None:
    h = three_workers(44)  # a fourth worker: one is left when the limit stops the turn
    await collect(h.router, turn("s"), "r1")
    for worker in (A, B, C, 44):  # not lost workers (none put aside), each its own error
        h.kv.fail_after_first_on[worker] = RuntimeError(f"worker {worker} went away")
    h.kv.tokens = 10
    turn_request = turn("s", tokens=20)
    turn_request["stop_conditions"] = {"max_tokens": 10}
    with pytest.raises(RuntimeError, match="went away"):
        await collect(h.router, turn_request, "r2")
    assert len(h.kv.requests) == 2 + FAILOVER_LIMIT  # r1, then r2 and its failovers
    assert h.router.stats.failovers == FAILOVER_LIMIT and h.router.stats.errors == 1
    terminal = [e for e in h.events_of("r2") if isinstance(e, (Aborted, Completed))]
    assert len(terminal) == 1 and isinstance(terminal[0], Aborted)
    assert h.program("s").phase is Phase.ACTING and h.program("s").current is None


async def test_the_only_live_worker_is_not_avoided_after_a_failure() -> None:
    h = Harness()
    h.client.ids = [A]
    h.router.refresh_workers()
    h.kv.fail_after_first_on[A] = ConnectionError("blip")
    with pytest.raises(RuntimeError, match="blip"):  # nowhere else to go
        await collect(h.router, turn("s"), "r1")
    assert h.router.stats.failovers == 0
    assert h.router.state()["unreachable_workers"] == []  # or nothing could be served
    del h.kv.fail_after_first_on[A]
    chunks = await collect(h.router, turn("s"), "r2")
    assert chunks[-1]["finish_reason"] == "length"


def three_workers(*more: int) -> Harness:
    """A harness whose router sees workers A, B, C and any ``more``, all alike."""
    h = Harness()
    for worker in (C, *more):
        h.client.ids.append(worker)
        h.cards.cards[str(worker)] = model_card(256)
        h.kv.loads[worker] = 0
    h.router.refresh_workers()
    return h


async def test_an_error_after_the_finish_is_not_the_clients_nor_a_failover() -> None:
    h = Harness()
    h.kv.tokens = 0  # the first chunk is the finish; the stream then breaks
    h.kv.fail_after_first_on[A] = ConnectionError("connection reset")
    chunks = await collect(h.router, turn("s"), "r1")
    assert chunks[-1]["finish_reason"] == "length"
    stats = h.router.stats
    assert (stats.completed, stats.errors, stats.failovers) == (1, 0, 0)


async def test_a_stream_cut_twice_still_moves_up_to_the_limit() -> None:
    h = three_workers()
    h.kv.end_without_finish_on.update({A, B})  # two workers drained in turn
    request = turn("s", tokens=20)
    request["stop_conditions"] = {"max_tokens": 3}
    chunks = await collect(h.router, request, "r1")
    assert [t for c in chunks for t in c["token_ids"]] == [1000, 1000, 1000]
    assert chunks[-1]["finish_reason"] == "length" and h.router.stats.failovers == 2


async def test_a_stream_cut_without_a_finish_goes_on_on_another_worker() -> None:
    h = Harness()
    h.kv.end_without_finish_on.add(A)
    chunks = await collect(h.router, turn("s", tokens=20), "r1")
    assert [t for c in chunks for t in c["token_ids"]] == [1000, 1000, 1001]
    assert chunks[-1]["finish_reason"] == "length"
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Sent, Completed]
    # Whatever the engine's usage said on each chunk, it is the client's prompt.
    assert {c["completion_usage"]["prompt_tokens"] for c in chunks
            if "completion_usage" in c} == {20}
    assert h.router.state()["unreachable_workers"] == []  # a cut is not a dead worker


async def test_an_error_that_is_not_the_workers_fails_over_once_without_avoiding_it() -> None:
    h = three_workers()
    h.kv.fail_after_first_on[A] = RuntimeError("engine hiccup")
    chunks = await collect(h.router, turn("s", tokens=20), "r1")
    assert chunks[-1]["finish_reason"] == "length"
    assert h.router.state()["unreachable_workers"] == []  # not a lost worker: not avoided
    # The same error on the next worker too: the request's own fault, no third try.
    for worker in (A, B, C):
        h.kv.fail_after_first_on[worker] = RuntimeError("bad request")
    sent = len(h.kv.requests)
    with pytest.raises(RuntimeError, match="bad request"):
        await collect(h.router, turn("t", tokens=20), "r2")
    assert len(h.kv.requests) == sent + 2 and h.router.stats.failovers == 2


async def test_refusals_and_our_own_errors_are_not_failed_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo_thunderagent.dynamo import router as router_module

    h = Harness()

    class InvalidArgument(Exception):  # Dynamo's class, by name
        pass

    h.kv.fail_after_first_on[A] = InvalidArgument("bad sampling options")
    # A refusal reaches the client as one (Dynamo's InvalidArgument: a 400 with the reason),
    # not as a 500 whose message the frontend replaces.
    with pytest.raises(Exception, match="refused at worker 11/0: bad sampling options") as no:
        await collect(h.router, turn("s"), "r1")
    assert type(no.value).__name__ == "InvalidArgument"
    assert len(h.kv.requests) == 1
    # The same refusal as the binding passes it when the stream is read on demand (the
    # router's DEMAND_DRIVEN): a plain ValueError whose text starts with the wire's kind.
    h.kv.fail_after_first_on[A] = ValueError("InvalidRequest: bad sampling options")
    with pytest.raises(Exception, match="refused at worker 11/0: bad sampling options") as no:
        await collect(h.router, turn("u"), "r0")
    assert type(no.value).__name__ == "InvalidArgument"
    assert len(h.kv.requests) == 2 and h.router.stats.failovers == 0
    del h.kv.fail_after_first_on[A]

    def broken(*args: Any) -> None:  # a bug on our side while the worker is fine
        raise KeyError("ours")

    monkeypatch.setattr(router_module, "for_frontend", broken)
    with pytest.raises(RuntimeError, match="ours"):
        await collect(h.router, turn("t"), "r2")
    assert len(h.kv.requests) == 3 and h.router.stats.failovers == 0
    assert h.router.state()["unreachable_workers"] == []


async def test_no_failover_for_a_client_that_has_left() -> None:
    h = Harness()
    h.kv.hold = asyncio.Event()
    h.kv.fail_after_first_on[A] = ConnectionError("worker went away")
    context = FakeContext("r1")
    stream = h.router.generate(turn("s"), context)
    await stream.__anext__()  # the first token; the worker is held there
    context.stopped.set()  # the client leaves, then the worker fails
    h.kv.hold.set()
    with pytest.raises(RuntimeError, match="went away"):
        await stream.__anext__()
    assert len(h.kv.requests) == 1 and h.router.stats.failovers == 0
    assert h.router.in_flight == {} and h.classifier.scheduler.table.requests == {}
    # The worker is lost all the same: the next turns are not sent to it.
    assert h.router.state()["unreachable_workers"] == [A]


async def test_a_cut_stream_of_a_client_that_has_left_ends_quietly() -> None:
    # Short of its budget and not carried on (the client left): an abort, not an error for
    # nobody (before the review's fix it counted as one, with a request.failed warning).
    h = Harness()
    h.kv.hold = asyncio.Event()
    h.kv.tokens = 20
    h.kv.end_without_finish_on.add(A)
    request = turn("s")
    request["stop_conditions"] = {"max_tokens": 20}
    context = FakeContext("r1")
    stream = h.router.generate(request, context)
    await stream.__anext__()
    context.stopped.set()  # the client leaves, then the worker's stream just ends
    h.kv.hold.set()
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert (h.router.stats.aborted, h.router.stats.errors, h.router.stats.failovers) == (
        1, 0, 0)
    assert h.router.in_flight == {} and h.classifier.scheduler.table.requests == {}


async def test_a_refusal_mid_stream_of_a_request_the_kv_router_placed_names_its_worker() -> None:
    h = Harness()

    class InvalidArgument(Exception):  # Dynamo's class, by name
        pass

    h.kv.fail_after_first_on[A] = InvalidArgument("bad stop sequence")
    with pytest.raises(Exception, match="refused at worker 11/0: bad stop sequence"):
        await collect(h.router, turn(None), "r1")  # it said "at routing"


async def test_a_refusal_before_the_first_chunk_of_a_request_the_kv_router_placed() -> None:
    # The worker is not known (no chunk named it): the 400 gives the reason and blames no
    # one (before: "refused at routing", for an engine's refusal; found by a probe).
    h = Harness()

    class InvalidArgument(Exception):  # Dynamo's class, by name
        pass

    h.kv.fail_before_first[A] = InvalidArgument("max_output_tokens must be specified")
    with pytest.raises(Exception) as refused:
        await collect(h.router, turn(None), "r1")
    assert str(refused.value) == "request r1 was refused: max_output_tokens must be specified"
    assert h.router.stats.failovers == 0


async def test_a_request_a_worker_never_took_goes_elsewhere_and_puts_it_aside() -> None:
    h = Harness()  # a stopped worker: its TCP server never acknowledges the request
    h.kv.fail_before_first[A] = Exception("DeadlineExceeded: TCP request to 127.0.0.1:1 timed out")
    chunks = await collect(h.router, turn("s"), "r1")
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[-1]["routing"] == {"backend_instance_id": B, "dp_rank": 0}
    assert h.router.state()["unreachable_workers"] == [A] and h.router.stats.failovers == 1


async def test_a_request_the_kv_router_placed_goes_elsewhere_when_its_worker_is_lost() -> None:
    # No session id: the KV router picks the worker (the fake's pick: A), so the router
    # learns which one failed from the address Dynamo's error names.
    h = Harness()
    h.kv.fail_before_first[A] = Exception(f"Unavailable: TCP connection to 127.0.0.1:{4000 + A} "
                                          "failed")
    chunks = await collect(h.router, turn(None), "r1")
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[-1]["routing"] == {"backend_instance_id": B, "dp_rank": 0}
    assert h.router.stats.failovers == 1 and h.router.state()["unreachable_workers"] == [A]


async def test_a_workers_refusal_before_its_first_chunk_does_not_put_it_aside() -> None:
    # Hostile input must not take a healthy worker out of rotation: Dynamo 1.6.1 passes a
    # worker's own refusal (a grammar that does not parse) as "Unavailable: " text.
    h = Harness()
    h.kv.fail_before_first[A] = Exception(
        'Unavailable: BackendInvalidArgument: {"message": "bad grammar", "code": 400}')
    # The client gets the worker's own reason with a 400, as stock Dynamo gives it.
    with pytest.raises(Exception, match=r"refused at worker 11/0: bad grammar$") as no:
        await collect(h.router, turn("s"), "r1")
    assert type(no.value).__name__ == "InvalidArgument"
    assert h.router.state()["unreachable_workers"] == []
    assert len(h.kv.requests) == 1 and h.router.stats.failovers == 0


async def test_an_error_a_live_worker_sends_itself_does_not_put_workers_aside() -> None:
    # A request every worker's handler fails on (say, more log-probabilities than it
    # allows): Dynamo 1.6.1 passes the error on as "Unavailable: BackendUnknown: ...".
    # Before, that read as a lost worker: the turn moved to a second worker, failed there
    # too, and both were put aside for 15 s (their programs moved, their caches lost).
    h = three_workers()
    for worker in (A, B, C):
        h.kv.fail_before_first[worker] = Exception(
            "Unavailable: BackendUnknown: ValueError: requested 50 logprobs, max 20")
    with pytest.raises(RuntimeError, match="requested 50 logprobs"):
        await collect(h.router, turn("s"), "r1")
    assert h.router.state()["unreachable_workers"] == []
    assert h.router.stats.failovers == 1  # once, then the same error: the request's fault
    # An engine gone behind a live worker still puts that worker aside.
    h.kv.fail_before_first = {A: Exception(
        "Unavailable: BackendEngineShutdown: the engine has stopped")}
    chunks = await collect(h.router, turn("t"), "r2")
    assert chunks[-1]["finish_reason"] == "length"
    assert h.router.state()["unreachable_workers"] == [A]


async def test_a_failed_search_for_another_worker_keeps_the_workers_error() -> None:
    h = Harness()
    h.kv.fail_after_first_on[A] = ConnectionError("worker went away")

    async def broken(token_ids: list[int]) -> list[dict[str, int]]:
        raise OSError("kv router down")

    h.kv.get_potential_loads = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="went away"):
        await collect(h.router, turn("s"), "r1")
    assert h.router.stats.failovers == 0 and h.router.stats.errors == 1


@pytest.mark.parametrize("field", ["guided_decoding", "max_thinking_tokens", "n",
                                   "prompt_logprobs"])
async def test_output_that_cannot_resume_midway_fails_over_only_before_its_first_token(
        field: str) -> None:
    h = three_workers()
    request = turn("s", tokens=20)
    if field == "guided_decoding":
        request["sampling_options"] = {"guided_decoding": {"json": {"type": "object"}}}
    elif field == "n":
        request["sampling_options"] = {"n": 2}
    elif field == "prompt_logprobs":
        request["output_options"] = {"prompt_logprobs": 1}
    else:
        request["stop_conditions"] = {"max_tokens": 3, "max_thinking_tokens": 100}
    h.kv.fail_before_first[A] = RuntimeError("refused")  # not a lost worker: A stays in
    chunks = await collect(h.router, request, "r1")  # nothing streamed yet: it goes on
    assert chunks[-1]["finish_reason"] == "length" and h.router.stats.failovers == 1
    h.kv.fail_before_first.clear()
    h.kv.fail_after_first_on[B] = RuntimeError("hiccup")  # s lives on B now; A and C live
    sent = len(h.kv.requests)
    with pytest.raises(RuntimeError, match="hiccup"):
        await collect(h.router, request, "r2")
    assert len(h.kv.requests) == sent + 1 and h.router.stats.failovers == 1


async def test_failovers_from_one_worker_spread_over_the_others() -> None:
    from dynamo_thunderagent.dynamo.failover import Continuation
    from dynamo_thunderagent.dynamo.translate import StreamTracker

    h = three_workers()
    picks = []
    continuations = []
    for rid in ("r1", "r2"):
        tracker = StreamTracker(rid, 10)
        tracker.sent_to = WorkerKey(A)
        continuation = Continuation(turn(None))
        moved = await h.router._fail_over(ConnectionError("gone"), continuation, tracker,
                                          WorkerKey(A), None, None)
        assert moved is not None
        picks.append(moved[1])
        continuations.append(continuation)
    # The KV router has not counted the first yet: the second goes elsewhere.
    assert picks == [WorkerKey(B), WorkerKey(C)]
    for continuation in continuations:
        h.router._landed(continuation)
    assert h.router._pending_failovers == {}


async def test_a_request_without_a_session_fails_over_and_its_room_follows_it() -> None:
    h = Harness(sessionless_kv="reserve")
    scheduler = h.classifier.scheduler
    h.kv.fail_after_first_on[A] = ConnectionError("worker went away")
    chunks = await collect(h.router, turn(None, tokens=40), "r1")
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[-1]["routing"] == {"backend_instance_id": B, "dp_rank": 0}
    assert h.router.stats.failovers == 1 and h.router.stats.passthrough == 1
    assert scheduler.snapshot(h.clock())["sessionless_tokens"] == {}
    assert scheduler.capacity.known[WorkerKey(B)] == scheduler.capacity.largest


async def hung_on_a(h: Harness, request_id: str, **request: Any) -> asyncio.Task[Any]:
    """A turn of session "s" (at home on A) whose first token came and whose worker A then
    hangs; it is waiting on A when this returns."""
    await collect(h.router, turn("s"), "r0")
    assert h.program("s").worker == WorkerKey(A)
    h.kv.hang_on.add(A)
    task = asyncio.create_task(collect(h.router, {**turn("s", tokens=20), **request},
                                       request_id))
    await until(lambda: any(w.pending is not None and w.tracker.generated_tokens
                            for w in h.router.stalls.streams.values()), "the turn to hang on A")
    return task


async def test_a_stream_stalled_on_a_worker_that_left_goes_on_on_another_worker() -> None:
    h = Harness()
    task = await hung_on_a(h, "r1")
    assert h.router.cut_stalled_streams() == 0  # A is still listed: nothing to cut
    h.clock.now += 60
    assert h.router.cut_stalled_streams() == 0

    h.client.ids = [B]  # discovery drops the hung worker
    h.router.refresh_workers()
    assert h.router.cut_stalled_streams() == 0  # seen gone now: it may still stream
    h.clock.now += 4.9
    assert h.router.cut_stalled_streams() == 0
    h.clock.now += 0.1
    assert h.router.cut_stalled_streams() == 1
    chunks = await asyncio.wait_for(task, 5)

    assert [t for c in chunks for t in c["token_ids"]] == [1000, 1000, 1001]
    assert chunks[-1]["finish_reason"] == "length"
    continued = h.kv.requests[-1]
    assert continued["token_ids"] == [*range(20), 1000]
    assert continued["routing"] == {"backend_instance_id": B, "dp_rank": 0}
    assert h.events_of("r1") == [Sent("r1", WorkerKey(A)), Responding("r1"),
                                 Sent("r1", WorkerKey(B)),
                                 Completed("r1", 20 + 3, cached_tokens=0)]
    stats = h.router.stats
    assert (stats.stalled, stats.failovers, stats.errors, stats.aborted) == (1, 1, 0, 0)
    assert h.router.state()["router"]["stalled"] == 1
    assert h.router.stalls.streams == {} and h.router.in_flight == {}
    assert h.router.cut_stalled_streams() == 0
    assert task.cancelling() == 0  # the cut left no cancellation behind


async def test_a_stream_stalled_on_a_worker_that_left_with_nowhere_to_go_fails_with_why() -> None:
    h = Harness()
    task = await hung_on_a(h, "r1")
    h.client.ids = []
    h.router.refresh_workers()
    h.router.cut_stalled_streams()
    h.clock.now += 5
    assert h.router.cut_stalled_streams() == 1
    with pytest.raises(RuntimeError, match="WorkerLeft: worker 11 left discovery"):
        await asyncio.wait_for(task, 5)  # an error that says why, not a hang
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Aborted]
    assert h.router.stalls.streams == {} and h.router.in_flight == {}


async def test_a_stalled_request_without_a_session_is_cut_on_the_worker_its_chunk_named() -> None:
    h = Harness()
    h.kv.hang_on.add(A)  # the KV router's own pick (the fake's: A), known from the first chunk
    task = asyncio.create_task(collect(h.router, turn(None), "r1"))
    await until(lambda: any(w.worker_id == A and w.pending is not None
                            for w in h.router.stalls.streams.values()), "the request to hang")
    h.client.ids = [B]
    h.router.refresh_workers()
    h.router.cut_stalled_streams()
    h.clock.now += 5
    assert h.router.cut_stalled_streams() == 1
    chunks = await asyncio.wait_for(task, 5)
    assert chunks[-1]["finish_reason"] == "length"
    assert h.kv.requests[-1]["routing"] == {"backend_instance_id": B, "dp_rank": 0}


async def test_a_client_cancel_that_meets_the_cut_is_still_a_cancel() -> None:
    h = Harness()
    task = await hung_on_a(h, "r1")
    h.client.ids = [B]
    h.router.refresh_workers()
    h.router.cut_stalled_streams()
    h.clock.now += 5
    assert h.router.cut_stalled_streams() == 1
    task.cancel()  # the handler's own task, before it saw the cut
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Aborted]
    assert h.router.stats.failovers == 0
    assert h.router.stalls.streams == {} and h.router.in_flight == {}


async def test_a_cancel_that_is_not_the_stall_watchs_still_ends_the_request() -> None:
    h = Harness()
    task = await hung_on_a(h, "r1")
    task.cancel()  # as when the handler's task is cancelled mid-stream
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Aborted]
    assert h.router.stats.failovers == 0 and h.router.stats.stalled == 0
    assert h.router.stalls.streams == {} and h.router.in_flight == {}


@pytest.mark.parametrize("how", ["killed", "stopped"])
async def test_a_client_that_leaves_while_its_worker_sends_nothing_ends_the_turn(
        how: str) -> None:
    # Dynamo signals a client's leaving through the context and cancels nothing of a
    # handler waiting for a chunk: before this, a silent worker kept the turn in flight
    # for ever, its session's final and (queued) next turns behind it.
    h = Harness(concurrent_turns="queue")
    await collect(h.router, turn("s"), "r0")
    h.kv.hang_on.add(A)
    context = FakeContext("r1")
    task = asyncio.create_task(
        _drain(h.router.generate(turn("s", tokens=20), context)))
    await until(lambda: any(w.pending is not None and w.tracker.generated_tokens
                            for w in h.router.stalls.streams.values()), "the turn to hang on A")
    if how == "killed":
        context.kill()  # a client that disconnects: cut at once
    else:
        context.stopped.set()  # stopped only: the stall watch cuts it once it is silent
        await until(lambda: all(w.client_stopped for w in h.router.stalls.streams.values()),
                    "the stop to be seen")
        assert h.router.cut_stalled_streams() == 0  # first seen silent
        h.clock.now += STALL_SECONDS
        assert h.router.cut_stalled_streams() == 0  # cut for the client, not its worker
    chunks = await asyncio.wait_for(task, 5)
    assert len(chunks) == 1  # the token that came; no error for nobody
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Aborted]
    assert h.kv.cancelled_streams == 1  # the worker's stream was let go
    # ...read on demand, so that letting it go drops it and cancels the worker's request
    # (with Dynamo's read-ahead, the default, a silent worker's stream was kept for ever
    # and the worker never told: tests/e2e/test_faults.py checks the worker's side)
    assert h.kv.buffer_sizes == [DEMAND_DRIVEN] * 2 and DEMAND_DRIVEN == 0
    assert h.router.in_flight == {} and h.router.stalls.streams == {}
    assert (h.router.stats.aborted, h.router.stats.errors) == (1, 0)
    h.kv.hang_on.clear()  # the session goes on: its next turn and its final are served
    assert (await collect(h.router, turn("s", tokens=30), "r2"))[-1]["finish_reason"] == "length"
    await collect(h.router, turn("s", final=True), "r3")
    assert "s" not in h.classifier.scheduler.table.programs


async def test_a_turn_the_frontend_ends_at_a_stop_string_is_a_completed_turn() -> None:
    # Dynamo's frontend matches stop strings in the text and then drops the stream (killing
    # the request) just as for a client that leaves; the client gets a 200 with finish
    # "stop". Before, the router counted such a turn aborted: the program kept its tokens
    # from before the turn, and a first turn's program was rolled back out of the table, so
    # an agent whose turns end at stop strings was never tracked (a hostile-input probe:
    # hit rate 0.46-0.50 against stock's 0.73).
    h = Harness()
    h.kv.hang_on.add(A)  # the worker would go on; the frontend has what it needs
    request = turn("s", tokens=10)
    request["stop_conditions"] = {"max_tokens": 50, "stop": ["Observation:"]}
    context = FakeContext("r1")
    task = asyncio.create_task(_drain(h.router.generate(request, context)))
    await until(lambda: any(w.pending is not None and w.tracker.generated_tokens
                            for w in h.router.stalls.streams.values()), "a token from A")
    context.kill()
    chunks = await asyncio.wait_for(task, 5)
    assert len(chunks) == 1
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Completed]
    assert (h.router.stats.completed, h.router.stats.aborted) == (1, 0)
    program = h.classifier.scheduler.table.programs["s"]
    assert program.tokens == 10 + 1 and program.steps == 1  # prompt + the token sent
    # Without stop strings the same cut is a client that left: aborted, as before, and the
    # new program it made is rolled back.
    context = FakeContext("r2")
    task = asyncio.create_task(_drain(h.router.generate(turn("t", tokens=10), context)))
    await until(lambda: any(w.pending is not None and w.tracker.generated_tokens
                            for w in h.router.stalls.streams.values()), "a token for t")
    context.kill()
    await asyncio.wait_for(task, 5)
    assert [type(e) for e in h.events_of("r2")][-1] is Aborted
    assert "t" not in h.classifier.scheduler.table.programs


async def test_a_stopped_request_whose_worker_still_streams_finishes_its_turn() -> None:
    # Stopped, not killed, and its worker still sending: the read is never cut for
    # silence (each check finds new tokens), and the turn ends as it would have.
    h = Harness()
    h.kv.tokens, h.kv.token_delay = 30, 0.005  # a token every 5 ms, 150 ms in all
    request = turn("s", tokens=10)
    request["stop_conditions"] = {"max_tokens": 30}
    context = FakeContext("r1")
    stream = h.router.generate(request, context)
    chunks = [await stream.__anext__()]
    context.stopped.set()

    async def watch() -> None:  # the stall watch's clock runs a second a millisecond
        while True:
            await asyncio.sleep(0.001)
            h.clock.now += 1.0
            h.router.cut_stalled_streams()

    watcher = asyncio.create_task(watch())
    try:
        chunks += [chunk async for chunk in stream]
    finally:
        watcher.cancel()
    assert sum(len(c["token_ids"]) for c in chunks) == 30
    assert chunks[-1]["finish_reason"] == "length"
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Completed]


async def test_a_stream_that_ends_without_a_finish_reason_is_aborted() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    h.kv.end_without_finish = True
    await collect(h.router, turn("s"), "r2")
    assert [type(e) for e in h.events_of("r2")] == [Sent, Responding, Aborted]
    assert h.program("s").phase is Phase.ACTING and h.program("s").steps == 1


@pytest.mark.parametrize("why", ["lone_worker", "grammar"])
async def test_a_cut_stream_that_cannot_go_on_fails_rather_than_ending_short(why: str) -> None:
    # One token of twenty, then the stream ends without a finish, and the turn cannot go
    # on elsewhere (no other worker; a grammar's output cannot resume midway). Before, the
    # client got a 200 with one token and no finish: a truncated answer that looked whole.
    h = Harness()
    request = turn("s", tokens=10)
    request["stop_conditions"] = {"max_tokens": 20}
    h.kv.tokens = 20
    if why == "lone_worker":
        h.client.ids = [A]
        h.router.refresh_workers()
        h.kv.end_without_finish_on.add(A)
    else:
        request["sampling_options"] = {"guided_decoding": {"json": {"type": "object"}}}
        h.kv.end_without_finish_on.update({A, B})
    with pytest.raises(RuntimeError, match="StreamCut: stream ended without a finish"):
        await collect(h.router, request, "r1")
    assert [type(e) for e in h.events_of("r1")] == [Sent, Responding, Aborted]
    assert (h.router.stats.aborted, h.router.stats.errors, h.router.stats.failovers) == (
        1, 1, 0)
    assert h.router.in_flight == {} and h.router.stalls.streams == {}


async def test_closing_the_generator_mid_stream_aborts_the_request() -> None:
    h = Harness()
    await collect(h.router, turn("s"), "r1")
    stream = h.router.generate(turn("s", tokens=20), FakeContext("r2"))
    first = await stream.__anext__()
    assert first["token_ids"]
    assert h.router.in_flight.keys() == {"r2"}

    await stream.aclose()  # what Dynamo does when the client disconnects
    assert [type(e) for e in h.events_of("r2")] == [Sent, Responding, Aborted]
    assert h.router.in_flight == {} and h.classifier.scheduler.table.requests == {}
    assert h.router.stats.aborted == 1 and h.router.stats.errors == 0
    program = h.program("s")
    assert program.phase is Phase.ACTING and program.lifecycle is Lifecycle.ACTIVE


async def test_a_client_that_leaves_while_deferred_is_never_forwarded() -> None:
    h = Harness()
    context = FakeContext("r2")
    first, second = await _queued_behind_a_held_turn(h, context)

    context.stopped.set()
    assert await asyncio.wait_for(second, 5) == []  # ends quietly: nobody is listening
    assert h.router.stats.cancelled == 1
    assert len(h.program("s").waiting) == 0
    assert "r2" not in h.classifier.scheduler.table.requests

    h.kv.hold.set()
    await asyncio.wait_for(first, 5)
    assert len(h.kv.requests) == 1 and h.classifier.scheduler.table.requests == {}


async def _queued_behind_a_held_turn(
        h: Harness, context: FakeContext) -> tuple[asyncio.Task[Any], asyncio.Task[Any]]:
    """Session "s": turn r1 held on its worker after its first chunk, the handler of a
    second turn (``context``) waiting behind it for admission."""
    h.kv.hold = asyncio.Event()
    first = asyncio.create_task(collect(h.router, turn("s"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the first turn is forwarded")
    second = asyncio.create_task(_drain(h.router.generate(turn("s"), context)))
    await until(lambda: len(h.program("s").waiting) == 1, "the second turn queues")
    return first, second


async def _drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


# ---- the worker watch ------------------------------------------------------------------
def test_refresh_workers_passes_live_ids_and_their_cards_to_the_classifier() -> None:
    h = Harness()
    seen: list[tuple[set[int], dict[WorkerKey, CapacityCard]]] = []

    def update_workers(live: Any, cards: Any) -> None:
        seen.append((set(live), dict(cards)))

    h.classifier.update_workers = update_workers  # type: ignore[method-assign]
    h.client.ids = [A, B]
    h.cards.cards = {
        str(A): model_card(64, 32),
        str(B): json.dumps({"kv_cache_block_size": 32, "runtime_config": {}}),  # no blocks yet
        "33": model_card(64, 32),  # a card left behind by a worker that is gone
    }
    assert h.router.refresh_workers() is True
    assert seen[-1] == ({A, B}, {WorkerKey(A): CapacityCard(64, 32)})
    assert h.router.block_size == 32  # the cards' block size replaces the default
    assert h.router.workers.stated_block_sizes == {32}  # every card's, for serve's KV-router check
    assert h.router.workers.stated_cards == [CardSettings()] * 3  # for serve's router-card check

    assert h.router.refresh_workers() is False  # nothing changed
    h.client.ids = [B]
    assert h.router.refresh_workers() is True
    assert seen[-1] == ({B}, {})
    assert h.router.state()["live_workers"] == [B]


def test_an_unreadable_card_does_not_stop_the_worker_watch() -> None:
    from structlog.testing import capture_logs

    h = Harness()
    h.client.ids = [A, B, C]  # C joins with a good card while B's card cannot be read
    h.cards.cards = {str(A): model_card(64), str(B): "[]", str(C): model_card(32),
                     "44": "[]"}  # a card left behind by a worker that is gone: not listed
    with capture_logs() as logs:
        assert h.router.refresh_workers() is True
        h.router.refresh_workers()  # the same bad card again: said once
    known = h.classifier.scheduler.capacity.known
    assert sorted(known) == [WorkerKey(A), WorkerKey(C)], "the watch froze"
    why = "the model card is a JSON list, not an object"
    assert h.router.state()["unreadable_cards"] == {str(B): why}
    warned = [e for e in logs if e["event"] == "workers.card_unreadable"]
    assert [(e["worker_id"], e["error"]) for e in warned] == [(str(B), why)]

    h.client.ids = [C]  # A leaves: the scheduler still hears of it
    h.cards.cards[str(B)] = model_card(16)  # and B's card reads again
    h.router.refresh_workers()
    assert sorted(h.classifier.scheduler.capacity.known) == [WorkerKey(C)]
    assert h.router.state()["unreadable_cards"] == {}


# ---- the scheduler tick ----------------------------------------------------------------
async def test_a_reload_that_shortens_the_tick_interval_applies_without_the_old_sleep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An interval of an hour, corrected by a reload to a fraction of a second, ticks at
    once: the tick reads its interval again while it sleeps (before, the hour's sleep ran
    out first, and idle pauses, expiry, the bound on waits and the safety nets with it)."""
    import dynamo_thunderagent.dynamo.router as router_module

    monkeypatch.setattr(router_module, "TICK_RECHECK_SECONDS", 0.01, raising=False)
    h = Harness(scheduler_interval_seconds=3600)
    ticks: list[None] = []
    tick = h.router.tick_once

    def counted() -> None:
        ticks.append(None)
        tick()

    h.router.tick_once = counted  # type: ignore[method-assign]
    h.router.start()
    try:
        await asyncio.sleep(0.05)
        assert ticks == []  # an hour has not passed
        h.classifier.reconfigure(
            h.classifier.parameters.model_copy(update={"scheduler_interval_seconds": 0.02}))
        for _ in range(200):  # at most 2 s of the wall clock
            if len(ticks) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(ticks) >= 2, "the shorter interval waited for the hour's sleep"
    finally:
        await h.router.stop()


async def test_a_handler_cancelled_as_its_turn_is_admitted_does_not_strand_the_session() -> None:
    h = Harness()
    first, second = await _queued_behind_a_held_turn(h, FakeContext("r2"))

    h.classifier.on_event(Completed("r1", 20))  # releases r2 ...
    await asyncio.sleep(0)  # ... whose admission completes in this step,
    second.cancel()  # while its handler is cancelled before it could forward r2
    with pytest.raises(asyncio.CancelledError):
        await second
    assert "r2" not in h.classifier.scheduler.table.requests, "r2 stranded as admitted"
    assert h.program("s").current is None

    h.kv.hold.set()
    await asyncio.wait_for(first, 5)
    chunks = await asyncio.wait_for(collect(h.router, turn("s", tokens=30), "r3"), 5)
    assert chunks[-1]["finish_reason"] == "length"  # the session goes on
    assert h.classifier.scheduler.table.requests == {}


async def test_an_admitted_request_that_nothing_forwards_is_ended_by_the_safety_net() -> None:
    from dynamo_thunderagent.classifier import ClassifyRequest
    from dynamo_thunderagent.dynamo.router import ORPHAN_SECONDS

    h = Harness()
    # Admitted straight through the classifier: the router never forwards it.
    await h.classifier.classify(ClassifyRequest("lost", "s", 10))
    assert h.router.reap_orphans() == []  # too young to call lost
    h.clock.now += ORPHAN_SECONDS
    assert h.router.reap_orphans() == ["lost"]
    # Ended as an abort: the program it created never ran, so it is rolled back.
    assert h.classifier.scheduler.table.requests == {}
    assert "s" not in h.classifier.scheduler.table.programs
    assert h.router.stats.orphans == 1
    chunks = await collect(h.router, turn("s"), "next")  # the session is not stuck
    assert chunks[-1]["finish_reason"] == "length"
    assert h.router.reap_orphans() == []  # forwarded requests are never reaped


async def test_a_release_whose_decisions_were_never_applied_is_sent_by_the_next_tick() -> None:
    h = Harness()
    first, second = await _queued_behind_a_held_turn(h, FakeContext("r2"))
    # A scheduler call whose decisions never reach the classifier (as when it raises after
    # releasing): r2 is released in the table, its handler is never told.
    h.classifier.scheduler.completed("r1", 20, h.clock.now)
    assert h.classifier.scheduler.table.requests["r2"].state is RequestState.RELEASED
    h.clock.now += 60
    assert "r2" not in h.classifier.admitted(), "its handler waits: not the reaper's"
    h.kv.hold.set()
    await asyncio.wait_for(first, 5)
    h.router.tick_once()
    chunks = await asyncio.wait_for(second, 5)
    assert chunks[-1]["finish_reason"] == "length"  # served, on the program's rank
    assert h.router.stats.orphans == 0
    assert h.classifier.scheduler.table.requests == {}
    assert h.classifier.deferred_requests == 0


async def test_a_wait_the_scheduler_lost_fails_with_why_even_when_the_tick_raises() -> None:
    h = Harness()
    first, second = await _queued_behind_a_held_turn(h, FakeContext("r2"))
    # A scheduler step that raised part-way dropped r2 without deciding its outcome.
    program = h.program("s")
    program.waiting.remove("r2")
    del h.classifier.scheduler.table.requests["r2"]

    def broken_tick() -> None:
        raise RuntimeError("a scheduler bug")

    h.classifier.tick = broken_tick  # type: ignore[method-assign]
    h.router.tick_once()  # the tick raises; the safety nets still run
    with pytest.raises(RuntimeError, match="r2: the scheduler lost track of it while it "
                                           "waited for admission"):
        await asyncio.wait_for(second, 5)  # an error that says why, not a wait for ever
    stats = h.router.stats
    assert (stats.orphans, stats.rejected, stats.cancelled) == (1, 0, 0)
    assert h.classifier.deferred_requests == 0
    h.kv.hold.set()
    await asyncio.wait_for(first, 5)
    chunks = await asyncio.wait_for(collect(h.router, turn("s"), "r3"), 5)
    assert chunks[-1]["finish_reason"] == "length"  # the session goes on


async def test_an_engine_refusal_is_an_abort_and_the_client_gets_the_engines_reason() -> None:
    h = Harness()
    await collect(h.router, turn("s", tokens=10), "r1")  # 13 tokens in its cache now
    h.kv.error_finish = "request rejected: request exceeds worker admission limits"
    with pytest.raises(Exception) as refused:
        await collect(h.router, turn("s", tokens=900), "r2")
    assert "request exceeds worker admission limits" in str(refused.value)
    assert "refused by the engine" in str(refused.value)
    assert [type(e) for e in h.events_of("r2")] == [Sent, Aborted]
    program = h.program("s")  # booked as before the refused turn, not as a 900-token turn
    assert program.phase is Phase.ACTING and program.tokens == 13 and program.steps == 1
    assert h.router.stats.completed == 1 and h.router.stats.aborted == 1
    assert h.router.stats.errors == 1 and h.router.in_flight == {}
    # A request without a session id, placed by the KV router: its chunk names the worker
    # (the message used to say "on worker None").
    with pytest.raises(Exception, match="refused by the engine on worker 11/0: request rej"):
        await collect(h.router, turn(None, tokens=900), "r3")


async def test_a_session_id_outside_the_syntax_gets_a_clear_error_and_nothing_is_tracked() -> None:
    h = Harness()
    request = turn("s")
    request["agent_context"]["session_id"] = "x" * 8192
    with pytest.raises(Exception) as refused:
        await collect(h.router, request, "r1")
    assert "X-Dynamo-Session-ID must be 1 to 256 printable ASCII" in str(refused.value)
    assert h.kv.requests == [] and h.classifier.scheduler.table.programs == {}
    assert h.router.stats.rejected == 1


async def test_a_handler_cancelled_while_waiting_is_counted_and_the_cancel_propagates() -> None:
    h = Harness()
    first, second = await _queued_behind_a_held_turn(h, FakeContext("r2"))
    second.cancel()  # Dynamo cancels the handler (not the client's stop signal)
    with pytest.raises(asyncio.CancelledError):
        await second
    assert h.router.stats.cancelled == 1
    assert "r2" not in h.classifier.scheduler.table.requests
    h.kv.hold.set()
    await asyncio.wait_for(first, 5)
    stats = h.router.stats
    assert stats.requests == stats.completed + stats.cancelled == 2


async def test_a_request_reusing_an_id_does_not_drop_the_other_ones_in_flight_entry() -> None:
    h = Harness()
    h.kv.hold = asyncio.Event()
    tracked = asyncio.create_task(collect(h.router, turn("s"), "same-id"))
    await until(lambda: "same-id" in h.router.in_flight, "the tracked turn is in flight")
    entry = h.router.in_flight["same-id"]
    held, h.kv.hold = h.kv.hold, None  # the tracked turn stays held
    await collect(h.router, turn(None), "same-id")  # an untracked request, same id
    assert h.router.in_flight.get("same-id") is entry
    assert h.router.reap_orphans() == []
    held.set()
    await asyncio.wait_for(tracked, 5)
    assert h.router.in_flight == {} and entry.terminal is not None
    assert h.router.reap_orphans() == []


async def test_a_turns_decode_time_is_timed_by_the_router_not_taken_from_the_engine() -> None:
    # Whatever the engine's timing fields say (here: 0.1 ms for the whole turn), the cost
    # model gets the decode time the router saw.
    from dynamo_thunderagent.costs import TurnTiming

    h = Harness()
    h.kv.tokens = 5
    seen: list[TurnTiming] = []
    h.classifier.observe_turn = seen.append  # type: ignore[method-assign]
    stream = h.kv._stream

    async def timed(request: dict[str, Any], hold: asyncio.Event | None) -> AsyncIterator[Any]:
        async for chunk in stream(request, hold):
            chunk["routing_data"] = {**(chunk.get("routing_data") or {}),
                                     "timing": {"ttft_ms": 5.0, "total_time_ms": 5.1}}
            yield chunk
            h.clock.now += 0.25  # the engine's next pass

    h.kv._stream = timed  # type: ignore[method-assign]
    request = turn("s")
    request["stop_conditions"] = {"max_tokens": 5}
    await collect(h.router, request, "r1")
    assert len(seen) == 1
    # First token (the first chunk) to the finish (the sixth): five passes of 0.25 s.
    assert seen[0].decode_seconds == pytest.approx(1.25)
    assert seen[0].output_tokens == 5  # a one-token turn would not count as a decode


async def test_engine_costs_are_learned_from_agent_turns_only() -> None:
    # A client's sessionless one-token requests (health checks, calibration) come first;
    # had their near-zero decode been learned, it would have stayed the yardstick.
    from dynamo_thunderagent.costs import TurnTiming
    from dynamo_thunderagent.dynamo.stats import PROBE_SESSION_PREFIX

    h = Harness()
    seen: list[TurnTiming] = []
    h.classifier.observe_turn = seen.append  # type: ignore[method-assign]
    await collect(h.router, turn(None), "health")
    await collect(h.router, turn(f"{PROBE_SESSION_PREFIX}x"), "probe")
    assert seen == []
    await collect(h.router, turn("agent"), "r1")
    assert len(seen) == 1
