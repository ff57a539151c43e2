"""The router says when it is being bypassed: sessionless traffic (INFO) and workers the
frontend can reach directly (WARN), rate-limited; and the counters `doctor` reads."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from dynamo_thunderagent.dynamo.serve import exposed_worker_path
from dynamo_thunderagent.dynamo.stats import (
    MISSING_SESSIONS_MIN_REQUESTS,
    PROBE_SESSION_PREFIX,
    RECENT_REQUESTS,
    RECENT_SECONDS,
    RecentSessions,
    exposed_workers_due,
    missing_sessions_due,
)
from tests.unit.test_router import A, FakeClient, Harness, collect, turn


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


# ---- the pure rules ---------------------------------------------------------------------
def test_recent_sessions_keep_the_last_requests_within_the_window() -> None:
    recent = RecentSessions(limit=3, seconds=10.0)
    for now, has in [(0.0, True), (1.0, False), (2.0, False), (3.0, True)]:
        recent.observe(has, now)
    assert recent.counts(3.0) == (1, 2)  # the first fell out by count
    assert recent.counts(12.5) == (1, 0)  # the next two fell out by age
    assert recent.counts(100.0) == (0, 0)


def test_missing_sessions_need_a_majority_over_enough_requests_and_repeat_once_a_minute() -> None:
    few = MISSING_SESSIONS_MIN_REQUESTS - 1
    assert not missing_sessions_due(0, few, None, 0.0)  # too few to judge
    assert not missing_sessions_due(5, 5, None, 0.0)  # half is not most
    assert missing_sessions_due(4, 6, None, 0.0)
    assert not missing_sessions_due(4, 6, 0.0, RECENT_SECONDS - 1)
    assert missing_sessions_due(4, 6, 0.0, RECENT_SECONDS)


def test_exposed_workers_warn_on_change_else_once_a_minute() -> None:
    none: frozenset[int] = frozenset()
    assert not exposed_workers_due(none, frozenset({1}), None, 0.0)
    assert exposed_workers_due(frozenset({1}), none, None, 0.0)
    assert not exposed_workers_due(frozenset({1}), frozenset({1}), 0.0, 1.0)
    assert exposed_workers_due(frozenset({1, 2}), frozenset({1}), 0.0, 1.0)
    assert exposed_workers_due(frozenset({1}), frozenset({1}), 0.0, RECENT_SECONDS)


def test_the_exposed_path_is_the_workers_component_in_the_routers_namespace() -> None:
    assert exposed_worker_path("w.backend.generate", "ta.router.generate") == "ta.backend.generate"
    assert exposed_worker_path("w.router.generate", "ta.router.generate") is None


# ---- the router ---------------------------------------------------------------------------
async def test_most_requests_without_a_session_id_log_one_info_line_per_minute() -> None:
    h = Harness()
    with capture_logs() as logs:
        for i in range(MISSING_SESSIONS_MIN_REQUESTS * 2):
            await collect(h.router, turn(None), f"plain-{i}")
    notices = events(logs, "router.sessions_missing")
    assert len(notices) == 1  # not one line per request
    assert notices[0]["log_level"] == "info"
    assert notices[0]["without_session"] == MISSING_SESSIONS_MIN_REQUESTS
    assert "X-Dynamo-Session-ID" in notices[0]["hint"]

    h.clock.now += RECENT_SECONDS
    with capture_logs() as logs:
        for i in range(MISSING_SESSIONS_MIN_REQUESTS):
            await collect(h.router, turn(None), f"later-{i}")
    assert len(events(logs, "router.sessions_missing")) == 1  # once more, a minute later


async def test_sessions_on_most_requests_keep_the_router_quiet() -> None:
    h = Harness()
    with capture_logs() as logs:
        for i in range(MISSING_SESSIONS_MIN_REQUESTS * 2):
            session = None if i % 3 == 0 else f"agent-{i}"
            await collect(h.router, turn(session), f"r{i}")
    assert events(logs, "router.sessions_missing") == []
    router = h.router.state()["router"]
    assert router["recent_without_session"] == 7 and router["recent_with_session"] == 13
    assert (router["with_session"], router["without_session"]) == (13, 7)
    assert router["recent_window"] == {"requests": RECENT_REQUESTS, "seconds": RECENT_SECONDS}


async def test_doctor_probes_are_counted_apart_and_stay_out_of_the_session_share() -> None:
    h = Harness()
    await collect(h.router, turn(f"{PROBE_SESSION_PREFIX}1", final=True), "probe")
    await collect(h.router, turn("agent", final=True), "final")
    router = h.router.state()["router"]
    assert router["doctor_probes"] == 1 and router["session_final"] == 2
    assert (router["recent_with_session"], router["recent_without_session"]) == (1, 0)


def _exposed_harness(ids: list[int]) -> tuple[Harness, FakeClient]:
    h = Harness()
    exposed = FakeClient(ids)
    h.router.workers.exposed = exposed
    h.router.workers.exposed_endpoint = "ta.backend.generate"
    return h, exposed


def test_workers_in_the_routers_namespace_are_warned_about_at_the_first_refresh() -> None:
    h, exposed = _exposed_harness([7])
    with capture_logs() as logs:
        h.router.refresh_workers()
        h.router.refresh_workers()  # no change, within the minute: quiet
    warnings = events(logs, "workers.exposed")
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert warnings[0]["instances"] == [7] and warnings[0]["endpoint"] == "ta.backend.generate"
    assert h.router.state()["exposed_workers"] == [7]

    exposed.ids = [7, 8]
    with capture_logs() as logs:
        h.router.refresh_workers()  # another one appeared: at once
    assert [w["instances"] for w in events(logs, "workers.exposed")] == [[7, 8]]

    h.clock.now += RECENT_SECONDS
    with capture_logs() as logs:
        h.router.refresh_workers()  # still there a minute later: again
    assert len(events(logs, "workers.exposed")) == 1


def test_no_exposed_workers_no_warning() -> None:
    h, _ = _exposed_harness([])
    with capture_logs() as logs:
        h.router.refresh_workers()
    assert events(logs, "workers.exposed") == []
    assert h.router.state()["exposed_workers"] == []


def test_a_failing_exposed_check_does_not_keep_workers_from_the_scheduler() -> None:
    # The check runs after the scheduler is told: before the review's fix it ran first, so
    # a discovery error there froze the scheduler's view of the workers (and /state showed
    # a live set the scheduler never got).
    h, exposed = _exposed_harness([])

    def broken() -> list[int]:
        raise RuntimeError("discovery hiccup")

    exposed.instance_ids = broken  # type: ignore[method-assign]
    h.client.ids = [A]  # worker B left
    with capture_logs() as logs:
        assert h.router.refresh_workers() is True
    assert h.classifier.scheduler.capacity.live_worker_ids == frozenset({A})
    assert h.router.state()["live_workers"] == [A]
    assert [e["error"] for e in events(logs, "workers.exposed_check_failed")] == [
        "RuntimeError('discovery hiccup')"]
