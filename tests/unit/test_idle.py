"""Idle programs: who holds a new program back, idle horizons, dormancy, per-session bounds."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_thunderagent.idle import MIN_EVIDENCE, ReturnEvidence, idle_horizon
from dynamo_thunderagent.program import Lifecycle, Phase, Program
from dynamo_thunderagent.scheduler import Reject, Release

from .conftest import W0, Harness, make


def idle_harness(**extra: Any) -> Harness:
    params: dict[str, Any] = dict(buffer_per_program=0, acting_decay_tau_seconds=1e9,
                                  idle_horizon_factor=3.0, idle_horizon_min_seconds=0.5,
                                  resume_on_events=True)
    params.update(extra)
    return make(**params)


def released(d: Any, rid: str) -> bool:
    return isinstance(d.outcome(rid), Release)


def agent_step(h: Harness, session: str, tokens: int, gap: float) -> None:
    """One more turn of an ACTING program ``gap`` seconds after its previous one ended."""
    h.advance(gap)
    rid, d = h.turn(session, tokens)
    assert released(d, rid), f"{session} was deferred"
    h.complete(rid, tokens)


def test_an_idle_paused_program_does_not_hold_back_a_new_one(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    rid, _ = h.turn("a", 990)  # sticky: its next turn takes W0 over the threshold
    h.complete(rid, 990)
    h.tick()  # over the threshold: the idle ACTING program is paused
    assert h.state("a") == (Phase.ACTING, Lifecycle.PAUSED)
    rid, d = h.turn("new", 100)
    assert released(d, rid), "a paused program with no waiting turn held a new one back"


def test_a_program_waiting_for_room_still_holds_new_ones_back(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    big, d = h.turn("big", 900)
    assert d.outcome(big) is None
    rid, d = h.turn("small", 10)
    assert d.outcome(rid) is None  # no queue jumping past a waiting turn


def test_a_one_turn_program_gives_way_to_a_new_one_once_past_its_horizon() -> None:
    h = idle_harness()
    h.workers({W0: 1_000})
    h.acting_on("chat", W0, 900)  # one turn, no evidence that anyone ever comes back
    rid, d = h.turn("next", 500)
    assert d.outcome(rid) is None, "within its horizon the idle program keeps its room"
    h.scheduler.aborted(rid, h.now)
    h.advance(0.6)  # past the minimum horizon
    rid, d = h.turn("next2", 500)
    assert released(d, rid) and d.outcome(rid).worker == W0  # type: ignore[union-attr]
    assert h.state("chat") == (Phase.ACTING, Lifecycle.PAUSED)
    assert h.scheduler.counters["idle_pauses"] == 1  # counted apart from pressure pauses
    assert "chat" in h.scheduler.table.programs  # retained: a late return is still known


def test_an_agent_in_a_tool_call_keeps_its_room_within_its_horizon() -> None:
    h = idle_harness()
    h.workers({W0: 1_000})
    h.acting_on("agent", W0, 400)
    for _ in range(3):
        agent_step(h, "agent", 450, gap=2.0)  # it comes back every 2 s
    h.advance(5.0)  # a 5 s tool call: within 3 x 2 s
    rid, d = h.turn("new", 600)
    assert d.outcome(rid) is None
    assert h.state("agent") == (Phase.ACTING, Lifecycle.ACTIVE)
    h.scheduler.aborted(rid, h.now)
    h.advance(1.5)  # 6.5 s idle: past its horizon, now dormant
    rid, d = h.turn("new2", 600)
    assert released(d, rid)
    assert h.state("agent") == (Phase.ACTING, Lifecycle.PAUSED)


def test_a_dormant_program_returning_is_resumed_at_once_when_there_is_room() -> None:
    h = idle_harness(resume_affinity=True)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    h.advance(0.6)
    rid, d = h.turn("b", 500)  # no room: dormant "a" gives way
    assert released(d, rid) and h.program("a").lifecycle is Lifecycle.PAUSED
    h.complete(rid, 500)
    h.final("b")
    h.advance(3.0)
    rid, d = h.turn("a", 520)  # it comes back late: resumed now, not at the next tick
    assert released(d, rid) and d.outcome(rid).worker == W0  # type: ignore[union-attr]
    assert h.program("a").lifecycle is Lifecycle.ACTIVE


def test_idle_paused_programs_are_not_resumed_ahead_of_their_turn() -> None:
    h = idle_harness()
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    h.advance(1.0)
    rid, d = h.turn("b", 500)
    assert released(d, rid) and h.program("a").lifecycle is Lifecycle.PAUSED
    h.complete(rid, 500)
    d = h.tick()  # room below the resume level, but "a" has no turn waiting
    assert not d.resumed and h.program("a").lifecycle is Lifecycle.PAUSED


def test_pressure_pauses_dormant_programs_before_agents_in_a_tool_call() -> None:
    h = idle_harness()
    h.workers({W0: 1_000})
    h.acting_on("gone", W0, 300)  # smallest: parity would pause it last... or first
    h.advance(1.0)
    h.acting_on("agent", W0, 200)
    agent_step(h, "agent", 250, gap=0.1)
    h.advance(0.1)
    rid, _ = h.turn("agent", 700)  # sticky, pushes W0 over the threshold
    h.complete(rid, 700)
    h.tick()
    assert h.program("gone").lifecycle is Lifecycle.PAUSED
    assert h.program("agent").lifecycle is Lifecycle.ACTIVE
    assert h.scheduler.counters["idle_pauses"] == 1


def test_one_turn_programs_are_not_expected_back_when_recent_ones_never_returned() -> None:
    evidence = ReturnEvidence()
    program = Program("p", seq=1, steps=1)
    evidence.observe_gap(2.0)  # one program once came back after 2 s
    assert idle_horizon(program, evidence, factor=3.0, minimum=0.0, maximum=100.0) == 6.0
    for _ in range(MIN_EVIDENCE * 2):
        evidence.first_idle_ended(returned=False)
    assert evidence.return_rate == 0.0
    assert idle_horizon(program, evidence, factor=3.0, minimum=0.5, maximum=100.0) == 0.5
    program.max_gap = 10.0  # its own history wins over the population
    assert idle_horizon(program, evidence, factor=3.0, minimum=0.5, maximum=100.0) == 30.0
    assert idle_horizon(program, evidence, factor=3.0, minimum=0.5, maximum=20.0) == 20.0


def test_returns_and_late_returns_are_counted_as_evidence() -> None:
    h = idle_harness()
    h.workers({W0: 100_000})
    for i in range(MIN_EVIDENCE):
        h.acting_on(f"one-{i}", W0, 100)
    h.advance(1.0)
    h.tick()  # every first idle passed its 0.5 s horizon: counted as gone
    assert h.scheduler.idle.evidence.return_rate == 0.0
    agent_step(h, "one-0", 150, gap=0.0)  # one came back after all
    rate = h.scheduler.idle.evidence.return_rate
    assert rate is not None and 0.1 < rate < 0.2
    assert h.program("one-0").max_gap > 0.0


def test_a_session_cannot_queue_more_than_max_turns_per_session() -> None:
    h = make(buffer_per_program=0, max_turns_per_session=3)
    h.workers({W0: 10_000})
    outcomes = [h.turn("greedy", 10) for _ in range(4)]
    rid, d = outcomes[-1]
    reject = d.outcome(rid)
    assert isinstance(reject, Reject)
    assert "max_turns_per_session=3" in reject.reason and "greedy" in reject.reason
    other, d = h.turn("polite", 10)
    assert released(d, other)  # others are unaffected
    assert len(h.scheduler.table.requests) == 4


def test_oldest_idle_program_is_evicted_even_after_it_was_busy_again() -> None:
    h = make(buffer_per_program=0, max_tracked_requests=3)
    h.workers({W0: 100_000})
    for name in ("a", "b", "c"):
        h.acting_on(name, W0, 10)
        h.advance(1.0)
    agent_step(h, "a", 20, gap=0.0)  # "a" is now the most recently active
    h.turn("d", 10)
    assert set(h.scheduler.table.programs) == {"a", "c", "d"}
    assert h.scheduler.counters["evicted"] == 1


def test_a_programs_gaps_are_smoothed_newest_weighted_by_gap_smoothing() -> None:
    from dynamo_thunderagent.idle import GAP_SMOOTHING

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9)
    h.workers({W0: 10_000})
    h.acting_on("a", W0, 100)
    assert h.program("a").gap_ewma == 0.0  # not back yet
    for gap in (2.0, 4.0):
        h.advance(gap)
        h.acting_on("a", W0, 100)
    # In log space: a geometric mean, so a long gap moves it by a factor, not by its size.
    assert h.program("a").gap_ewma == pytest.approx(2.0 ** (1 - GAP_SMOOTHING)
                                                    * 4.0 ** GAP_SMOOTHING)
    assert h.program("a").max_gap == 4.0


def test_a_gap_of_zero_counts_as_the_floor_and_leaves_the_smoothed_gap_a_number() -> None:
    from dynamo_thunderagent.idle import GAP_FLOOR_SECONDS, smoothed_gap

    assert smoothed_gap(0.0, 0.0) == GAP_FLOOR_SECONDS  # the first gap, back at once
    after = smoothed_gap(GAP_FLOOR_SECONDS, 10.0)
    assert GAP_FLOOR_SECONDS < after < 10.0
    assert smoothed_gap(after, 0.0) < after
