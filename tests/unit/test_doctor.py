"""doctor's verdicts (the pure core): each misconfiguration that bypasses the scheduler is a
finding with a fix; a healthy deployment has no fail."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynamo_thunderagent.doctor import (
    Discovery,
    Finding,
    FrontendView,
    Registration,
    RouterView,
    Settings,
    check_discovery,
    check_frontend,
    check_router,
    diagnose,
    failed,
    render_json,
    render_text,
    router_view,
)

SETTINGS = Settings("ta-workers.backend.generate", "ta.router.generate", "tiny")
ROUTER = Registration("ta", "router", "generate", 1, "tiny", None)
WORKER_A = Registration("ta-workers", "backend", "generate", 11, "tiny", 256)
WORKER_B = Registration("ta-workers", "backend", "generate", 22, "tiny", 256)
STRAY = Registration("ta", "backend", "generate", 33, "tiny", 256)
HEALTHY = Discovery("file", "/kv", (ROUTER, WORKER_A, WORKER_B))
FRONTEND = FrontendView("http://127.0.0.1:8000", models=("tiny",), served_by=(1, 1, 1), probes=3)
ROUTER_VIEW = RouterView("http://127.0.0.1:9000/state", recent_with_session=40,
                         recent_without_session=2, window_requests=100, window_seconds=60,
                         with_session=40, session_finals=5, live_workers=(11, 22), programs=3)


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def statuses(findings: list[Finding], check: str) -> list[str]:
    return [f.status for f in by_check(findings, check)]


def test_a_healthy_deployment_has_no_warning_and_no_failure() -> None:
    findings = diagnose(SETTINGS, HEALTHY, FRONTEND, ROUTER_VIEW)
    assert {f.status for f in findings} == {"ok"}, render_text(findings)
    assert not failed(findings)
    checks = {f.check for f in findings}
    assert checks == {"discovery", "router", "workers", "capacity", "exposure", "frontend",
                      "sessions", "session-final"}


def test_workers_registered_in_the_routers_namespace_fail_with_the_endpoint_to_use() -> None:
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER, WORKER_A, STRAY)))
    [exposure] = by_check(findings, "exposure")
    assert exposure.status == "fail"
    assert "ta.backend.generate (instances 33)" in exposure.found
    assert exposure.fix is not None and "dyn://ta-workers.backend.generate" in exposure.fix


def test_a_router_in_namespace_dynamo_fails_because_no_frontend_can_be_scoped_to_it() -> None:
    settings = Settings("w.backend.generate", "dynamo.router.generate", "tiny")
    router = Registration("dynamo", "router", "generate", 1, "tiny", None)
    worker = Registration("w", "backend", "generate", 2, "tiny", 8)
    findings = check_discovery(settings, Discovery("file", "/kv", (router, worker)))
    assert statuses(findings, "exposure") == ["fail"]


def test_the_model_served_in_a_third_namespace_is_a_warning() -> None:
    other = Registration("dynamo", "backend", "generate", 44, "tiny", 256)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER, WORKER_A, other)))
    assert statuses(findings, "exposure") == ["ok", "warn"]


def test_no_router_or_no_workers_fail_and_name_the_flags() -> None:
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (WORKER_A,)))
    [router] = by_check(findings, "router")
    assert router.status == "fail" and "--router-endpoint ta.router.generate" in str(router.fix)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER,)))
    [workers] = by_check(findings, "workers")
    assert workers.status == "fail"
    assert "--endpoint dyn://ta-workers.backend.generate" in str(workers.fix)


def test_workers_of_another_model_fail() -> None:
    wrong = Registration("ta-workers", "backend", "generate", 11, "big", 256)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER, wrong)))
    assert statuses(findings, "workers") == ["fail"]
    assert "serve 'big', not 'tiny'" in by_check(findings, "workers")[0].found


def test_workers_without_a_capacity_card_are_a_warning() -> None:
    blind = Registration("ta-workers", "backend", "generate", 22, "tiny", None)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER, WORKER_A, blind)))
    [capacity] = by_check(findings, "capacity")
    assert capacity.status == "warn" and "1 of 2 workers" in capacity.found
    assert "22" in capacity.found


def test_an_unreadable_store_fails_and_an_unlisted_backend_warns() -> None:
    findings = check_discovery(SETTINGS, Discovery("file", "/nope", error="no model cards"))
    assert [f.status for f in findings] == ["fail"] and "DYN_FILE_KV" in str(findings[0].fix)
    # etcd that does not answer: the hint names etcd's setting, not the file store's.
    findings = check_discovery(SETTINGS, Discovery("etcd", "http://127.0.0.1:9",
                                                   error="did not answer"))
    assert [f.status for f in findings] == ["fail"]
    assert "ETCD_ENDPOINTS" in str(findings[0].fix) and "DYN_FILE_KV" not in str(findings[0].fix)
    findings = check_discovery(SETTINGS, Discovery("etcd", "etcd", listable=False,
                                                   error="file only"))
    assert [f.status for f in findings] == ["warn"]


def test_probes_served_by_workers_mean_an_unscoped_frontend() -> None:
    frontend = FrontendView("http://f", models=("tiny",), served_by=(1, 11, 1, 11), probes=4)
    findings = check_frontend(SETTINGS, HEALTHY, frontend)
    [bypass] = [f for f in findings if f.status == "fail"]
    assert "2 of 4 probes bypassed the router" in bypass.found
    assert "ta-workers.backend.generate" in bypass.found
    assert bypass.fix is not None and "--namespace ta" in bypass.fix


def test_probes_served_by_workers_in_the_routers_namespace_say_to_move_the_workers() -> None:
    frontend = FrontendView("http://f", models=("tiny",), served_by=(1, 33), probes=2)
    discovery = Discovery("file", "/kv", (ROUTER, WORKER_A, STRAY))
    [bypass] = [f for f in check_frontend(SETTINGS, discovery, frontend) if f.status == "fail"]
    assert "dyn://ta-workers.backend.generate" in str(bypass.fix)


def test_a_frontend_that_is_unreachable_or_lists_another_model_fails() -> None:
    down = check_frontend(SETTINGS, HEALTHY, FrontendView("http://f", error="unreachable"))
    assert [f.status for f in down] == ["fail"]
    other = check_frontend(SETTINGS, HEALTHY, FrontendView("http://f", models=("big",)))
    assert [f.status for f in other] == ["fail"] and "'big'" in other[0].found


def test_failed_probes_warn_and_unreported_workers_warn() -> None:
    view = FrontendView("http://f", models=("tiny",), probes=2, probe_errors=("HTTP 500", "x"))
    findings = check_frontend(SETTINGS, HEALTHY, view)
    assert [f.status for f in findings] == ["ok", "warn", "warn"]


@pytest.mark.parametrize(("with_session", "without", "status"), [
    (0, 0, "ok"), (0, 20, "fail"), (0, 3, "warn"), (4, 6, "warn"), (5, 5, "ok"), (9, 1, "ok"),
])
def test_the_share_of_recent_requests_with_a_session_id(with_session: int, without: int,
                                                         status: str) -> None:
    view = RouterView("u", recent_with_session=with_session, recent_without_session=without,
                      window_requests=100, window_seconds=60, with_session=with_session,
                      session_finals=1, live_workers=(11,))
    assert statuses(check_router(view), "sessions") == [status]


def test_sessions_without_any_session_final_are_a_warning() -> None:
    view = RouterView("u", recent_with_session=5, with_session=5, session_finals=0,
                      live_workers=(11,))
    [final] = by_check(check_router(view), "session-final")
    assert final.status == "warn" and "X-Dynamo-Session-Final: true" in str(final.fix)


def test_a_router_without_live_workers_or_unreadable_state_fails() -> None:
    assert statuses(check_router(RouterView("u")), "router") == ["fail"]
    assert [f.status for f in check_router(RouterView("u", error="refused"))] == ["fail"]


def test_without_frontend_or_state_urls_those_checks_are_warnings() -> None:
    findings = diagnose(SETTINGS, HEALTHY, None, None)
    assert statuses(findings, "frontend") == ["warn"] and statuses(findings, "sessions") == [
        "warn"]


def _state(**router: Any) -> dict[str, Any]:
    counters = {"recent_with_session": 3, "recent_without_session": 1, "with_session": 9,
                "session_final": 4, "doctor_probes": 2,
                "recent_window": {"requests": 100, "seconds": 60.0}}
    counters.update(router)
    return {"router": counters, "scheduler": {"programs": {"a": {}}}, "live_workers": [11]}


def test_router_view_reads_the_counters_less_doctors_own_probes() -> None:
    view = router_view("u", _state())
    assert (view.recent_with_session, view.recent_without_session) == (3, 1)
    assert view.session_finals == 2 and view.programs == 1 and view.live_workers == (11,)


def test_router_view_rejects_a_document_that_is_not_a_routers_state() -> None:
    with pytest.raises(ValueError, match="not a ThunderAgent router's /state"):
        router_view("u", {"hello": 1})
    state = _state()
    del state["router"]["doctor_probes"]
    with pytest.raises(ValueError, match="lack doctor_probes"):
        router_view("u", state)


def test_the_renderings_carry_every_finding_and_the_fixes() -> None:
    findings = [Finding("ok", "router", "fine"), Finding("fail", "frontend", "bad", "do this")]
    text = render_text(findings)
    assert "FAIL  frontend" in text and "fix: do this" in text and "1 fail, 0 warn, 1 ok" in text
    document = json.loads(render_json(findings))
    assert document["ok"] is False and document["findings"][1]["fix"] == "do this"


def test_a_kv_router_hashing_with_another_block_size_fails_the_check() -> None:
    state = _state()
    state["kv_router"] = {"block_size": 16, "workers_block_size": 64,
                          "mismatch": "the workers' model cards now say 64 ..."}
    view = router_view("u", state)
    [finding] = by_check(check_router(view), "block-size")
    assert finding.status == "fail" and "say 64" in finding.found and finding.fix
    assert by_check(check_router(router_view("u", _state())), "block-size") == []


def test_a_router_card_without_the_workers_parsers_fails_the_check() -> None:
    state = _state()
    state["router_card"] = {"tool_call_parser": None,
                            "mismatch": "tool_call_parser: the workers' cards say 'hermes' ..."}
    [finding] = by_check(check_router(router_view("u", state)), "router-card")
    assert finding.status == "fail" and "'hermes'" in finding.found
    assert finding.fix and "restart serve" in finding.fix
    assert by_check(check_router(router_view("u", _state())), "router-card") == []


def test_prefill_only_workers_are_a_warning_that_says_they_serve_nothing() -> None:
    state = _state()
    state["prefill_only_workers"] = [44]
    [finding] = by_check(check_router(router_view("u", state)), "disaggregated")
    assert finding.status == "warn" and "44" in finding.found and "aggregated" in (
        finding.fix or "")
    assert by_check(check_router(router_view("u", _state())), "disaggregated") == []


def test_two_routers_at_the_routers_endpoint_fail_in_discovery_and_in_its_state() -> None:
    second = Registration("ta", "router", "generate", 2, "tiny", None)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv", (ROUTER, second, WORKER_A)))
    [router] = by_check(findings, "router")
    assert router.status == "fail" and "2 routers serve ta.router.generate" in router.found
    assert router.fix is not None and "exactly one" in router.fix
    state = _state()
    state["routers"] = {"endpoint": "ta.router.generate", "instance_id": 1,
                        "other_instances": [2], "problem": "other routers serve ..."}
    [finding] = by_check(check_router(router_view("u", state)), "routers")
    assert finding.status == "fail" and finding.found == "other routers serve ..."
    state["routers"]["problem"] = None  # listed, not yet confirmed: nothing to say
    assert by_check(check_router(router_view("u", state)), "routers") == []
    assert by_check(check_router(router_view("u", _state())), "routers") == []


def test_another_models_router_at_the_same_endpoint_fails_too() -> None:
    # The frontend sends the endpoint's requests to every instance there, whatever model.
    other_model = Registration("ta", "router", "generate", 2, "other", None)
    findings = check_discovery(SETTINGS, Discovery("file", "/kv",
                                                   (ROUTER, other_model, WORKER_A)))
    [router] = by_check(findings, "router")
    assert router.status == "fail" and "models other, tiny" in router.found
    assert router.fix is not None and "--router-endpoint" in router.fix


def test_a_second_listing_the_router_has_not_seen_last_is_a_warning() -> None:
    # A router killed moments ago stays listed; the router, which watches, has not
    # confirmed it: doctor warns instead of failing.
    second = Registration("ta", "router", "generate", 2, "tiny", None)
    discovery = Discovery("file", "/kv", (ROUTER, second, WORKER_A, WORKER_B))
    state = _state()
    state["routers"] = {"endpoint": "ta.router.generate", "instance_id": 1,
                        "other_instances": [2], "confirmed_instances": [],
                        "other_routers": 0, "problem": None}
    view = router_view("u", state)
    [router] = by_check(diagnose(SETTINGS, discovery, FRONTEND, view), "router")[:1]
    assert router.status == "warn" and "run doctor again" in router.found
    # Without the router's view (or from a router that does not watch) it fails.
    [router] = by_check(diagnose(SETTINGS, discovery, FRONTEND, None), "router")
    assert router.status == "fail"
    [router] = by_check(diagnose(SETTINGS, discovery, FRONTEND, router_view("u", _state())),
                        "router")[:1]
    assert router.status == "fail"


def test_a_router_that_could_not_watch_its_endpoint_is_a_warning() -> None:
    state = _state()
    state["routers"] = {"endpoint": "ta.router.generate", "unwatched": "RuntimeError('x')"}
    [finding] = by_check(check_router(router_view("u", state)), "routers")
    assert finding.status == "warn" and "RuntimeError('x')" in finding.found


def test_the_router_named_by_its_own_state_is_no_bypass_when_discovery_is_unreadable() -> None:
    unread = Discovery("etcd", "http://127.0.0.1:2379", error="connection refused")
    frontend = FrontendView("http://f", models=("tiny",), served_by=(7, 7, 7), probes=3)
    findings = check_frontend(SETTINGS, unread, frontend, router_instance=7)
    assert [f.status for f in findings] == ["ok", "ok"]
    assert "all 3 probes went through the router" in findings[-1].found
    state = {"router": {"recent_with_session": 0, "recent_without_session": 0,
                        "with_session": 0, "session_final": 0, "doctor_probes": 0,
                        "recent_window": {"requests": 0, "seconds": 60}},
             "scheduler": {"programs": {}}, "routers": {"instance_id": 7}}
    view = router_view("http://s/state", state)
    assert view.instance_id == 7
    assert statuses(diagnose(SETTINGS, unread, frontend, view), "frontend") == ["ok", "ok"]


def test_probes_served_by_an_unnamed_instance_are_no_verdict_without_discovery() -> None:
    unread = Discovery("etcd", "http://127.0.0.1:2379", error="connection refused")
    frontend = FrontendView("http://f", models=("tiny",), served_by=(7, 7), probes=2)
    [ok, unsure] = check_frontend(SETTINGS, unread, frontend)
    assert (ok.status, unsure.status) == ("ok", "warn")
    assert "cannot tell" in unsure.found and "--namespace" not in str(unsure.fix)
    assert "DYN_DISCOVERY_BACKEND" in str(unsure.fix)
