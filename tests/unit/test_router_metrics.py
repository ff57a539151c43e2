"""The router's Prometheus metrics and its HTTP endpoint, over the router with fake Dynamo parts.

The metrics must move as the scheduler decided (counters from its recorded steps) and show
its state at scrape time (gauges); the endpoint must serve them with Prometheus' own text
format beside /state and /health.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamo_thunderagent.cache_loss import KEEPS_PAUSED_MIN_RESUMES
from dynamo_thunderagent.dynamo.metrics import PREFIX, RouterMetrics
from dynamo_thunderagent.dynamo.state_server import StateServer, on_loop
from dynamo_thunderagent.dynamo.stats import bounded_state
from dynamo_thunderagent.program import Lifecycle
from tests.unit.test_router import A, Harness, collect, model_card, turn, until

NS, MODEL = "ta", "tiny"


def samples(metrics: RouterMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, labels less dynamo_namespace and model)."""
    text = metrics.exposition().decode()
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert (labels.pop("dynamo_namespace"), labels.pop("model")) == (NS, MODEL)
            found[sample.name, tuple(sorted(labels.items()))] = sample.value
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return found.get((f"{PREFIX}_{name}", tuple(sorted(labels.items()))), 0.0)


def one_worker(blocks: int, **params: Any) -> tuple[Harness, RouterMetrics]:
    """A router over worker A with ``blocks`` KV blocks, and its metrics."""
    h = Harness(blocks=blocks, buffer_per_program=0, **params)
    h.client.ids = [A]
    h.cards.cards = {str(A): model_card(blocks)}
    h.kv.loads = {A: 0}
    h.router.refresh_workers()
    return h, RouterMetrics(h.router, namespace=NS, model=MODEL)


async def test_a_deferred_turn_counts_one_pause_one_resume_and_its_wait() -> None:
    h, metrics = one_worker(10, acting_decay_tau_seconds=1.0)
    await collect(h.router, turn("big", tokens=120), "r1")

    waiting = asyncio.create_task(collect(h.router, turn("small", tokens=100), "r2"))
    await until(lambda: "small" in h.classifier.scheduler.table.programs, "admission ran")
    assert h.program("small").lifecycle is Lifecycle.PAUSED
    during = samples(metrics)
    assert value(during, "program_pauses_total", reason="no_room") == 1
    assert value(during, "turns_deferred_total", reason="program_paused") == 1
    assert value(during, "waiting_requests") == 1
    assert value(during, "waiting_for_room_programs") == 1
    assert value(during, "programs", phase="reasoning", lifecycle="paused") == 1
    assert value(during, "programs", phase="acting", lifecycle="active") == 1
    assert value(during, "worker_capacity_tokens", worker_id=str(A), dp_rank="0") == 160

    h.clock.now += 30
    h.classifier.tick()
    await asyncio.wait_for(waiting, 5)
    after = samples(metrics)
    counters = h.router.state()["scheduler"]["counters"]
    # The tick resumed the small program and then paused the big one (its rank was over
    # the threshold again): two pauses, each with its reason, as /state counts them.
    assert value(after, "program_pauses_total", reason="no_room") == 1
    assert value(after, "program_pauses_total", reason="pressure") == 1
    assert counters["pauses"] == 2
    assert value(after, "program_resumes_total", reason="room") == counters["resumes"] == 1
    assert value(after, "turns_admitted_total", reason="resumed") == 1
    assert value(after, "admission_wait_seconds_count") == 2  # both turns
    assert value(after, "admission_wait_seconds_sum") == 30
    assert value(after, "admission_wait_seconds_bucket", le="30.0") == 2
    assert value(after, "admission_wait_seconds_bucket", le="10.0") == 1
    assert value(after, "tick_duration_seconds_count") == 1
    assert value(after, "waiting_requests") == 0
    assert value(after, "requests_total", outcome="completed") == 2
    # The fake engine reports no cached tokens: every prompt token was computed.
    assert value(after, "prompt_tokens_total") == 220
    assert value(after, "recomputed_tokens_total") == 220
    assert value(after, "failovers_total") == 0
    usage = h.router.state()["scheduler"]["ranks"][f"{A}/0"]
    assert value(after, "worker_usage_tokens", worker_id=str(A), dp_rank="0") == (
        usage["usage_tokens"])


