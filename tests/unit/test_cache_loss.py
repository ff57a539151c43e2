"""Does the engine evict at all: the cache-loss meter and what the scheduler feeds it."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_thunderagent.cache_loss import CacheLossMeter, expected_cached
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.decisions import EventKind
from dynamo_thunderagent.dynamo.translate import StreamTracker
from dynamo_thunderagent.program import PrefixBlocks, WorkerKey
from dynamo_thunderagent.scheduler import Decisions, Release

from .conftest import W0, W1, Harness, make, over_threshold_on_w0, waiting_turn_on_w0

W = WorkerKey(7, 1)


def test_expected_cache_is_the_previous_prompt_in_whole_blocks() -> None:
    assert expected_cached(1_000, 1_500, 16) == 992  # 62 full blocks
    assert expected_cached(1_000, 1_000, 16) == 992  # the same prompt again
    assert expected_cached(1_000, 400, 16) == 0  # compaction: a new, shorter prefix
    assert expected_cached(0, 400, 16) == 0  # no previous turn here
    assert expected_cached(1_000, 1_500, 0) == 0  # no card: block size unknown


def test_loss_ratio_follows_recent_turns_and_is_unknown_before_any() -> None:
    meter = CacheLossMeter(alpha=0.5)
    assert meter.loss_ratio(W) is None
    meter.observe(W, 1_000, 1_000)
    assert meter.loss_ratio(W) == 0.0
    meter.observe(W, 1_000, 0)  # everything evicted
    # decayed sums: expected 0.5 x 1000 + 1000, lost 0 + 1000
    assert meter.loss_ratio(W) == pytest.approx(1_000 / 1_500)
    meter.observe(W, 1_000, 5_000)  # more cached than expected (shared prefix): no loss
    assert meter.loss_ratio(W) == pytest.approx(500 / 1_750)
    meter.observe(W, 0, 0)  # nothing expected: not a sample
    assert meter.snapshot()[str(W)]["turns"] == 3
    meter.forget(W)
    assert meter.loss_ratio(W) is None and meter.snapshot() == {}


def _continuing_turn(h: Harness, session: str, tokens: int, cached: int | None) -> str:
    rid, d = h.turn(session, tokens)
    assert isinstance(d.outcome(rid), Release)
    h.scheduler.sent(rid, W0, h.now)
    h.scheduler.completed(rid, tokens + 10, h.now, cached)
    return rid


def test_a_sticky_continuing_turn_reports_what_the_engine_lost(h: Harness) -> None:
    h.workers({W0: 100_000})
    h.acting_on("s", W0, 1_000)
    _continuing_turn(h, "s", 1_500, cached=1_000)  # block size 1 in the harness
    assert h.scheduler.cache_loss.loss_ratio(W0) == 0.0
    _continuing_turn(h, "s", 2_000, cached=500)  # 1,000 of the 1,500 expected are gone
    ratio = h.scheduler.cache_loss.loss_ratio(W0)
    assert ratio is not None and ratio > 0.0
    assert h.scheduler.snapshot(h.now)["cache_loss"][str(W0)]["turns"] == 2


def test_no_expectation_without_usage_after_a_pause_or_after_a_move(h: Harness) -> None:
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("s", W0, 1_000)
    # The engine did not say what it found cached: nothing is learned.
    _continuing_turn(h, "s", 1_200, cached=None)
    assert h.scheduler.cache_loss.loss_ratio(W0) is None
    assert h.program("s").resident_prompt_tokens == 1_200
    # Paused since its last turn (pressure): the engine is free to evict it.
    h.acting_on("big", W0, 9_000)
    assert "s" in h.tick().paused
    assert h.program("s").resident_prompt_tokens == 0
    # Moved: the KV router served the turn on another worker/rank, where nothing of the
    # program was cached; its loss there is not the engine's eviction.
    h.acting_on("m", W1, 1_000)
    rid, _ = h.turn("m", 1_200)
    h.scheduler.sent(rid, W0, h.now)
    assert h.program("m").resident_prompt_tokens == 0
    h.scheduler.completed(rid, 1_210, h.now, 0)
    assert h.scheduler.cache_loss.loss_ratio(W0) is None


def test_the_completed_event_carries_what_the_engine_found_cached() -> None:
    tracker = StreamTracker("r1", 300)
    events = tracker.observe({
        "token_ids": [5], "finish_reason": "stop",
        "completion_usage": {"prompt_tokens": 300, "completion_tokens": 1,
                             "prompt_tokens_details": {"cached_tokens": 256}},
    })
    completed = events[-1]
    assert getattr(completed, "cached_tokens", None) == 256


def test_a_rank_whose_engine_keeps_its_cache_pauses_no_one() -> None:
    h = make(pause_min_cache_loss=0.1, buffer_per_program=0)
    over_threshold_on_w0(h)
    h.scheduler.cache_loss.observe(W0, 1_000, 1_000)  # continuing turns found it all
    assert h.tick().paused == []


def test_a_rank_whose_engine_evicts_pauses_as_usual() -> None:
    h = make(pause_min_cache_loss=0.1, buffer_per_program=0)
    over_threshold_on_w0(h)
    h.scheduler.cache_loss.observe(W0, 1_000, 500)
    assert h.tick().paused[:1] == ["small"]


def test_before_any_continuing_turn_or_without_the_parameter_usage_alone_decides() -> None:
    for params in ({"pause_min_cache_loss": 0.1}, {}):
        h = make(buffer_per_program=0, **params)
        over_threshold_on_w0(h)
        if not params:
            h.scheduler.cache_loss.observe(W0, 1_000, 1_000)  # measured, but not asked
        assert h.tick().paused[:1] == ["small"]


def test_a_reload_keeps_what_was_measured_and_the_new_rule_reads_it() -> None:
    h = make(buffer_per_program=0)
    over_threshold_on_w0(h)
    h.scheduler.cache_loss.observe(W0, 1_000, 1_000)
    h.scheduler.reconfigure(h.scheduler.params.model_copy(update={"pause_min_cache_loss": 0.1}))
    assert h.scheduler.cache_loss.loss_ratio(W0) == 0.0
    assert h.tick().paused == []


# ---- hold_max_cache_loss: hold turns back only where holding keeps a cache ----------------

def _holding(limit: float | None = 0.5, **extra: Any) -> Harness:
    params = {} if limit is None else {"hold_max_cache_loss": limit}
    return make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9,
                **params, **extra)


def test_a_waiting_turn_runs_at_home_where_the_engine_evicts_anyway() -> None:
    h = _holding()
    waiting_turn_on_w0(h)
    assert h.scheduler.table.usage(W0) > 10_000
    h.scheduler.cache_loss.observe(W0, 1_000, 200)  # the engine lost 80% of what was expected
    d = h.tick()
    assert ("small", W0) in d.resumed
    assert [r.worker for r in d.released] == [W0]
    assert h.scheduler.counters["released_evicting"] == 1
    assert h.scheduler.snapshot(h.now)["counters"]["released_evicting"] == 1


def test_a_waiting_turn_waits_where_the_engine_keeps_its_cache_or_without_the_parameter() -> None:
    for limit, found in ((0.5, 1_000),  # nothing lost
                         (0.5, 600),  # 40% lost: under the limit
                         (None, 0)):  # everything lost, but the rule is off (parity)
        h = _holding(limit)
        waiting_turn_on_w0(h)
        h.scheduler.cache_loss.observe(W0, 1_000, found)
        d = h.tick()
        assert d.resumed == [] and d.released == [], (limit, found)
        assert h.scheduler.counters["released_evicting"] == 0


def test_a_waiting_turn_waits_on_a_rank_within_its_capacity_or_not_yet_measured() -> None:
    h = _holding()
    waiting_turn_on_w0(h)
    assert h.tick().resumed == []  # over capacity, but no continuing turn measured there yet
    h = _holding()
    waiting_turn_on_w0(h, b_tokens=4_800)  # 9,800: no room, within the capacity
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    assert h.tick().resumed == []


def _let_in_then_another_waits(**params: Any) -> tuple[Harness, str]:
    """W0 (10,000) over its capacity with "a" and "b" running and losing 80% of its cache:
    "small"'s waiting turn is let in without room (on its own event: no tick marks anyone
    here). Then "a" comes back smaller (compacted), so W0 holds 10,500 with "small" and
    9,300 without, and "s2", paused with "small", sends a turn (its request id is
    returned)."""
    h = _holding(resume_on_events=True, **params)
    h.workers({W0: 10_000})
    for session, tokens in (("small", 1_000), ("s2", 1_100), ("a", 3_000), ("b", 3_000)):
        h.acting_on(session, W0, tokens)
    a_turn, _ = h.turn("a", 5_000)  # sticky: 10,100 > 9,500
    assert h.tick().paused == ["small", "s2"]  # smallest first, down to 9,000
    h.turn("b", 5_500)  # sticky: 10,500, past the capacity
    h.scheduler.cache_loss.observe(W0, 1_000, 200)  # the engine lost 80% of what was expected
    _, d = h.turn("small", 1_200)
    assert ("small", W0) in d.resumed and h.scheduler.counters["released_evicting"] == 1
    h.scheduler.sent(a_turn, W0, h.now)
    h.complete(a_turn, 5_010)
    h.turn("a", 3_800)  # a compaction: a new, shorter prompt, sticky
    assert h.scheduler.table.usage(W0) == 10_500
    rid, _ = h.turn("s2", 1_300)
    return h, rid


def test_a_rank_over_its_capacity_only_by_the_turns_it_let_in_does_not_evict_anyway() -> None:
    h, rid = _let_in_then_another_waits(hold_excludes_let_in=True)
    assert all(r.request_id != rid for r in h.log[-1].released)
    state = h.scheduler.snapshot(h.now)
    assert state["let_in_tokens"] == {str(W0): 1_200} and state["evicting_anyway"] == []
    assert all(r.request_id != rid for r in h.tick().released)
    assert h.scheduler.counters["released_evicting"] == 1


def test_without_hold_excludes_let_in_the_turns_let_in_keep_the_rank_evicting() -> None:
    h, rid = _let_in_then_another_waits()
    assert any(r.request_id == rid for r in h.log[-1].released)  # at once, on its event
    assert h.scheduler.snapshot(h.now)["evicting_anyway"] == [str(W0)]
    assert h.scheduler.counters["released_evicting"] == 2


def test_a_program_let_in_counts_again_once_it_pauses_moves_or_leaves() -> None:
    for leave in ("pause", "move", "final", "worker_gone"):
        h, _ = _let_in_then_another_waits(hold_excludes_let_in=True)
        scheduler = h.scheduler
        assert set(scheduler._let_in) == {"small"}
        small = h.program("small")
        if leave == "pause":
            scheduler._pause(small, h.now, Decisions())
        elif leave == "move":
            scheduler._move(small, W1, Decisions(), "placed")
        elif leave == "final":
            scheduler._drop(small, Decisions(), EventKind.ENDED, "session_final")
        else:
            h.workers({W0: 10_000}, live=set())
            h.tick()
            assert small.worker is None
        assert scheduler._let_in == {}, leave


def test_a_turn_let_in_on_another_rank_and_aborted_is_not_counted_where_it_returns() -> None:
    h, rid = _let_in_then_another_waits(hold_excludes_let_in=True)
    h.workers({W0: 10_000, W1: 10_000})
    scheduler, s2 = h.scheduler, h.program("s2")
    scheduler._resume(s2, W1, h.now, Decisions(), evicting=True)
    assert s2.worker == W1 and set(scheduler._let_in) == {"small", "s2"}
    h.abort(rid)  # nothing ran on W1: the program is back where its cache is
    assert s2.worker == W0 and set(scheduler._let_in) == {"small"}
    assert scheduler.let_in_usage() == {W0: 1_200}


def test_a_program_let_in_is_excluded_by_what_it_adds_not_by_the_prefix_it_shares() -> None:
    h = _holding(hold_excludes_let_in=True, shared_prefix_accounting=True)
    h.workers({W0: 10_000})
    system = PrefixBlocks(tuple(range(40)), 16)  # 640 tokens both prompts start with
    h.acting_on("a", W0, 1_000, prefix=system)
    h.acting_on("b", W0, 1_000, prefix=system)
    assert h.scheduler.table.usage(W0) == 2_000 - 640  # the shared prefix counted once
    h.scheduler._let_in["b"] = h.program("b")
    assert h.scheduler.let_in_usage() == {W0: 1_000 - 640}  # what "b" adds to W0


def test_a_new_program_held_back_runs_once_every_rank_evicts_anyway() -> None:
    for limit, runs in ((0.5, True), (None, False)):
        h = _holding(limit)
        waiting_turn_on_w0(h)
        h.scheduler.cache_loss.observe(W0, 1_000, 0)
        rid, d = h.turn("new", 500)
        assert d.outcome(rid) is None and "new" in d.paused  # no queue jumping
        assert (Release(rid, W0) in h.tick().released) is runs


def test_a_new_program_waits_while_some_rank_keeps_its_cache() -> None:
    h = _holding()
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("c", W1, 6_000)
    h.acting_on("d", W1, 3_000)
    waiting_turn_on_w0(h)
    h.turn("c", 6_500)
    h.turn("d", 4_000)  # sticky: W1 holds 10,500, past its capacity, ...
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    h.scheduler.cache_loss.observe(W1, 1_000, 1_000)  # ... but keeps its cache: holding pays
    assert h.scheduler.table.usage(W1) > 10_000
    rid, _ = h.turn("new", 500)
    assert all(r.request_id != rid for r in h.tick().released)
    h.scheduler.cache_loss.observe(W1, 1_000, 0)  # now W1 loses it too: nothing to protect
    assert any(r.request_id == rid for r in h.tick().released)


def test_a_release_waits_as_long_as_the_stall_its_re_prefill_causes() -> None:
    h = _holding(pause_min_recompute_ratio=0.0)  # every pause pays, priced by measured costs
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    waiting_turn_on_w0(h)
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    stall = h.scheduler.costs.stall_seconds(h.program("small").tokens, h.scheduler.batch)
    assert stall is not None and stall > 1.0
    assert h.tick().resumed == []  # waited 0 s: a release now would cost more than the wait
    h.advance(stall)
    assert ("small", W0) in h.tick().resumed


def test_a_waiting_turn_with_no_home_runs_once_every_rank_evicts_anyway() -> None:
    h = _holding()
    waiting_turn_on_w0(h)
    rid, d = h.turn("new", 500)  # W0 not measured yet: held back behind "small"
    assert d.outcome(rid) is None and h.program("new").worker is None
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    d = h.tick()
    assert {s for s, _ in d.resumed} >= {"small", "new"}
    assert Release(rid, W0) in d.released
    assert h.scheduler.counters["released_evicting"] == 2
    reasons = {e.program: e.reason for e in d.steps if e.kind.value == "resumed"}
    assert reasons["small"] == reasons["new"] == "evicting"


def test_a_reload_turns_the_release_on_with_what_was_measured() -> None:
    h = _holding(None)
    waiting_turn_on_w0(h)
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    assert h.tick().resumed == []
    h.scheduler.reconfigure(h.scheduler.params.model_copy(update={"hold_max_cache_loss": 0.5}))
    assert ("small", W0) in h.tick().resumed


def test_turns_with_no_home_spread_over_the_ranks_when_every_rank_evicts_anyway() -> None:
    h = _holding()
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("c", W1, 6_000)
    h.acting_on("d", W1, 3_000)
    waiting_turn_on_w0(h)  # W0: 10,500 held, "small" waiting
    h.turn("c", 6_000)
    h.turn("d", 4_300)  # sticky: W1 holds 10,300
    first, _ = h.turn("n1", 2_000)
    second, _ = h.turn("n2", 2_000)  # both held back behind "small" (no queue jumping)
    h.scheduler.cache_loss.observe(W0, 1_000, 0)
    h.scheduler.cache_loss.observe(W1, 1_000, 0)
    released = {r.request_id: r.worker for r in h.tick().released}
    # Both run, each where the most room is left once this pass's releases are booked:
    # the first on W1 (10,300 held against W0's 10,500), which its 2,000 then fill past
    # W0, so the second on W0. Read from the table alone, both would land on W1.
    assert released[first] == W1 and released[second] == W0


def test_a_rank_that_keeps_paused_caches_counts_the_turns_it_let_in() -> None:
    # No pause drains such a rank (pausing there saves nothing): leaving its let-in
    # turns out would hold the next turn back until resume_timeout.
    h, _ = _let_in_then_another_waits(hold_excludes_let_in=True, pause_min_resume_loss=0.5)
    scheduler = h.scheduler
    assert scheduler.evicting_anyway() == frozenset()  # not measured to keep anything yet
    scheduler.keeps_paused = lambda worker: worker == W0  # type: ignore[method-assign]
    assert scheduler.evicting_anyway() == {W0}
