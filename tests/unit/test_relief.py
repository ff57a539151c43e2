"""Whether the pause rule pauses on a worker/rank now, and if not why (``pressure.RELIEF``):
what /state's ``ranks[...].pausing`` and ``top`` show, so that a rank over its threshold
that pauses nobody says which gate holds it."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_thunderagent.cache_loss import KEEPS_PAUSED_MIN_RESUMES
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.pressure import RELIEF

from .conftest import W0, W1, Harness, make, over_threshold_on_w0


def relief(h: Harness, worker: Any = W0) -> str:
    ranks: dict[str, dict[str, Any]] = h.scheduler.snapshot(h.now)["ranks"]  # type: ignore[assignment]
    said = ranks[str(worker)]["pausing"]
    assert said == h.scheduler.relief(worker, h.now) and said in RELIEF
    return said


def _over(**params: Any) -> Harness:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, **params)
    over_threshold_on_w0(h)
    return h


def test_a_rank_over_its_threshold_pauses_then_is_under_it() -> None:
    h = _over()
    assert relief(h) == "pausing"
    assert h.tick().paused[:1] == ["small"]
    assert relief(h) == "under_threshold"


def test_a_rank_whose_pauses_do_not_pay_says_so() -> None:
    h = _over(pause_min_recompute_ratio=0.5)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-7, decode_seconds=1.0))
    assert relief(h) == "pause_does_not_pay"
    assert h.tick().paused == []  # what it says is what the rule does
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    assert relief(h) == "pausing"


def test_programs_that_only_just_became_active_are_kept() -> None:
    h = _over(min_residency_seconds=60)
    assert relief(h) == "min_residency"
    assert h.tick().paused == []
    h.advance(61)
    assert relief(h) == "pausing"


def test_an_engine_that_keeps_paused_programs_or_loses_no_cache_is_named() -> None:
    h = _over(pause_min_resume_loss=0.4)
    for _ in range(KEEPS_PAUSED_MIN_RESUMES):
        h.scheduler.resume_loss.observe(W0, 1_000, 1_000)
    assert relief(h) == "engine_keeps_paused"
    h = _over(pause_min_cache_loss=0.2)
    h.scheduler.cache_loss.observe(W0, 1_000, 1_000)  # continuing turns lost nothing
    assert relief(h) == "no_cache_loss"
    assert h.tick().paused == []


def test_a_rank_without_a_capacity_card_has_no_verdict_in_state() -> None:
    h = make()
    h.workers({W0: 10_000}, live={0, 1})  # W1 serves, but has no card
    h.acting_on("a", W0, 1_000)
    assert relief(h) == "under_threshold"
    assert h.scheduler.relief(W1, h.now) == "no_capacity_card"
    ranks = h.scheduler.snapshot(h.now)["ranks"]
    assert str(W1) not in ranks or "pausing" not in ranks[str(W1)]  # type: ignore[operator,index]


@pytest.mark.parametrize("rule", ["parity", "upstream"])
def test_every_pause_rule_answers(rule: str) -> None:
    h = _over(pause_rule=rule)
    assert relief(h) == "pausing"
    h.tick()
    assert relief(h) == "under_threshold"


def test_a_rank_whose_marked_programs_will_drain_it_says_so() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9)
    h.workers({W0: 10_000})
    h.acting_on("tiny", W0, 50)
    h.acting_on("small", W0, 1_000)
    h.acting_on("big", W0, 8_000)
    h.turn("big", 8_800)  # REASONING, in flight
    h.turn("small", 1_100)  # REASONING, in flight: 9,950 > 9,500
    assert relief(h) == "pausing"
    d = h.tick()  # "tiny" pauses, "small" is marked: 9,900 less its 1,100 is below 9,000
    assert d.paused == ["tiny"] and h.program("small").marked_for_pause
    assert relief(h) == "marked"  # still over the threshold, but the mark will drain it
    assert h.tick().paused == [] and not h.program("big").marked_for_pause