async def test_the_cache_loss_gauge_shows_what_the_engine_lost_of_a_continuing_turn() -> None:
    h, metrics = one_worker(100)
    await collect(h.router, turn("s", tokens=100), "r1")
    # Absent until a continuing turn was seen on the rank.
    assert not any(name == f"{PREFIX}_worker_cache_loss_ratio" for name, _ in samples(metrics))
    assert h.router.state()["scheduler"]["cache_loss"] == {}
    # The fake engine finds nothing cached: the 96 tokens (6 whole blocks) of the first
    # prompt that the second expected are all lost.
    await collect(h.router, turn("s", tokens=150), "r2")
    loss = h.router.state()["scheduler"]["cache_loss"][f"{A}/0"]
    assert loss == {"cache_loss_ratio": 1.0, "turns": 1}
    assert value(samples(metrics), "worker_cache_loss_ratio", worker_id=str(A),
                 dp_rank="0") == 1.0


async def test_the_resume_loss_gauge_shows_what_paused_programs_found_back_home() -> None:
    h, metrics = one_worker(100, pause_min_resume_loss=0.4)
    await collect(h.router, turn("s", tokens=100), "r1")
    assert not any(name == f"{PREFIX}_worker_resume_loss_ratio" for name, _ in samples(metrics))
    # A host tier gave paused programs most of their prompt back on this rank.
    worker = next(iter(h.classifier.scheduler.capacity.known))
    for _ in range(KEEPS_PAUSED_MIN_RESUMES):
        h.classifier.scheduler.resume_loss.observe(worker, 1_000, 900)
    state = h.router.state()["scheduler"]
    assert state["resume_loss"][f"{A}/0"] == {"resume_loss_ratio": pytest.approx(0.1),
                                              "turns": KEEPS_PAUSED_MIN_RESUMES}
    assert state["keeping_paused"] == [f"{A}/0"]
    assert value(samples(metrics), "worker_resume_loss_ratio", worker_id=str(A),
                 dp_rank="0") == pytest.approx(0.1)


def test_the_other_routers_gauge_counts_the_confirmed_others_and_is_absent_unwatched() -> None:
    from dynamo_thunderagent.dynamo.peers import CONFIRM_SECONDS, PeerWatch

    h, metrics = one_worker(100)
    name = f"{PREFIX}_other_routers"
    assert not any(key == name for key, _ in samples(metrics))  # no watch (serve adds it)
    watch = PeerWatch("ta.router.generate", 1)
    h.router.state_extensions["routers"] = watch.state
    watch.observe([1, 2], 0.0)
    assert value(samples(metrics), "other_routers") == 0  # listed, not yet confirmed
    watch.observe([1, 2], CONFIRM_SECONDS)
    assert value(samples(metrics), "other_routers") == 1
    assert h.router.state()["routers"]["confirmed_instances"] == [2]
    # The watch could not start (serve's /state says why): no gauge, rather than a 0.
    h.router.state_extensions["routers"] = lambda: {"endpoint": "ta.router.generate",
                                                    "unwatched": "RuntimeError('x')"}
    assert not any(key == name for key, _ in samples(metrics))


def test_registrations_written_back_are_counted_where_the_keeper_runs() -> None:
    h, metrics = one_worker(100)
    assert value(samples(metrics), "registrations_restored_total") == 0  # absent: no keeper
    assert not any(key == f"{PREFIX}_registrations_restored_total"
                   for key, _ in samples(metrics))
    h.router.state_extensions["registration"] = lambda: {"restored": 3}
    assert value(samples(metrics), "registrations_restored_total") == 3


