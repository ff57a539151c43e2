"""``doctor`` and the agent example against real stacks (issue 12, items 3 and 4).

Each misconfiguration that silently bypasses the scheduler is built on a local stack (arm
``ours``, one mocker worker): workers registered in the router's namespace, a frontend not
scoped to the router's namespace, clients that send no session id. ``doctor`` runs as its
command line does, with the stack's discovery settings, and must name each; a healthy stack,
driven by examples/agent_loop.py, must report no failure.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# This folder's conftest.py: pytest puts a test folder without __init__.py on sys.path.
from conftest import (
    E2E_MARKS,
    MODEL,
    REPO_ROOT,
    chat,
    get_state,
    programs,
    wait_for_state,
    wait_until_ready,
)

pytestmark = E2E_MARKS

AGENT_EXAMPLE = REPO_ROOT / "examples" / "agent_loop.py"
Findings = list[dict[str, Any]]


def _stack(run_dir: Path, **overrides: Any) -> Any:
    from dynamo_thunderagent.stack.launcher import LocalStack

    config: dict[str, Any] = {"arm": "ours", "num_workers": 1, "run_dir": run_dir,
                              "startup_timeout_s": 120.0}
    config.update(overrides)
    return LocalStack(**config)


def run_doctor(stack: Any) -> tuple[int, Findings]:
    """``dynamo-thunderagent doctor --json`` with the stack's discovery settings."""
    from dynamo_thunderagent.stack.topology import http_url

    argv = [sys.executable, "-m", "dynamo_thunderagent", "doctor",
            "--endpoint", stack.worker_endpoint, "--router-endpoint", stack.router_endpoint,
            "--model-name", MODEL, "--frontend", http_url(stack.http_port),
            "--state", stack.state_url, "--json"]
    done = subprocess.run(argv, env=stack.base_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode in (0, 1), f"doctor failed to run:\n{done.stdout}\n{done.stderr}"
    document = json.loads(done.stdout)
    assert document["ok"] == (done.returncode == 0)
    findings: Findings = document["findings"]
    return done.returncode, findings


def failing(findings: Findings) -> Findings:
    return [f for f in findings if f["status"] == "fail"]


def doctor_until(stack: Any, holds: Any, what: str, timeout: float = 60.0) -> Findings:
    """Run doctor until ``holds(findings)``; discovery and the frontend may lag a second."""
    deadline = time.monotonic() + timeout
    while True:
        _, findings = run_doctor(stack)
        if holds(findings):
            return findings
        if time.monotonic() > deadline:
            pytest.fail(f"doctor never reported {what}; last findings:\n"
                        f"{json.dumps(findings, indent=1)}")
        time.sleep(1.0)


def wait_for_log(stack: Any, event: str, timeout: float = 30.0) -> str:
    router = stack.router
    assert router is not None
    deadline = time.monotonic() + timeout
    while True:
        text = str(router.log_path.read_text(errors="replace"))
        if event in text:
            return text
        if time.monotonic() > deadline:
            pytest.fail(f"no {event!r} in the router's log after {timeout:.0f}s:\n"
                        f"{router.log_tail(40)}")
        time.sleep(0.2)


def _client(stack: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=stack.url, api_key="unused", timeout=60, max_retries=0)


# ---- a healthy stack: the agent example, then doctor ---------------------------------------
@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with _stack(tmp_path_factory.mktemp("doctor-healthy") / "run") as stack:
        wait_until_ready(stack, 1)
        yield stack


def test_the_agent_example_runs_as_one_program_and_ends_with_its_session_final(
        healthy: Any, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the tool lists this folder\n")
    session = "example-agent"
    done = subprocess.run(
        [sys.executable, str(AGENT_EXAMPLE), "--base-url", healthy.url, "--model", MODEL,
         "--turns", "3", "--max-tokens", "8", "--session", session, "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "ran 'ls -la'" in done.stdout and f"session {session} finished" in done.stdout
    # Three turns tracked as one program, then released by the session-final at once.
    state = wait_for_state(healthy, lambda s: session not in programs(s),
                           "the example's program to be released")
    router = state["router"]
    assert router["completed"] >= 3 and router["with_session"] >= 4
    assert router["session_final"] - router["doctor_probes"] >= 1


def test_doctor_finds_nothing_wrong_with_a_healthy_stack(healthy: Any) -> None:
    rc, findings = run_doctor(healthy)
    assert rc == 0 and not failing(findings), json.dumps(findings, indent=1)
    by_check = {f["check"]: f for f in findings if f["status"] == "ok"}
    assert "through the router" in by_check["frontend"]["found"]
    assert "capacity card" in by_check["capacity"]["found"]
    # Its probes are counted apart: the session share and session-finals stay the clients'.
    router = get_state(healthy)["router"]
    assert router["doctor_probes"] >= 1


def test_doctor_reports_clients_that_send_no_session_id(healthy: Any) -> None:
    with _client(healthy) as client:
        for i in range(12):
            chat(client, [{"role": "user", "content": f"plain request {i}"}], session=None)
    findings = doctor_until(
        healthy, lambda fs: any(f["check"] == "sessions" and f["status"] != "ok" for f in fs),
        "the low share of requests with a session id")
    [sessions] = [f for f in findings if f["check"] == "sessions"]
    assert "carried no session id" in sessions["found"]
    assert "X-Dynamo-Session-ID" in sessions["fix"]
    wait_for_log(healthy, "router.sessions_missing")


# ---- misconfigured stacks ----------------------------------------------------------------------
def test_doctor_reports_workers_registered_where_the_frontend_sees_them(
        tmp_path: Path) -> None:
    with _stack(tmp_path / "run") as stack:
        wait_until_ready(stack, 1)
        stack.start_worker_in(stack.namespace)  # beside the router: the frontend sees it
        findings = doctor_until(
            stack, lambda fs: any(f["check"] == "exposure" for f in failing(fs)),
            "the worker in the router's namespace")
        [exposure] = [f for f in failing(findings) if f["check"] == "exposure"]
        assert f"{stack.namespace}.backend.generate" in exposure["found"]
        assert stack.worker_endpoint in exposure["fix"]
        # The router says so itself, at WARN.
        log = wait_for_log(stack, "workers.exposed")
        assert "warning" in log.split("workers.exposed")[0].splitlines()[-1]
        assert get_state(stack)["exposed_workers"]


def test_doctor_reports_a_frontend_not_scoped_to_the_routers_namespace(
        tmp_path: Path) -> None:
    # Namespace "dynamo" scopes nothing: the frontend also sees the workers' namespace.
    with _stack(tmp_path / "run", frontend_args=["--namespace", "dynamo"]) as stack:
        wait_until_ready(stack, 1)
        findings = doctor_until(
            stack, lambda fs: any(f["check"] == "frontend" for f in failing(fs)),
            "probes that bypassed the router")
        [bypass] = [f for f in failing(findings) if f["check"] == "frontend"]
        assert "bypassed the router" in bypass["found"]
        assert stack.worker_endpoint in bypass["found"]
        assert f"--namespace {stack.namespace}" in bypass["fix"]
        assert [f["check"] for f in failing(findings)] == ["frontend"]


def test_a_second_router_at_the_same_endpoint_is_reported_by_both_routers_and_doctor(
        tmp_path: Path) -> None:
    # Two routers for one set of workers: the frontend spreads requests over both, and each
    # admits programs up to the whole KV cache with a program table of its own.
    import urllib.request

    from dynamo_thunderagent.dynamo.peers import CONFIRM_SECONDS

    def routers_part(url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=10) as answer:
            part: dict[str, Any] = json.loads(answer.read())["routers"]
        return part

    with _stack(tmp_path / "run") as stack:
        wait_until_ready(stack, 1)
        first = routers_part(stack.state_url)
        assert first["other_instances"] == [] and first["problem"] is None
        second, second_url = stack.start_router_again()
        findings = doctor_until(
            stack, lambda fs: {"router", "routers"} <= {f["check"] for f in failing(fs)},
            "the second router, in discovery and in the router's state",
            timeout=CONFIRM_SECONDS + 60)
        [listed] = [f for f in failing(findings) if f["check"] == "router"]
        assert "2 routers serve" in listed["found"] and "exactly one" in listed["fix"]
        # Each router names the other, and said so in its log at WARN.
        mine, theirs = routers_part(stack.state_url), routers_part(second_url)
        assert mine["other_instances"] == [theirs["instance_id"]]
        assert theirs["other_instances"] == [mine["instance_id"]]
        assert mine["problem"] and str(theirs["instance_id"]) in mine["problem"]
        log = wait_for_log(stack, "router.other_instances")
        assert "warning" in log.split("router.other_instances")[0].splitlines()[-1]
        # Once the second one has stopped, the finding clears.
        stack.end_process(second, signal.SIGTERM)
        wait_for_state(stack, lambda s: s["routers"]["problem"] is None,
                       "the router to see the second one gone")
        wait_for_log(stack, "router.other_instances_gone")
