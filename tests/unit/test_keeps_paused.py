"""Does a pause save anything here? ``pause_min_resume_loss``: what paused programs find of
their prompt when they come back to the rank they were paused on (a host KV tier keeps it)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dynamo_thunderagent.cache_loss import KEEPS_PAUSED_MIN_RESUMES, CacheLossMeter, keeps_paused
from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import PrefixBlocks, WorkerKey
from dynamo_thunderagent.scheduler import Release

from .conftest import W0, W1, Harness, make, over_threshold_on_w0, waiting_turn_on_w0


def _meters(resumes: int, paused_found: int, running_found: int | None) -> tuple[
        CacheLossMeter, CacheLossMeter]:
    resumed, continuing = CacheLossMeter(), CacheLossMeter()
    for _ in range(resumes):
        resumed.observe(W0, 1_000, paused_found)
    if running_found is not None:
        continuing.observe(W0, 1_000, running_found)
    return resumed, continuing


def test_a_rank_keeps_paused_programs_once_enough_came_back_cached() -> None:
    n = KEEPS_PAUSED_MIN_RESUMES
    assert keeps_paused(*_meters(n, 700, 1_000), W0, 0.4, n)  # 30% lost: kept
    assert keeps_paused(*_meters(n, 700, None), W0, 0.4, n)  # no continuing turn yet
    assert not keeps_paused(*_meters(n - 1, 1_000, 1_000), W0, 0.4, n)  # too few resumes
    assert not keeps_paused(*_meters(n, 550, 1_000), W0, 0.4, n)  # 45% lost: past it
    assert not keeps_paused(*_meters(n, 1_000, 500), W0, 0.4, n)  # running turns lose now
    assert not keeps_paused(*_meters(n, 1_000, 1_000), W1, 0.4, n)  # another rank: unmeasured


def _pause_small(h: Harness, capacities: dict[WorkerKey, int] | None = None) -> None:
    """Past the threshold on W0 (over_threshold_on_w0), the tick pauses "small"."""
    over_threshold_on_w0(h, capacities)
    assert h.tick().paused == ["small"]
    assert h.program("small").paused_prompt_tokens == 1_000


def _paused_and_back(h: Harness, found: int | None) -> str:
    """"small" is paused under pressure on W0, W0 grows, and its next turn resumes it there
    and completes with ``found`` prompt tokens cached."""
    _pause_small(h)
    rid, d = h.turn("small", 1_500)
    assert d.outcome(rid) is None  # waits for room
    h.workers({W0: 100_000})
    d = h.tick()
    assert Release(rid, W0) in d.released
    h.scheduler.completed(rid, 1_510, h.now, found)
    return rid


def _harness() -> Harness:
    return make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9)


def test_a_paused_program_back_home_reports_what_the_engine_kept() -> None:
    h = _harness()
    _paused_and_back(h, found=250)
    assert h.scheduler.resume_loss.loss_ratio(W0) == pytest.approx(0.75)
    assert h.program("small").paused_prompt_tokens == 0
    # Not a continuing turn: the pause let the engine evict it.
    assert h.scheduler.cache_loss.loss_ratio(W0) is None
    state = h.scheduler.snapshot(h.now)
    assert state["resume_loss"][str(W0)]["turns"] == 1
    assert state["keeping_paused"] == []  # off without the parameter


@pytest.mark.parametrize(("found", "loss"), [(640, 1.0), (1_000, 0.0)])
def test_a_prompt_shared_with_programs_that_stayed_is_left_out_of_the_sample(
        found: int, loss: float) -> None:
    # "small" and "big" share a 640-token system prompt (40 blocks). Finding only that
    # after the pause says nothing of what the pause kept: small's own part was lost
    # (found 640: loss 1.0, not 0.36). Finding all of it is a kept prompt (loss 0.0).
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9,
             shared_prefix_accounting=True)
    system = tuple(range(100, 140))

    def own(tag: int) -> PrefixBlocks:
        return PrefixBlocks((*system, tag), 16)

    h.workers({W0: 10_000})
    h.acting_on("small", W0, 1_000, prefix=own(1))
    h.acting_on("big", W0, 8_000, prefix=own(2))
    h.turn("big", 9_400, prefix=own(2))  # 9,760 counted: past the threshold, small pauses
    assert h.tick().paused == ["small"]
    rid, _ = h.turn("small", 1_500, prefix=own(1))
    h.workers({W0: 100_000})
    assert Release(rid, W0) in h.tick().released
    assert h.scheduler.table.shared_prefix_tokens(h.program("small")) == 640
    h.scheduler.completed(rid, 1_510, h.now, found)
    assert h.scheduler.resume_loss.loss_ratio(W0) == pytest.approx(loss)


def test_a_paused_program_that_moves_or_says_nothing_is_not_a_sample() -> None:
    h = _harness()
    _paused_and_back(h, found=None)  # the engine did not say what it found
    assert h.scheduler.resume_loss.loss_ratio(W0) is None
    h = _harness()
    _pause_small(h, {W0: 10_000, W1: 10_000})
    rid, _ = h.turn("small", 1_500)
    d = h.tick()  # resumes on W1, where there is room: its cache stayed behind
    assert Release(rid, W1) in d.released
    h.scheduler.completed(rid, 1_510, h.now, 0)
    assert h.scheduler.resume_loss.loss_ratio(W1) is None
    assert h.scheduler.resume_loss.loss_ratio(W0) is None


def test_a_resumed_turn_served_on_another_rank_is_not_a_sample() -> None:
    h = _harness()
    _pause_small(h, {W0: 10_000, W1: 100_000})
    h.acting_on("w1", W1, 95_000)  # W1 has no room either: "small" resumes at home ...
    rid, _ = h.turn("small", 1_500)
    h.scheduler.set_workers(frozenset({0, 1}), {
        W0: CapacityCard(total_kv_blocks=100_000, block_size=1),
        W1: CapacityCard(total_kv_blocks=100_000, block_size=1)})
    assert Release(rid, W0) in h.tick().released
    h.scheduler.sent(rid, W1, h.now)  # ... but the KV router's selector sends it to W1
    h.scheduler.completed(rid, 1_510, h.now, 0)
    assert h.scheduler.resume_loss.turns(W1) == 0
    assert h.scheduler.resume_loss.turns(W0) == 0


def test_a_paused_program_whose_worker_left_is_not_a_sample_where_it_resumes() -> None:
    h = _harness()
    _pause_small(h, {W0: 10_000, W1: 10_000})
    rid, _ = h.turn("small", 1_500)
    h.workers({W1: 10_000})  # W0 leaves with the prompt "small" left there
    d = h.tick()
    assert Release(rid, W1) in d.released
    h.scheduler.completed(rid, 1_510, h.now, 0)
    assert h.scheduler.resume_loss.turns(W1) == 0


def _keeping(limit: float | None = 0.4, lost: int = 0, measured: bool = True,
             **extra: Any) -> Harness:
    params = {} if limit is None else {"pause_min_resume_loss": limit}
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9,
             **params, **extra)
    if measured:
        _resumes_found(h, 1_000 - lost)
    return h


def _resumes_found(h: Harness, found: int) -> None:
    """Enough paused programs came back to W0 to judge, each finding ``found`` of 1,000."""
    for _ in range(KEEPS_PAUSED_MIN_RESUMES):
        h.scheduler.resume_loss.observe(W0, 1_000, found)


def test_a_rank_that_keeps_paused_programs_pauses_no_one() -> None:
    h = _keeping()
    over_threshold_on_w0(h)
    assert h.tick().paused == []
    assert h.scheduler.snapshot(h.now)["keeping_paused"] == [str(W0)]


@pytest.mark.parametrize("case", ["off", "paused ones lost", "running ones lose"])
def test_a_rank_that_loses_them_or_without_the_parameter_pauses_as_usual(case: str) -> None:
    h = _keeping(None if case == "off" else 0.4, lost=500 if case == "paused ones lost" else 0)
    over_threshold_on_w0(h)
    if case == "running ones lose":
        h.scheduler.cache_loss.observe(W0, 1_000, 500)
    assert h.tick().paused[:1] == ["small"]
    assert h.scheduler.snapshot(h.now)["keeping_paused"] == []


def test_a_mark_set_before_the_rank_was_seen_to_keep_them_lapses() -> None:
    h = _keeping(measured=False)
    h.workers({W0: 10_000})
    h.acting_on("big", W0, 8_000)
    rid, _ = h.turn("r", 1_000)  # REASONING: marked, not paused, under pressure
    h.turn("big", 8_800)
    assert "r" in h.tick().marked
    _resumes_found(h, 1_000)
    assert "r" not in h.complete(rid, 1_000).paused
    assert not h.program("r").marked_for_pause


def test_continuing_turns_losing_their_cache_make_the_rank_judged_afresh() -> None:
    h = _keeping()
    over_threshold_on_w0(h)
    assert h.scheduler.keeps_paused(W0)
    rid, _ = h.turn("big", 9_000)  # a continuing turn that found only half its prompt
    h.scheduler.completed(rid, 9_000, h.now, 4_400)
    assert h.scheduler.resume_loss.turns(W0) == 0  # the old verdict is forgotten
    h.scheduler.cache_loss.observe(W0, 100_000, 100_000)  # the loss dips again ...
    assert not h.scheduler.keeps_paused(W0)  # ... and fresh resumes must show it first
    assert h.tick().paused[:1] == ["small"]


def test_a_waiting_turn_runs_at_home_where_the_engine_keeps_paused_programs() -> None:
    for limit, runs in ((0.4, True), (None, False)):
        h = _keeping(limit, measured=False)
        rid = waiting_turn_on_w0(h)  # paused before anything was measured
        _resumes_found(h, 1_000)
        assert h.scheduler.table.usage(W0) > 10_000
        d = h.tick()
        assert (Release(rid, W0) in d.released) is runs, limit
        assert h.scheduler.counters["released_evicting"] == int(runs)


def test_a_reload_keeps_what_was_measured() -> None:
    h = _keeping(None)
    over_threshold_on_w0(h)
    h.scheduler.reconfigure(
        h.scheduler.params.model_copy(update={"pause_min_resume_loss": 0.4}))
    assert h.scheduler.resume_loss.turns(W0) == KEEPS_PAUSED_MIN_RESUMES
    assert h.tick().paused == []


def test_a_worker_that_leaves_takes_its_measurement_with_it() -> None:
    h = _keeping()
    h.workers({W0: 10_000})
    h.workers({W1: 10_000})
    assert h.scheduler.resume_loss.turns(W0) == 0


@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_the_limit_is_a_share_above_zero(value: float) -> None:
    with pytest.raises(ValidationError, match="pause_min_resume_loss"):
        ThunderAgentParameters(pause_min_resume_loss=value)