async def test_a_turn_carried_on_on_another_worker_counts_one_failover() -> None:
    h = Harness()
    metrics = RouterMetrics(h.router, namespace=NS, model=MODEL)
    h.kv.fail_after_first_on[A] = ConnectionError("worker went away")
    await collect(h.router, turn("s"), "r1")
    found = samples(metrics)
    assert value(found, "failovers_total") == 1
    assert value(found, "requests_total", outcome="completed") == 1


async def test_rejections_are_counted_by_the_limit_they_hit() -> None:
    h = Harness(max_tracked_requests=1)
    metrics = RouterMetrics(h.router, namespace=NS, model=MODEL)
    h.kv.hold = asyncio.Event()
    holder = asyncio.create_task(collect(h.router, turn("holder"), "r1"))
    await until(lambda: len(h.kv.requests) == 1, "the holder is forwarded")
    rejected = asyncio.create_task(collect(h.router, turn("other"), "r2"))
    await asyncio.wait({rejected}, timeout=5)
    assert rejected.exception() is not None
    h.kv.hold.set()
    await holder
    found = samples(metrics)
    assert value(found, "rejections_total", reason="max_tracked_requests") == 1
    assert value(found, "requests_total", outcome="rejected") == 1



async def test_a_connection_that_sends_nothing_is_closed_and_frees_its_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import socket
    import threading

    from dynamo_thunderagent.dynamo import state_server

    monkeypatch.setattr(state_server, "CLIENT_IDLE_SECONDS", 0.3)
    h = Harness()
    server = StateServer(asyncio.get_running_loop(), h.router.state, None, "127.0.0.1",
                         0).start()

    def handlers() -> int:  # the server's threads, one per open connection
        return sum(1 for t in threading.enumerate() if "process_request" in t.name)

    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        idle.sendall(b"GET /st")  # and never the rest of the request line

        def closed_by_the_server() -> bytes:
            return idle.recv(1)  # b"" once the server closes it

        assert await asyncio.to_thread(closed_by_the_server) == b""
        idle.close()
        deadline = asyncio.get_running_loop().time() + 5
        while handlers():
            assert asyncio.get_running_loop().time() < deadline, "its thread lives on"
            await asyncio.sleep(0.02)
    finally:
        server.close()


async def test_the_state_server_answers_state_health_and_metrics_and_404_else() -> None:
    h = Harness()
    metrics = RouterMetrics(h.router, namespace=NS, model=MODEL)
    await collect(h.router, turn("s"), "r1")
    server = StateServer(asyncio.get_running_loop(), h.router.state, metrics.exposition,
                         "127.0.0.1", 0).start()

    def get(path: str) -> tuple[int, str, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
                return r.status, r.headers["Content-Type"], r.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers["Content-Type"], error.read()

    try:
        status, _, body = await asyncio.to_thread(get, "/state")
        state = json.loads(body)
        assert status == 200 and state["scheduler"]["programs_total"] == 1
        assert await asyncio.to_thread(get, "/health") == (200, "application/json",
                                                           b'{"status": "ok"}')
        status, content_type, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert f"{PREFIX}_program_pauses" in names and f"{PREFIX}_programs" in names
        status, _, body = await asyncio.to_thread(get, "/nothing")
        assert status == 404 and "/metrics" in json.loads(body)["error"]
    finally:
        await asyncio.to_thread(server.close)


async def test_reads_from_another_thread_run_on_the_event_loop() -> None:
    loop = asyncio.get_running_loop()
    threads: list[bool] = []

    def read() -> int:
        threads.append(asyncio.get_running_loop() is loop)
        return 7

    assert await asyncio.to_thread(on_loop, loop, read) == 7
    assert on_loop(loop, read) == 7  # on the loop's own thread: called directly
    assert threads == [True, True]


def test_state_lists_at_most_the_limit_of_programs_and_says_how_many_exist() -> None:
    state: dict[str, Any] = {"programs": {f"p{i}": {} for i in range(5)}}
    bounded = bounded_state(state, limit=3)
    assert list(bounded["programs"]) == ["p0", "p1", "p2"] and bounded["programs_total"] == 5
