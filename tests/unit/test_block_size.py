"""The KV router hashes prompts with the workers' block size (``dynamo/block_size.py``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from dynamo_thunderagent.cli import main
from dynamo_thunderagent.dynamo.block_size import (
    DEFAULT_BLOCK_SIZE,
    await_block_size,
    card_block_sizes,
    choose,
    mismatch,
    report,
)
from dynamo_thunderagent.dynamo.serve import _watch_block_size


def test_the_cards_state_their_block_sizes() -> None:
    cards = {"1": json.dumps({"kv_cache_block_size": 64}), "2": {"kv_cache_block_size": 64},
             "3": {"runtime_config": {}}, "4": {"kv_cache_block_size": 0},
             "5": {"kv_cache_block_size": True}, "6": {"kv_cache_block_size": "16"},
             "7": "not json", "8": "[16]"}
    assert card_block_sizes(cards) == {64}
    assert card_block_sizes({}) == set()


def test_the_workers_cards_decide_and_an_overridden_flag_is_said() -> None:
    assert choose(None, {64}) == (64, None)
    assert choose(64, {64}) == (64, None)
    size, warning = choose(16, {64})
    assert size == 64 and warning is not None and "--block-size 16 overridden" in warning


def test_without_cards_the_flag_then_the_default() -> None:
    assert choose(32, set()) == (32, None)
    size, warning = choose(None, set())
    assert size == DEFAULT_BLOCK_SIZE
    assert warning is not None and "no worker's model card" in warning


def test_cards_that_disagree_are_said_and_the_flag_breaks_the_tie() -> None:
    size, warning = choose(None, {16, 64})
    assert size == 16 and warning is not None and "disagree" in warning
    assert choose(64, {16, 64})[0] == 64


def test_a_later_mismatch_is_named() -> None:
    assert mismatch(64, {64}) is None
    assert mismatch(64, set()) is None  # no card yet says anything
    problem = mismatch(16, {64})
    assert problem is not None and "say 64" in problem and "hashes with 16" in problem
    problem = mismatch(16, {16, 64})  # some workers of another size
    assert problem is not None and "say 16, 64" in problem
    assert report(16, {64}) == {"block_size": 16, "workers_block_sizes": [64],
                                "mismatch": mismatch(16, {64})}


async def test_without_the_flag_serve_waits_for_a_card() -> None:
    reads: list[int] = []

    def read() -> dict[str, Any]:
        reads.append(1)
        return {"7": {"kv_cache_block_size": 32}} if len(reads) >= 3 else {}

    assert await await_block_size(read, None, wait=10.0) == (32, None)
    assert len(reads) == 3


async def test_with_the_flag_serve_does_not_wait() -> None:
    reads: list[int] = []

    def read() -> dict[str, Any]:
        reads.append(1)
        return {}

    assert await asyncio.wait_for(await_block_size(read, 32, wait=10.0), 1.0) == (32, None)
    assert len(reads) == 1


async def test_the_wait_for_a_card_is_bounded() -> None:
    size, warning = await asyncio.wait_for(await_block_size(lambda: {}, None, wait=0.3), 5.0)
    assert size == DEFAULT_BLOCK_SIZE and warning is not None


async def test_the_router_says_once_when_the_cards_come_to_disagree() -> None:
    class Workers:  # the router's worker watch, as far as the check reads it
        stated_block_sizes: set[int] = set()

    workers = Workers()
    with capture_logs() as logs:
        task = asyncio.create_task(_watch_block_size(workers, 16, every=0.01))
        try:
            await asyncio.sleep(0.05)  # no card yet: nothing to say
            workers.stated_block_sizes = {64}  # workers started later, read by the refresh
            await asyncio.sleep(0.1)  # several passes: said once
        finally:
            task.cancel()
    said = [entry for entry in logs if entry["event"] == "router.block_size_mismatch"]
    assert len(said) == 1 and said[0]["workers_block_sizes"] == [64]


def test_serve_refuses_a_block_size_below_one(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo_thunderagent.dynamo import serve

    # serve points structlog at this test's captured stderr, closed after it: keep it off.
    monkeypatch.setattr(serve, "configure_logging", lambda: None)
    code = main(["serve", "--router-policy-config", "policies/thunderagent.yaml",
                 "--endpoint", "w.backend.generate", "--model-name", "m", "--model-path", "m",
                 "--block-size", "0"])
    assert code == 2
    assert "--block-size must be a positive number of tokens, got 0" in capsys.readouterr().err
