"""bench clients: aiperf command lines, summary parsing, the report; and the stack's paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.clients import (
    SESSION_HEADER,
    WORKLOADS,
    ClientRun,
    aiperf_env,
    find_aiperf,
    markdown,
    parse_summary,
    summarize,
)


def test_the_synthetic_workloads_put_the_session_id_on_every_request() -> None:
    for name in ("one-turn", "multi-turn"):  # agentic-code: tests/unit/test_agentic_code.py
        flags = WORKLOADS[name].flags()
        assert flags[flags.index("--session-header") + 1] == SESSION_HEADER
    multi = WORKLOADS["multi-turn"].flags()
    assert multi[multi.index("--conversation-turn-delay-mean") + 1] == "400"
    assert "--request-count" not in multi  # aiperf derives 40 x 6 itself
    one = WORKLOADS["one-turn"].flags()
    assert one[one.index("--request-count") + 1] == "200"


def test_summary_without_an_error_key_means_no_errors(tmp_path: Path) -> None:
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps({
        "request_throughput": {"avg": 15.5}, "request_count": {"avg": 200},
        "benchmark_duration": {"avg": 12.9},
        "time_to_first_token": {"p50": 24.0, "p90": 32.0, "p99": 46.0, "max": 51.0},
        "inter_token_latency": {"p50": 2.25, "p99": 4.45, "avg": 2.3},
    }))
    summary = parse_summary(path)
    assert summary["errors"] == 0 and summary["completed"] == 200
    assert summary["ttft_ms"] == {"p50": 24.0, "p90": 32.0, "p99": 46.0, "max": 51.0}
    assert summary["itl_ms"] == {"p50": 2.25, "p99": 4.45}


def test_ratios_are_taken_against_stock_of_the_same_workload_and_concurrency() -> None:
    runs = [ClientRun("one-turn", 2, "stock", 0, 10.0, {"p99": 50.0}),
            ClientRun("one-turn", 2, "ours", 0, 9.0, {"p99": 100.0}),
            ClientRun("one-turn", 2, "ours", 1, 11.0, {"p99": 50.0}),
            ClientRun("one-turn", 20, "ours", 0, None, {}, failure="StackError: boom")]
    rows = {(r["concurrency"], r["arm"]): r for r in summarize(runs)}
    # Stock ran repeat 0 only: the ratios compare ours' repeat 0 with it, not ours' mean
    # over both repeats (which would be 1.0x and 1.5x).
    assert rows[(2, "ours")]["requests_per_s"] == pytest.approx(10.0)
    assert rows[(2, "ours")]["rps_vs_stock"] == pytest.approx(0.9)
    assert rows[(2, "ours")]["ttft_p99_vs_stock"] == pytest.approx(2.0)
    assert rows[(20, "ours")]["failed_runs"] == 1 and rows[(20, "ours")]["rps_vs_stock"] is None
    assert "StackError: boom" in markdown(summarize(runs), runs)


def test_a_repeat_that_failed_in_stock_leaves_the_ratio_to_the_repeats_both_ran() -> None:
    runs = [ClientRun("multi-turn", 8, "stock", 0, 10.0, {"p99": 40.0}),
            ClientRun("multi-turn", 8, "stock", 1, None, {}, failure="StackError: boom"),
            ClientRun("multi-turn", 8, "ours", 0, 12.0, {"p99": 60.0}),
            ClientRun("multi-turn", 8, "ours", 1, 20.0, {"p99": 20.0})]
    rows = {r["arm"]: r for r in summarize(runs)}
    assert rows["ours"]["rps_vs_stock"] == pytest.approx(1.2)
    assert rows["ours"]["ttft_p99_vs_stock"] == pytest.approx(1.5)
    assert rows["stock"]["failed_runs"] == 1 and rows["stock"]["rps_vs_stock"] == 1.0
    assert "cover only the repeats both arms ran" in markdown(summarize(runs), runs)


def test_cpu_per_request_is_each_role_over_the_requests_it_completed() -> None:
    runs = [ClientRun("one-turn", 20, "ours", 0, 50.0, {}, completed=200,
                      cpu_s={"frontend": 0.8, "router": 2.4, "worker": 0.9}),
            ClientRun("one-turn", 20, "ours", 1, 50.0, {}, completed=100,
                      cpu_s={"frontend": 0.4, "router": 1.6, "worker": 0.5}),
            ClientRun("one-turn", 20, "stock", 0, 60.0, {}, completed=200,
                      cpu_s={"frontend": 1.0, "worker": 0.6})]
    rows = {r["arm"]: r for r in summarize(runs)}
    assert rows["ours"]["cpu_router_ms_per_request"] == pytest.approx((12.0 + 16.0) / 2)
    assert rows["ours"]["cpu_frontend_ms_per_request"] == pytest.approx(4.0)
    assert rows["stock"]["cpu_router_ms_per_request"] is None  # stock has no router process
    table = markdown(summarize(runs), runs)
    assert "| 4.0 / 14.0 / 4.8 |" in table and "| 5.0 / - / 3.0 |" in table


def test_process_cpu_seconds_reads_this_process_and_nothing_for_a_gone_one() -> None:
    import os
    import sys

    from dynamo_thunderagent.stack.process import process_cpu_seconds

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    used = process_cpu_seconds(os.getpid())
    assert used is not None and used > 0
    assert process_cpu_seconds(2**22 + 1) is None  # above Linux's pid_max


def test_aiperf_never_runs_with_hub_offline_mode_and_never_leaves_loopback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = aiperf_env()
    assert "HF_HUB_OFFLINE" not in env
    assert env["HTTPS_PROXY"].startswith("http://127.0.0.1")


def test_a_missing_aiperf_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("DTA_AIPERF", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("dynamo_thunderagent.bench.clients.AIPERF_VENV", tmp_path / "none")
    with pytest.raises(FileNotFoundError, match="make aiperf"):
        find_aiperf()


def test_a_relative_run_dir_becomes_absolute(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers read the model folder by path; a relative one is taken for a hub id.
    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig

    monkeypatch.chdir(tmp_path)
    stack = LocalStack(StackConfig(run_dir=Path("runs/one")))
    assert stack.run_dir == tmp_path / "runs" / "one"
    assert stack.model_path.is_absolute()


def test_reliability_accounting_adds_every_terminal_state() -> None:
    from dynamo_thunderagent.bench.reliability import PhaseReport, _accounted, _drained, _markdown

    router = {"requests": 10, "passthrough": 1, "completed": 4, "aborted": 1, "rejected": 1,
              "session_final": 1, "cancelled": 1, "orphans": 1}
    state = {"router": router, "in_flight": 0,
             "scheduler": {"tracked_requests": 0, "waiting_for_room": 0}}
    assert _accounted(state) and _drained(state)
    assert not _accounted({**state, "router": {**router, "requests": 11}})
    assert not _drained({**state, "in_flight": 1})
    report = PhaseReport("soak", faults=["worker-kill", "worker-kill", "bad-input"],
                         accounted=True, drained=False)
    table = _markdown([report])
    assert "bad-input x1, worker-kill x2" in table and "| yes | NO |" in table


def test_restarting_a_process_of_a_stack_that_is_not_running_is_refused(tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig, StackError

    stack = LocalStack(StackConfig(arm="ours", run_dir=tmp_path / "run"))
    with pytest.raises(StackError, match="not running"):
        stack.restart_router()
    with pytest.raises(StackError, match="not running"):
        stack.restart_worker(0)


def test_an_aiperf_that_outlives_its_timeout_is_stopped_with_its_children(tmp_path: Path) -> None:
    import time as _time

    from dynamo_thunderagent.bench.clients import WORKLOADS, run_aiperf

    fake = tmp_path / "aiperf"
    # A stand-in that starts a child and hangs, as a wedged aiperf would.
    fake.write_text("#!/bin/sh\nsleep 60 &\necho $! > \"$0.child\"\nsleep 60\n")
    fake.chmod(0o755)

    class Stack:
        url = "http://127.0.0.1:1/v1"
        model_path = tmp_path

        class config:
            model_name = "tiny"

    started = _time.monotonic()
    result = run_aiperf(Stack(), WORKLOADS["one-turn"], 2, tmp_path / "art",  # type: ignore[arg-type]
                        aiperf=str(fake), timeout_s=1)
    assert result["returncode"] == 124 and "ran past 1 s" in result["failure"]
    assert _time.monotonic() - started < 10
    child = int((tmp_path / "aiperf.child").read_text())
    _time.sleep(0.2)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone (or a zombie)


async def test_the_soaks_hung_worker_is_stopped_then_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import random
    import signal
    from types import SimpleNamespace

    from dynamo_thunderagent.bench import reliability

    calls: list[tuple[str, int, object]] = []
    stack = SimpleNamespace(
        config=SimpleNamespace(num_workers=2),
        kill_worker=lambda index, sig=signal.SIGKILL: calls.append(("signal", index, sig)),
        restart_worker=lambda index: calls.append(("restart", index, None)))
    monkeypatch.setattr(reliability, "HANG_SECONDS", 0.0)
    await reliability._inject(SimpleNamespace(stack=stack, rng=random.Random(1)), "worker-hang")
    (_, index, sig), restart = calls
    assert sig == signal.SIGSTOP and restart == ("restart", index, None)
    assert "worker-hang" in reliability.FAULTS


async def test_the_soaks_frozen_router_is_stopped_then_resumed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import random
    import signal
    from types import SimpleNamespace

    from dynamo_thunderagent.bench import reliability

    router = SimpleNamespace(pid=12345)
    sent: list[tuple[object, signal.Signals]] = []
    monkeypatch.setattr(reliability, "signal_group", lambda proc, sig: sent.append((proc, sig)))
    monkeypatch.setattr(reliability, "FREEZE_SECONDS", 0.0)
    bench = SimpleNamespace(stack=SimpleNamespace(router=router), rng=random.Random(1))
    await reliability._inject(bench, "router-freeze")
    assert sent == [(router, signal.SIGSTOP), (router, signal.SIGCONT)]
    assert "router-freeze" in reliability.FAULTS
