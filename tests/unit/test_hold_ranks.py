"""The hold per worker/rank (``acting_hold_min_cache_loss``): a rank holds room for programs
back from short tools only once such programs, not held there, lose their cache."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dynamo_thunderagent.config import ThunderAgentParameters
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.scheduler import HOLD_MIN_TURNS, HOLD_PROBE_TURNS, Release

from .conftest import W0, W1, Harness, make

START = 0.2  # acting_hold_min_cache_loss in these tests


def _harness(**params: object) -> Harness:
    """One 1,000-token rank whose whole pool re-prefills in 20 s (the hold of factor 1 is
    20 s), costs measured and the hold set (a tick) before anything runs."""
    base: dict[str, object] = dict(buffer_per_program=0, acting_decay_tau_seconds=1,
                                   pause_min_recompute_ratio=0, acting_hold_factor=1.0,
                                   acting_hold_min_cache_loss=START)
    h = make(**{**base, **params})
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02, decode_seconds=1.0))
    h.tick()
    return h


def _continuing_turn(h: Harness, session: str, tokens: int, cached: int) -> None:
    """A turn of ``session`` that continues on W0, the engine finding ``cached`` tokens."""
    rid, d = h.turn(session, tokens)
    assert isinstance(d.outcome(rid), Release)
    h.scheduler.sent(rid, W0, h.now)
    h.scheduler.completed(rid, tokens, h.now, cached)


def _back_from_a_tool(h: Harness, session: str, gap: float, tokens: int) -> None:
    """``session`` runs a turn on W0, comes back after ``gap`` s, runs a second turn of
    ``tokens`` (all of its first prompt found cached) and is ACTING again."""
    h.acting_on(session, W0, tokens // 2)
    h.advance(gap)
    _continuing_turn(h, session, tokens, cached=tokens // 2)


def _holdable_turns(h: Harness, turns: int, cached_share: float,
                    session: str = "looper", gap: float = 2.0) -> None:
    """``session`` (40 tokens) runs ``turns`` continuing turns on W0, ``gap`` s apart, each
    finding ``cached_share`` of its previous prompt cached."""
    if session not in h.scheduler.table.programs:
        h.acting_on(session, W0, 40)
    for _ in range(turns):
        h.advance(gap)
        _continuing_turn(h, session, 40, cached=round(40 * cached_share))


def _waiting_turn_released_after(h: Harness) -> float:
    """An agent back from 2 s tools fills W0 (900 tokens); another program's 500-token
    turn waits for room. Seconds into the agent's tool when that turn is released."""
    _back_from_a_tool(h, "agent", gap=2.0, tokens=900)
    rid, d = h.turn("other", 500)
    assert d.outcome(rid) is None  # no room while the agent's tool runs
    waited = 0.0
    while waited < 60:
        h.advance(5)
        waited += 5
        if isinstance(h.tick().outcome(rid), Release):
            return waited
    raise AssertionError("the waiting turn was never released")


def test_a_rank_whose_engine_keeps_every_returning_prefix_does_not_hold() -> None:
    h = _harness()
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 20.0
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=1.0)
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []
    # Nothing lost on W0: the agent's room decays at once, as without the hold.
    assert _waiting_turn_released_after(h) == 5
    assert h.scheduler.counters["hold_starts"] == 0


def test_a_rank_holds_once_programs_the_hold_would_cover_lose_their_cache() -> None:
    h = _harness()
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=0.5)
    assert h.scheduler.holdable_loss.loss_ratio(W0) == pytest.approx(0.5)
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == [str(W0)]
    assert h.scheduler.counters["hold_starts"] == 1
    # Held: the agent keeps its room for the 20 s hold, then it decays.
    assert _waiting_turn_released_after(h) == 25


def test_too_few_turns_or_too_little_loss_do_not_start_a_hold() -> None:
    h = _harness()
    _holdable_turns(h, HOLD_MIN_TURNS - 1, cached_share=0.0)  # all lost, but too few
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []
    h = _harness()
    _holdable_turns(h, 2 * HOLD_MIN_TURNS, cached_share=1 - START / 2)  # below the level
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []


def test_programs_back_from_long_tools_do_not_count() -> None:
    h = _harness()
    # Twice 30 s is past the 20 s hold: the hold would not keep their room anyway.
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=0.0, gap=30.0)
    assert h.scheduler.cache_loss.loss_ratio(W0) == 1.0  # the engine's meter counts them
    assert h.scheduler.holdable_loss.loss_ratio(W0) is None  # the hold's does not
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []


def test_without_a_minimum_loss_every_rank_holds() -> None:
    h = _harness(acting_hold_min_cache_loss=None)
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] is None
    assert _waiting_turn_released_after(h) == 25


def test_a_holding_rank_measures_again_after_its_probe_turns() -> None:
    h = _harness()
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=0.0)
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == [str(W0)]
    # Held turns teach the meter nothing (the hold keeps their cache): they only count.
    _holdable_turns(h, HOLD_PROBE_TURNS - 1, cached_share=1.0)
    assert h.scheduler.holdable_loss.turns(W0) == HOLD_MIN_TURNS
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == [str(W0)]
    _holdable_turns(h, 1, cached_share=1.0)
    h.tick()  # probe: it stops, forgets, and measures again without holding
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []
    assert h.scheduler.holdable_loss.loss_ratio(W0) is None
    assert (h.scheduler.counters["hold_starts"], h.scheduler.counters["hold_stops"]) == (1, 1)
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=1.0)  # the agents changed: nothing lost
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == []


def test_a_reload_keeps_the_holding_ranks_and_one_without_the_level_holds_everywhere() -> None:
    h = _harness()
    _holdable_turns(h, HOLD_MIN_TURNS, cached_share=0.0)
    h.tick()
    params = h.scheduler.params
    h.scheduler.reconfigure(params)
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] == [str(W0)]
    assert h.scheduler.counters["hold_stops"] == 0
    h.scheduler.reconfigure(params.model_copy(update={"acting_hold_min_cache_loss": None}))
    assert h.scheduler.snapshot(h.now)["acting_hold_ranks"] is None


def test_a_rank_that_leaves_takes_what_it_measured_with_it() -> None:
    h = _harness()
    h.workers({W0: 1_000, W1: 1_000})
    _holdable_turns(h, 3, cached_share=0.0)
    assert h.scheduler.holdable_loss.loss_ratio(W0) == 1.0
    h.workers({W1: 1_000})
    assert h.scheduler.holdable_loss.loss_ratio(W0) is None
    assert h.scheduler.snapshot(h.now)["holdable_loss"] == {}


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_the_level_must_be_a_share(value: float) -> None:
    with pytest.raises(ValidationError, match="acting_hold_min_cache_loss"):
        ThunderAgentParameters(acting_hold_factor=1.0, acting_hold_min_cache_loss=value)


def test_the_level_without_a_hold_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        ThunderAgentParameters(acting_hold_min_cache_loss=0.05)
    message = str(info.value)
    assert "acting_hold_min_cache_loss" in message and "acting_hold_factor" in message
