"""aiperf's agentic-code workload: its scaled config, replay flags, tokenizer cache, hit rate."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.agentic_code import (
    REAL_MAX_PROMPT_TOKENS,
    REAL_NEW_TOKENS_PER_TURN,
    REAL_SHARED_TOKENS,
    TOKENIZER_REPO,
    AgenticCodeWorkload,
    scaled_config,
    synthesize,
    tokenizer_cache,
)
from dynamo_thunderagent.bench.clients import SESSION_HEADER, WORKLOADS, hit_rate_from_metrics


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
    env = AgenticCodeWorkload().env({"A": "1"}, tmp_path / "cache")
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == str(tmp_path / "cache")


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
