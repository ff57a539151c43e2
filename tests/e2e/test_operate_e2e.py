"""Operating a running router: lifecycle notifications to a harness, and policy reloads.

One stack (two mocker workers with small KV pools, so that programs pause) serves both
tests; its router publishes lifecycle events (``serve --events-port``). The harness is
the shipped example, examples/sandbox_pool/harness.py, run as its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    E2E_MARKS,
    REPO_ROOT,
    async_wait_for_state,
    counters,
    get_state,
    idle,
    programs,
    run_agents,
    wait_for_state,
    wait_until_ready,
    write_policy,
)

pytestmark = E2E_MARKS

HARNESS = REPO_ROOT / "examples" / "sandbox_pool" / "harness.py"
POLICY = dict(scheduler_interval_seconds=0.5, resume_timeout_seconds=30, pause_threshold=0.9)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from dynamo_thunderagent.stack.launcher import LocalStack
    from dynamo_thunderagent.stack.process import free_port

    root = tmp_path_factory.mktemp("operate-e2e")
    policy = write_policy(root / "policy.yaml", **POLICY)
    events_port = free_port()
    # 2 workers x 64 blocks x 16 tokens: about 1,000 tokens per worker, while six
    # agents grow to about 500 tokens each (plus 100 buffer per program).
    with LocalStack(arm="ours", num_workers=2, num_gpu_blocks=64, block_size=16,
                    speedup_ratio=1.0, policy=policy, run_dir=root / "run",
                    startup_timeout_s=120.0,
                    router_args=["--events-port", str(events_port)]) as running:
        running.events_url = f"tcp://127.0.0.1:{events_port}"
        wait_until_ready(running, 2)
        yield running


def _start_harness(stack: Any, summary: Path) -> subprocess.Popen[str]:
    harness = subprocess.Popen(
        [sys.executable, str(HARNESS), "--events", stack.events_url, "--spares", "2",
         "--summary", str(summary)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert harness.stdout is not None
    line = harness.stdout.readline()
    assert "listening" in line, f"the harness did not start: {line}"
    return harness


def test_the_sandbox_harness_receives_every_pause_resume_and_end(stack: Any,
                                                                 tmp_path: Path) -> None:
    agents, turns = 6, 5
    start = get_state(stack)
    before = start["lifecycle"]["published"]
    summary = tmp_path / "summary.json"
    harness = _start_harness(stack, summary)
    try:
        # A SUB socket joins asynchronously: give it a moment on loopback before the run.
        time.sleep(0.5)
        asyncio.run(run_agents(stack, "pool", agents, turns))
        state = wait_for_state(stack, idle, "every program to be released")
        # The last events may still be on their way to the harness.
        time.sleep(0.5)
    finally:
        harness.send_signal(signal.SIGTERM)
        output, _ = harness.communicate(timeout=30)
    assert harness.returncode == 0, output
    received = json.loads(summary.read_text())["received"]
    published = state["lifecycle"]["published"]
    run = {kind: published[kind] - before[kind] for kind in published}
    kinds = Counter(event["event"] for event in received)

    assert counters(state)["pauses"] > 0, "capacity pressure never paused a program"
    # Every event the router published during the run reached the harness, in order.
    seqs = [event["seq"] for event in received]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the harness missed events"
    assert {kind: kinds[kind] for kind in run} == run
    # ... and they are every pause, resume and end of the run.
    def pauses(state: dict[str, Any]) -> int:
        return counters(state)["pauses"] + counters(state)["idle_pauses"]

    assert kinds["paused"] == pauses(state) - pauses(start)
    assert kinds["resuming"] == counters(state)["resumes"] - counters(start)["resumes"] > 0
    ended = {event["session_id"] for event in received if event["event"] == "ended"}
    assert ended == {f"pool-{i}" for i in range(agents)}
    # Every program that resumed got its sandbox prepared, and every one was reclaimed.
    actions = Counter(event["action"] for event in received)
    assert actions["prepared"] == kinds["resuming"]
    assert actions["reclaimed"] == len({event["session_id"] for event in received
                                        if event["event"] == "resuming"})


async def test_a_reload_changes_pause_threshold_mid_run_without_losing_a_program(
    stack: Any,
) -> None:
    agents, turns = 4, 4
    router = stack.router
    assert router is not None and stack.policy_path is not None
    await async_wait_for_state(stack, idle, "the stack to be idle")
    gate, at_gate = asyncio.Event(), []
    run = asyncio.create_task(run_agents(stack, "reload", agents, turns, gate, at_gate))
    try:
        deadline = time.monotonic() + 120
        while len(at_gate) < agents:
            assert not run.done(), run.exception()
            assert time.monotonic() < deadline, "the agents never reached the reload point"
            await asyncio.sleep(0.1)
        state = get_state(stack)
        sessions = set(programs(state))
        assert sessions == {f"reload-{i}" for i in range(agents)}
        assert state["scheduler"]["parameters"]["pause_threshold"] == 0.9
        reloads = state["policy"]["reloads"]

        # A new threshold: applied, no program lost.
        write_policy(stack.policy_path, **{**POLICY, "pause_threshold": 0.85})
        os.kill(router.pid, signal.SIGHUP)  # the router process this stack started
        state = await async_wait_for_state(
            stack, lambda s: s["policy"]["reloads"]["ok"] == reloads["ok"] + 1,
            "the reload to be applied")
        assert state["scheduler"]["parameters"]["pause_threshold"] == 0.85
        assert set(programs(state)) == sessions
        assert state["policy"]["last_reload"]["message"] == "applied pause_threshold: 0.9 -> 0.85"

        # An invalid file: the running policy stays.
        write_policy(stack.policy_path, **{**POLICY, "pause_threshold": 1.5})
        os.kill(router.pid, signal.SIGHUP)
        state = await async_wait_for_state(
            stack, lambda s: s["policy"]["reloads"]["invalid"] == reloads["invalid"] + 1,
            "the invalid reload to be counted")
        assert state["scheduler"]["parameters"]["pause_threshold"] == 0.85
        assert "pause_threshold" in state["policy"]["last_reload"]["message"]
        assert set(programs(state)) == sessions
        assert router.alive()
        # The reloads are a metric too, by result, as /state counts them.
        from test_metrics_e2e import scrape, total

        assert stack.state_url is not None
        samples = scrape(stack.state_url.replace("/state", "/metrics"))
        for result in ("ok", "invalid"):
            assert total(samples, "policy_reloads_total", result=result) == (
                state["policy"]["reloads"][result])
    finally:
        gate.set()
        await run
        write_policy(stack.policy_path, **POLICY)
    state = await async_wait_for_state(stack, idle, "every program to be released")
    assert state["router"]["errors"] == 0 and state["router"]["aborted"] == 0
