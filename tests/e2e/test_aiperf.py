"""aiperf, the benchmark client Dynamo users run first, against stock and ours on the real stack.

Brief versions of ``bench clients``' workloads (one-turn conversations, multi-turn
conversations that never send session-final, and aiperf's agentic-code sessions), each with a
session id on every request. What is checked is what must hold on any machine: every
request completes with no error on both arms, and on ours a conversation changed worker only
where the selector's load slack sent a turn away from a busy home, nothing is left tracked
and the conversations' programs no longer wait for room (for the agentic-code sessions: every
request ended in one terminal state). The
throughput comparison is a benchmark (``dynamo-thunderagent bench clients``,
docs/benchmarks.md), not a test.
"""

from __future__ import annotations

import importlib.util
import urllib.request
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.clients import AiperfWorkload, find_aiperf, router_state, run_aiperf

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(importlib.util.find_spec("dynamo") is None,
                       reason="needs ai-dynamo 1.6.1 installed"),
]

ONE_TURN = AiperfWorkload("one-turn", conversations=40, turns=1, input_tokens=200,
                          output_tokens=20)
MULTI_TURN = AiperfWorkload("multi-turn", conversations=12, turns=4, input_tokens=300,
                            output_tokens=16, turn_delay_ms=100)


def move_reasons(state_url: str) -> dict[str, float]:
    """Our router's program moves by reason, from the /metrics beside its /state."""
    from prometheus_client.parser import text_string_to_metric_families

    url = state_url.replace("/state", "/metrics")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "dynamo_component_thunderagent_program_moves_total"}


@pytest.fixture(scope="module")
def aiperf() -> str:
    try:
        return find_aiperf()
    except FileNotFoundError as error:
        pytest.fail(f"{error} (make test installs it)")


@pytest.mark.parametrize("arm", ["stock", "ours"])
def test_aiperf_completes_every_request_and_ours_moves_sessions_only_by_the_selector(
        arm: str, aiperf: str, tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig

    config = StackConfig(arm=arm, num_workers=2, run_dir=tmp_path / "run", startup_timeout_s=60)
    with LocalStack(config) as stack:
        for workload, concurrency in ((ONE_TURN, 8), (MULTI_TURN, 6)):
            result = run_aiperf(stack, workload, concurrency, tmp_path / workload.name,
                                aiperf=aiperf, timeout_s=180)
            where = f"{arm} {workload.name}: {result.get('failure')}"
            assert result["failure"] is None and result["returncode"] == 0, where
            assert result["errors"] == 0, where
            assert result["completed"] == workload.requests, where
        state = router_state(stack)
        moves = None if stack.state_url is None else move_reasons(stack.state_url)
    if arm == "stock":
        return
    assert state is not None and moves is not None
    total = ONE_TURN.requests + MULTI_TURN.requests
    assert state["router"]["completed"] == total, state
    assert state["router"]["aborted"] == state["router"]["rejected"] == 0, state
    assert state["tracked_requests"] == 0 and state["in_flight"] == 0, state
    assert state["waiting_for_room"] == 0, state
    # One program per conversation. No resume or re-placement moved one: a program changes
    # worker/rank here only when one of its turns is served elsewhere than it preferred,
    # which the extended policy's preferred_load_slack does where the KV router prices that
    # rank at more than twice another (under this light load, a few programs a run).
    assert state["programs"] == ONE_TURN.conversations + MULTI_TURN.conversations, state
    assert set(moves) <= {"served_elsewhere"}, moves
    assert sum(moves.values()) == state["counters"]["moves"], (moves, state)
    assert state["programs_moved"] <= state["programs"] // 2, state


def test_aiperf_agentic_code_sessions_end_cleanly_on_ours_in_the_calibrated_regime(
        aiperf: str, tmp_path: Path) -> None:
    """aiperf's own coding-agent sessions, synthesized and replayed as ``bench clients
    --workloads agentic-code`` does (briefly): aiperf reports no error, and every request
    the router saw ended in exactly one terminal state with nothing left tracked."""
    from dynamo_thunderagent.bench.agentic_code import AgenticCodeWorkload
    from dynamo_thunderagent.bench.clients import prepare_agentic_code, run_one
    from dynamo_thunderagent.bench.reliability import _accounted

    brief = AgenticCodeWorkload(sessions=12, duration_s=15)
    workload, regime = prepare_agentic_code(brief, tmp_path, aiperf)
    assert workload.trace is not None and workload.trace.is_file()
    run = run_one("ours", workload, 4, 0, tmp_path, aiperf=aiperf, policy=None,
                  timeout_s=240, regime=regime)
    assert run.ok, run.failure
    assert run.errors == 0 and run.completed > 0, run
    assert run.hit_rate is not None and 0.0 < run.hit_rate <= 1.0, run
    state = run.router
    assert state is not None
    assert _accounted(state), state  # every request in exactly one terminal state
    assert state["tracked_requests"] == 0 and state["in_flight"] == 0, state
    assert state["router"]["completed"] >= run.completed, (state, run)
