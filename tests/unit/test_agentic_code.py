"""aiperf's agentic-code workload: its scaled config, replay flags, tokenizer cache, hit rate."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dynamo_thunderagent.bench.agentic_code import (
    REAL_MAX_PROMPT_TOKENS,
    REAL_NEW_TOKENS_PER_TURN,
    REAL_SHARED_TOKENS,
    TOKENIZER_REPO,
    AgenticCodeWorkload,
    check_blocks,
    scaled_config,
    synthesize,
    tokenizer_cache,
)
from dynamo_thunderagent.bench.clients import (
    SESSION_HEADER,
    WORKLOADS,
    ClientRun,
    hit_rate_from_metrics,
    run_aiperf,
)


def test_tokens_follow_the_token_scale_and_gaps_the_time_scale() -> None:
    config = scaled_config(0.1, 0.25, 64, worker_kv_tokens=10**6)
    turn = config["new_tokens_per_turn"]
    assert turn["mean"] == pytest.approx(REAL_NEW_TOKENS_PER_TURN["mean"] * 0.1)
    assert turn["median"] == pytest.approx(REAL_NEW_TOKENS_PER_TURN["median"] * 0.1)
    assert config["max_prompt_tokens"] == REAL_MAX_PROMPT_TOKENS // 10
    assert config["cache"]["layer1_tokens"] == REAL_SHARED_TOKENS // 10
    delays = config["inter_turn_delay"]
    assert delays["agentic_delay"]["mean"] == pytest.approx(5000 * 0.25)
    assert delays["human_delay"]["median"] == pytest.approx(15000 * 0.25)
    assert config["block_size"] == 64 and config["restart_initial_probability"] == 0.0
    json.dumps(config)  # what aiperf reads


def test_prompts_stop_at_three_quarters_of_a_worker_pool() -> None:
    assert scaled_config(0.1, 0.25, 64, worker_kv_tokens=17_344)["max_prompt_tokens"] == 13_008
    assert scaled_config(0.01, 0.25, 64, worker_kv_tokens=17_344)["max_prompt_tokens"] == 2000


@pytest.mark.parametrize("args", [(0.0, 1.0, 64, 100), (0.1, -1.0, 64, 100),
                                  (0.1, 0.25, 0, 100), (0.1, 0.25, 64, 0)])
def test_a_scale_block_size_or_pool_that_is_not_positive_is_refused(
        args: tuple[float, float, int, int]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        scaled_config(*args)


def test_the_replay_paces_sessions_by_concurrency_with_the_session_id_on_every_turn(
        tmp_path: Path) -> None:
    workload = WORKLOADS["agentic-code"]
    assert isinstance(workload, AgenticCodeWorkload)
    with pytest.raises(ValueError, match="synthesize the trace first"):
        workload.flags()
    flags = AgenticCodeWorkload(trace=tmp_path / "dataset.jsonl").flags()
    assert flags[flags.index("--session-header") + 1] == SESSION_HEADER
    assert flags[flags.index("--input-file") + 1] == str(tmp_path / "dataset.jsonl")
    assert flags[flags.index("--custom-dataset-type") + 1] == "mooncake_trace"
    assert "--no-fixed-schedule" in flags and "--concurrency" not in flags


def test_the_tokenizer_cache_holds_the_model_files_as_one_snapshot(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{}")
    assert tokenizer_cache(model, tmp_path / "cache") == TOKENIZER_REPO
    repo = tmp_path / "cache" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = (repo / "refs" / "main").read_text()
    assert sorted(p.name for p in (repo / "snapshots" / snapshot).iterdir()) == [
        "config.json", "tokenizer.json"]
    assert tokenizer_cache(model, tmp_path / "cache") == TOKENIZER_REPO  # again: no error


def _fake_aiperf(tmp_path: Path, body: str) -> str:
    fake = tmp_path / "fake-aiperf"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return str(fake)


def test_only_agentic_code_runs_aiperf_offline_with_the_cache_and_says_so_in_its_command(
        tmp_path: Path) -> None:
    # The fake aiperf writes its environment and a summary where the real one would.
    aiperf = _fake_aiperf(tmp_path, (
        'for a in "$@"; do [ "$prev" = --output-artifact-dir ] && out="$a"; prev="$a"; done\n'
        'env > "$out/env.txt"\n'
        'echo \'{"request_throughput": {"avg": 1.0}, "request_count": {"avg": 3}}\' '
        '> "$out/profile_export_aiperf.json"\n'))
    stack = SimpleNamespace(config=SimpleNamespace(model_name="tiny"),
                            url="http://127.0.0.1:1/v1", model_path=tmp_path / "model")
    prepared = AgenticCodeWorkload(trace=tmp_path / "t.jsonl", hub_cache=tmp_path / "cache")
    for workload, offline in ((WORKLOADS["multi-turn"], False), (prepared, True)):
        out = tmp_path / workload.name
        result = run_aiperf(stack, workload, 2, out, aiperf=aiperf)  # type: ignore[arg-type]
        assert result["failure"] is None and result["completed"] == 3
        env = (out / "env.txt").read_text()
        command = (out / "command.txt").read_text()
        assert ("HF_HUB_OFFLINE=1" in env) is offline, workload.name
        assert (f"HF_HUB_CACHE={tmp_path / 'cache'}" in env) is offline
        assert command.startswith("HF_HUB_CACHE=") is offline
        tokenizer = command.split("--tokenizer ")[1].split()[0]
        assert tokenizer == (TOKENIZER_REPO if offline else str(tmp_path / "model"))


def test_a_trace_aiperf_would_refuse_is_refused_first_with_the_hash_named(
        tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps(t) for t in [
        {"session_id": "a", "input_length": 130, "hash_ids": [1, 2, 3]},  # 64 + 64 + 2
        {"session_id": "b", "input_length": 150, "hash_ids": [1, 2, 4]},
        {"session_id": "a", "input_length": 10, "hash_ids": [5]}]) + "\n")
    check_blocks(good, 64)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(t) for t in [
        {"session_id": "a", "input_length": 100, "hash_ids": [1, 2]},  # 2 is 36 tokens here
        {"session_id": "b", "input_length": 150, "hash_ids": [1, 2, 3]}]) + "\n")
    with pytest.raises(ValueError, match=r"line 2: prefix hash 2 is 64 tokens here and 36"):
        check_blocks(bad, 64)


def test_a_trace_left_by_an_earlier_run_is_never_taken_for_a_new_one(tmp_path: Path) -> None:
    old = tmp_path / "out" / "zzz_400s_seed42" / "dataset.jsonl"
    old.parent.mkdir(parents=True)
    old.write_text("{}\n")
    silent = _fake_aiperf(tmp_path, "exit 0\n")  # succeeds and writes nothing
    with pytest.raises(RuntimeError, match="0 new traces"):
        synthesize(silent, scaled_config(0.1, 0.25, 64, 10_000), tmp_path / "out", sessions=2,
                   seed=1, env=dict(os.environ))


def test_a_failed_synthesis_says_what_aiperf_said(tmp_path: Path) -> None:
    fake = tmp_path / "aiperf"
    fake.write_text("#!/bin/sh\necho 'bad config: max_prompt_tokens' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(RuntimeError, match=r"rc=3.*bad config"):
        synthesize(str(fake), scaled_config(0.1, 0.25, 64, 10_000), tmp_path / "out", sessions=2,
                   seed=1, env=dict(os.environ))


def test_the_hit_rate_is_cached_over_prompt_tokens_from_the_frontend_counters() -> None:
    text = "\n".join([
        "# HELP dynamo_frontend_cached_tokens cached",
        'dynamo_frontend_cached_tokens_sum{model="tiny"} 300',
        'dynamo_frontend_cached_tokens_count{model="tiny"} 3',
        'dynamo_frontend_input_sequence_tokens_sum{model="tiny"} 1200',
        'dynamo_component_router_input_sequence_tokens_sum{worker_id="a"} 999',
    ])
    assert hit_rate_from_metrics(text) == pytest.approx(0.25)
    assert hit_rate_from_metrics("") is None


def _cli_args(out: Path) -> argparse.Namespace:
    return argparse.Namespace(arms="stock,ours", workloads="one-turn,agentic-code",
                              concurrency="2", repeats=1, policy=None, policy_clock="regime",
                              aiperf=None, timeout=10.0, out=out, json=False)


def test_a_trace_that_cannot_be_made_stops_the_command_before_any_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo_thunderagent.bench import clients

    ran: list[str] = []
    monkeypatch.setattr(clients, "find_aiperf", lambda explicit=None: "aiperf")

    def refuse(workload: AgenticCodeWorkload, out: Path, aiperf: str, **_: object) -> None:
        raise RuntimeError("aiperf synthesize agentic-code failed (rc=3): bad config")

    monkeypatch.setattr(clients, "prepare_agentic_code", refuse)
    monkeypatch.setattr(clients, "run_one", lambda *a, **k: ran.append(a[0]))
    assert clients.run_clients_cli(_cli_args(tmp_path / "out")) == 2
    assert ran == []  # the one-turn runs were not spent before the failure


def test_the_report_names_the_trace_each_agentic_code_run_replayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo_thunderagent.bench import clients

    trace = tmp_path / "trace" / "dataset.jsonl"
    seen: list[tuple[str, Path | None]] = []
    monkeypatch.setattr(clients, "find_aiperf", lambda explicit=None: "aiperf")
    from dynamo_thunderagent.stack.regime import prepare_stack_regime

    regime = prepare_stack_regime("calibrated", tmp_path / "regime")
    monkeypatch.setattr(clients, "prepare_agentic_code", lambda w, out, aiperf, **_: (
        dataclasses.replace(w, trace=trace, hub_cache=tmp_path / "cache"), regime))

    def run_one(arm: str, workload: Any, level: int, repeat: int, out: Path,
                **_: Any) -> ClientRun:
        seen.append((workload.name, getattr(workload, "trace", None)))
        return ClientRun(workload.name, level, arm, repeat, 1.0, {"p99": 10.0}, completed=5)

    monkeypatch.setattr(clients, "run_one", run_one)
    assert clients.run_clients_cli(_cli_args(tmp_path / "out")) == 0
    assert ("agentic-code", trace) in seen and ("one-turn", None) in seen
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["workloads"]["agentic-code"]["trace"] == str(trace)
    assert report["policy_clock"] == {"agentic-code": 0.25}  # the routers' clock is on record
