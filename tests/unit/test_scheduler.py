"""Named behaviours of the ThunderAgent scheduler core (mission.md, parity baseline)."""

from __future__ import annotations

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.program import Lifecycle, Phase, RequestState, WorkerKey
from dynamo_thunderagent.scheduler import Reject, Release

from .conftest import W0, W1, W2, Harness, make, waiting_turn_on_w0


def released_to(d, rid):  # type: ignore[no-untyped-def]
    outcome = d.outcome(rid)
    assert isinstance(outcome, Release), f"{rid} not released: {outcome}"
    return outcome.worker


def test_turns_of_one_session_are_serialized(h: Harness) -> None:
    h.workers({W0: 10_000})
    r1, d1 = h.turn("a", 100)
    r2, d2 = h.turn("a", 150)
    assert released_to(d1, r1) == W0
    assert d2.outcome(r2) is None  # waits behind the first turn
    assert h.scheduler.table.requests[r2].state is RequestState.QUEUED
    d3 = h.complete(r1, 120)
    assert released_to(d3, r2) == W0
    assert h.program("a").tokens == 150


def test_sent_reassigns_program_to_the_worker_that_actually_served_it(h: Harness) -> None:
    h.workers({W0: 10_000, W1: 10_000})
    rid, d = h.turn("a", 100)
    assert released_to(d, rid) == W0
    h.scheduler.sent(rid, W1, h.now)
    assert h.program("a").worker == W1
    assert h.scheduler.table.usage(W1) == 100
    assert h.scheduler.table.usage(W0) == 0


def test_new_program_goes_to_least_used_worker_with_room(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000, W2: 500})
    h.acting_on("a", W0, 300)
    h.acting_on("b", W1, 100)
    rid, d = h.turn("c", 380)  # W2 is empty but 380 does not fit under 0.95 x 500 = 475? it does
    assert released_to(d, rid) == W2
    rid, d = h.turn("d", 200)  # W0 at 0.30, W1 at 0.10, W2 at 0.76 -> W1
    assert released_to(d, rid) == W1


def test_new_program_waits_while_any_program_is_paused(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 900)
    h.acting_on("b", W1, 900)
    r, d = h.turn("big", 900)  # fits nowhere: paused
    assert d.outcome(r) is None and h.state("big") == (Phase.REASONING, Lifecycle.PAUSED)
    h.complete("x", 0)  # unknown id: ignored
    h.scheduler.table.usage(W0)
    r2, d2 = h.turn("small", 10)  # would fit, but must not jump the queue
    assert d2.outcome(r2) is None
    assert h.program("small").lifecycle is Lifecycle.PAUSED


def test_cold_start_without_capacity_releases(h: Harness) -> None:
    rid, d = h.turn("a", 100_000)
    assert released_to(d, rid) is None
    h.scheduler.set_workers(frozenset({7}), {})  # live, but no card published yet
    rid2, d2 = h.turn("b", 100_000)
    assert released_to(d2, rid2) is None


def test_live_worker_without_capacity_card_keeps_its_programs(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 500)
    h.workers({}, live={0})  # the card is gone, the worker is still live
    h.tick()
    assert h.program("a").worker == W0
    rid, d = h.turn("a", 600)
    assert released_to(d, rid) == W0  # sticky


def test_stale_card_of_a_departed_worker_is_not_used(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000_000}, live={0})  # W1's card outlived its worker
    assert WorkerKey(1, 0) not in h.scheduler.capacity.known
    rid, d = h.turn("a", 100)
    assert released_to(d, rid) == W0
    rid, d = h.turn("b", 900)  # would fit only on the stale card
    assert d.outcome(rid) is None


def test_all_workers_gone_clears_assignments(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 100)
    h.acting_on("b", W1, 100)
    h.workers({}, live=set())
    d = h.tick()
    assert sorted(d.unassigned) == ["a", "b"]
    assert h.program("a").worker is None and h.program("b").worker is None
    assert h.scheduler.table.assigned_workers() == []


def test_pressure_pauses_smallest_acting_program_first_and_stops_at_pause_target(
    h: Harness,
) -> None:
    h.workers({W0: 10_000})
    for name, size in [("s1", 1_000), ("s2", 2_000), ("s3", 3_000), ("s4", 3_500)]:
        h.acting_on(name, W0, size)
    # 9,500 > 0.95 x 10,000? no: equal is not over. Grow one program past it.
    rid, _ = h.turn("s4", 3_600)
    h.complete(rid, 3_600)  # usage 9,600 > 9,500
    d = h.tick()
    # Pause s1 (9,600 -> 8,600), then s2 (-> 6,600 <= 8,000): stop.
    assert d.paused == ["s1", "s2"]
    assert h.scheduler.table.usage(W0) == 6_600


def test_pressure_on_one_rank_does_not_pause_programs_on_another(h: Harness) -> None:
    r0, r1 = WorkerKey(0, 0), WorkerKey(0, 1)
    h.workers({r0: 1_000, r1: 1_000})
    h.acting_on("hot1", r0, 500)
    h.acting_on("cold", r1, 100)
    h.acting_on("hot2", r0, 480)
    d = h.tick()
    assert "cold" not in d.paused
    assert d.paused == ["hot2"]


def test_equal_size_candidates_keep_a_stable_order(h: Harness) -> None:
    h.workers({W0: 2_000})
    for name in ["c", "a", "b"]:
        h.acting_on(name, W0, 320)
    h.workers({W0: 1_000})  # 960 > 950: one of three equal programs must pause
    assert h.tick().paused == ["c"]  # the first created, not the first alphabetically
    h.workers({W0: 2_000})
    assert h.tick().resumed == [("c", W0)]
    h.workers({W0: 1_000})
    assert h.tick().paused == ["c"]  # and again the same one


def test_reasoning_programs_are_marked_and_pause_at_their_tool_boundary(h: Harness) -> None:
    h.workers({W0: 2_000})
    rid_a, _ = h.turn("a", 900)
    rid_b, _ = h.turn("b", 500)
    h.workers({W0: 1_700})  # threshold 1,615, target 1,360
    rid_a_done = h.complete(rid_a, 1_300)
    assert not rid_a_done.paused
    rid_a, d = h.turn("a", 1_300)
    assert d.outcome(rid_a) is not None  # sticky
    d = h.tick()  # 1,800 > 1,615, no ACTING program: mark the smallest (b) -> 1,300 <= 1,360
    assert d.paused == [] and d.marked == ["b"]
    assert h.state("b") == (Phase.REASONING, Lifecycle.ACTIVE)  # nothing is preempted
    assert h.tick().marked == []  # already marked: not marked twice
    d = h.complete(rid_b, 520)
    assert d.paused == ["b"] and h.state("b") == (Phase.ACTING, Lifecycle.PAUSED)
    assert not h.program("a").marked_for_pause


def test_capacity_growth_resumes_a_waiting_program(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 800)
    rid, d = h.turn("b", 500)
    assert d.outcome(rid) is None
    h.workers({W0: 4_000})
    d = h.tick()
    assert released_to(d, rid) == W0
    assert d.resumed == [("b", W0)]


def test_resume_picks_waiting_turn_then_new_then_acting_each_smallest_first(
    h: Harness,
) -> None:
    h.workers({W0: 10_000})
    for name, size in [("act-big", 900), ("act-small", 800), ("wait-big", 700),
                       ("wait-small", 600)]:
        h.acting_on(name, W0, size)
    h.workers({W0: 1_000})  # 3,000 tokens, far over threshold: pause all ACTING programs
    assert sorted(h.tick().paused) == ["act-big", "act-small", "wait-big", "wait-small"]
    _rw_big, _ = h.turn("wait-big", 700)
    _rw_small, _ = h.turn("wait-small", 600)
    _rn_big, _ = h.turn("new-big", 500)
    _rn_small, _ = h.turn("new-small", 400)
    order = sorted(h.scheduler.table.paused(), key=lambda p: h.scheduler.planner.order(p, h.now))
    assert [p.session_id for p in order] == [
        "wait-small", "wait-big", "new-small", "new-big", "act-small", "act-big"]
    # Room for exactly the first three (600 + 700 + 400 = 1,700) at 0.85 x 2,000.
    h.workers({W0: 2_000})
    d = h.tick()
    assert sorted(s for s, _ in d.resumed) == ["new-small", "wait-big", "wait-small"]


def test_resume_packs_largest_first_onto_the_most_free_worker(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("x", W0, 800)
    h.acting_on("y", W1, 300)
    r_big, d = h.turn("big", 700)  # fits on neither rank: paused
    assert d.paused == ["big"]
    r_small, d = h.turn("small", 100)  # would fit, but waits behind the paused one
    assert d.paused == ["small"]
    h.final("x")  # W0 is free: room at the resume level is W0 850, W1 550
    d = h.tick()
    assert released_to(d, r_big) == W0  # largest first, onto the rank with most room
    assert released_to(d, r_small) == W1  # then W1 has most room (550 > 150)


def test_deferral_past_resume_timeout_is_force_released_on_worker_with_most_decayed_room() -> None:
    h = make(buffer_per_program=0, resume_timeout_seconds=60, acting_decay_tau_seconds=1e9)
    h.workers({W0: 1_000, W1: 1_200})
    h.acting_on("a", W0, 900)
    h.acting_on("b", W1, 1_000)
    rid, d = h.turn("c", 1_150)  # fits no rank while the others hold their room
    assert d.outcome(rid) is None
    h.advance(30)
    assert h.tick().outcome(rid) is None
    h.advance(31)
    d = h.tick()
    assert released_to(d, rid) == W1  # 200 tokens of room against W0's 100
    assert d.forced == ["c"]


@pytest.mark.parametrize("mode", ["queue", "alongside"])
def test_a_turn_queued_behind_a_wait_given_up_keeps_the_bound_on_its_wait(mode: str) -> None:
    # "p" is paused; its turn A waits for room, B queues behind it (in alongside mode too:
    # A is not running). A's client gives up after 115 s. B must still be released within
    # resume_timeout_seconds (120) of when A began to wait, plus a tick; before, B's wait
    # started over and it came in at 235 s.
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, resume_timeout_seconds=120,
             scheduler_interval_seconds=5, concurrent_turns=mode)
    h.workers({W0: 10_000})
    h.acting_on("p", W0, 1_000)
    h.acting_on("big", W0, 8_000)
    h.turn("big", 9_000)  # running: W0 past its threshold
    assert "p" in h.tick().paused
    a, d = h.turn("p", 1_200)
    assert d.outcome(a) is None
    h.advance(1)
    b, d = h.turn("p", 1_300)
    assert d.outcome(b) is None
    released_at = None
    while released_at is None and h.now < 400:
        h.advance(5)
        if h.now == 116:
            h.abort(a)
        if h.tick().outcome(b) is not None:
            released_at = h.now
    assert released_at is not None and released_at <= 120 + 5


def test_a_turn_finished_on_a_rank_that_left_before_the_tick_leaves_no_meter_behind() -> None:
    # W0 leaves while "a"'s turn runs there; the turn finishes (the worker drains) before a
    # tick unassigns "a". W0's meters were forgotten when it left: measuring that turn
    # brought them back, one entry per departed rank, for ever.
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_min_resume_loss=0.2)
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 300)
    rid, _ = h.turn("a", 400)
    h.scheduler.sent(rid, W0, h.now)
    assert h.scheduler.table.requests[rid].expected_cached
    h.workers({W1: 1_000}, live={1})
    h.scheduler.completed(rid, 410, h.now, cached_tokens=100)
    assert h.scheduler.cache_loss.turns(W0) == 0 and h.scheduler.resume_loss.turns(W0) == 0
    assert str(W0) not in h.scheduler.snapshot(h.now)["cache_loss"]


def test_a_program_larger_than_every_resume_level_resumes_once_a_rank_is_empty(
        h: Harness) -> None:
    h.workers({W0: 4_096})
    h.acting_on("a", W0, 300)
    big, d = h.turn("big", 3_600)  # within capacity, above the resume level (3,481)
    assert d.outcome(big) is None
    small, d = h.turn("small", 100)
    assert d.outcome(small) is None  # held back behind the waiting program
    h.final("a")
    d = h.tick()  # smallest first (parity): small runs, then W0 is empty again
    assert released_to(d, small) == W0 and d.outcome(big) is None
    h.complete(small, 120)
    h.final("small")
    d = h.tick()  # an empty rank: big goes there, not after resume_timeout
    assert released_to(d, big) == W0


def test_session_final_waits_for_in_flight_turn_then_frees_capacity(h: Harness) -> None:
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 600)
    frid, d = h.final("a")
    assert d.outcome(frid) is None  # waits for the turn
    assert h.scheduler.table.usage(W0) == 600
    d = h.complete(rid, 700)
    final = d.outcome(frid)
    assert isinstance(final, Release) and final.session_final
    assert "a" not in h.scheduler.table.programs
    assert h.scheduler.table.usage(W0) == 0


def test_a_second_session_final_while_the_first_waits_is_answered_at_once(h: Harness) -> None:
    # Before, it was refused ("already ending") while the first waited, and served after:
    # the same request answered 400 or 200 by timing alone.
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 600)
    frid, _ = h.final("a")
    again, d = h.final("a")
    second = d.outcome(again)
    assert isinstance(second, Release) and second.session_final
    assert again not in h.scheduler.table.requests
    assert h.program("a").final_request == frid  # the first still ends the session
    d = h.complete(rid, 700)
    assert isinstance(d.outcome(frid), Release)
    assert "a" not in h.scheduler.table.programs and h.scheduler.table.requests == {}


def test_abort_after_session_final_does_not_bring_the_program_back(h: Harness) -> None:
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 600)
    frid, _ = h.final("a")
    d = h.abort(rid)
    assert isinstance(d.outcome(frid), Release)
    for late in (h.abort(rid), h.complete(rid, 900), h.scheduler.sent(rid, W0, h.now)):
        assert not late.changed
    assert "a" not in h.scheduler.table.programs
    assert h.scheduler.table.usage(W0) == 0


def test_idle_programs_expire_after_session_retention() -> None:
    h = make(session_retention_seconds=100, buffer_per_program=0)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 100)
    h.advance(99)
    assert h.tick().expired == []
    h.advance(1)
    assert h.tick().expired == ["a"]
    assert h.scheduler.table.usage(W0) == 0


def test_max_tracked_requests_bounds_tracked_requests() -> None:
    h = make(max_tracked_requests=2)
    h.workers({W0: 100_000})
    h.turn("a", 10)
    h.turn("b", 10)
    rid, d = h.turn("c", 10)
    outcome = d.outcome(rid)
    assert isinstance(outcome, Reject) and "max_tracked_requests=2" in outcome.reason
    assert "c" not in h.scheduler.table.programs


def test_a_session_final_that_ends_its_program_at_once_is_never_refused_for_room() -> None:
    # Every slot taken by turns in flight: the final of an idle program, and of a session
    # with no program, take no slot and go through; the finished program's charge leaves
    # its rank. (Before, both got "retry later", and the idle program kept its charge.)
    h = make(max_tracked_requests=3)
    h.workers({W0: 100_000})
    h.acting_on("idle", W0, 500)
    for session in ("a", "a", "b"):  # a's second turn queues behind its first
        h.turn(session, 10)
    assert len(h.scheduler.table.requests) == 3 and len(h.scheduler.table.programs) == 3
    usage = h.scheduler.table.usage(W0)
    rid, d = h.final("idle")
    released = d.outcome(rid)
    assert isinstance(released, Release) and released.session_final
    assert "idle" not in h.scheduler.table.programs and d.removed == ["idle"]
    assert h.scheduler.table.usage(W0) <= usage - 500  # its tokens (and buffer) are off
    rid, d = h.final("nobody")
    assert isinstance(d.outcome(rid), Release)
    assert len(h.scheduler.table.requests) == 3  # the bound holds
    # The final of a program with a turn in flight must wait in the table: refused.
    rid, d = h.final("a")
    outcome = d.outcome(rid)
    assert isinstance(outcome, Reject) and "max_tracked_requests=3" in outcome.reason


def test_max_tracked_requests_evicts_oldest_idle_program_before_refusing_a_new_one() -> None:
    h = make(max_tracked_requests=2)
    h.workers({W0: 100_000})
    h.acting_on("old", W0, 10)
    h.advance(1)
    h.acting_on("newer", W0, 10)
    rid, d = h.turn("third", 10)
    assert isinstance(d.outcome(rid), Release)
    assert d.removed == ["old"]
    rid4, d4 = h.turn("fourth", 10)  # "newer" is idle, "third" is busy
    assert isinstance(d4.outcome(rid4), Release) and d4.removed == ["newer"]
    rid5, d5 = h.turn("fifth", 10)  # now two busy programs: nothing to evict
    assert isinstance(d5.outcome(rid5), Reject)


def test_aborted_admission_rolls_back_a_new_program(h: Harness) -> None:
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 500)
    h.abort(rid)
    assert "a" not in h.scheduler.table.programs
    assert h.scheduler.table.usage(W0) == 0


def test_cancelled_deferral_rolls_back_a_new_program(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    rid, d = h.turn("b", 500)
    assert d.outcome(rid) is None
    h.scheduler.aborted(rid, h.now)
    assert "b" not in h.scheduler.table.programs
    assert not h.scheduler.table.any_paused


def test_aborted_turn_of_a_known_program_keeps_it_acting(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 300)
    rid, _ = h.turn("a", 350)
    h.abort(rid)
    assert h.state("a") == (Phase.ACTING, Lifecycle.ACTIVE)


def test_terminal_event_may_arrive_without_sent(h: Harness) -> None:
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 300)
    h.complete(rid, 350)  # no Sent
    assert h.state("a") == (Phase.ACTING, Lifecycle.ACTIVE)
    assert h.program("a").tokens == 350 and h.program("a").steps == 1


def test_a_reused_request_id_cannot_read_or_revive_an_old_one(h: Harness) -> None:
    h.workers({W0: 1_000})
    rid, _ = h.turn("a", 300, request_id="req-1")
    _, dup = h.turn("b", 300, request_id="req-1")
    assert isinstance(dup.outcome("req-1"), Reject)  # while live: refused, not merged
    assert "b" not in h.scheduler.table.programs
    h.complete(rid, 320)
    h.final("a")
    assert "a" not in h.scheduler.table.programs
    # The id is free again: a new request under it starts a fresh program ...
    _, d = h.turn("c", 100, request_id="req-1")
    assert isinstance(d.outcome("req-1"), Release)
    # ... and a late Sent for the old request moves nothing of the old session.
    assert "a" not in h.scheduler.table.programs
    assert h.program("c").tokens == 100


def test_session_final_of_an_unknown_session_is_released_at_once(h: Harness) -> None:
    frid, d = h.final("never-seen")
    final = d.outcome(frid)
    assert isinstance(final, Release) and final.session_final
    assert h.scheduler.table.requests == {}


def test_an_aborted_turn_restores_the_program_as_it_was_before_the_turn(h: Harness) -> None:
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("a", W0, 320)
    acting_since = h.program("a").acting_since
    h.advance(2.0)
    rid, d = h.turn("a", 900)
    assert released_to(d, rid) == W0
    h.scheduler.sent(rid, W1, h.now)  # served elsewhere, then failed
    h.advance(1.0)
    h.abort(rid)
    program = h.program("a")
    assert (program.phase, program.tokens, program.worker) == (Phase.ACTING, 320, W0)
    assert program.acting_since == acting_since
    assert h.scheduler.table.usage(W0) == 320 and h.scheduler.table.usage(W1) == 0


def test_after_an_aborted_move_the_next_turn_home_expects_its_cache_there(h: Harness) -> None:
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("a", W0, 320)
    rid, _ = h.turn("a", 900)
    assert h.scheduler.table.requests[rid].expected_cached == 320
    h.scheduler.sent(rid, W1, h.now)  # moved with its turn: nothing expected on W1
    assert h.program("a").resident_prompt_tokens == 0
    h.abort(rid)  # back on W0, where its last prompt still is
    rid, d = h.turn("a", 1_000)
    assert released_to(d, rid) == W0
    assert h.scheduler.table.requests[rid].expected_cached == 320


def test_after_an_aborted_resumed_turn_the_next_one_still_measures_the_pause() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.9)
    rid = waiting_turn_on_w0(h)  # "small" paused with 1,000 tokens of prompt on W0
    assert h.program("small").paused_prompt_tokens == 1_000
    b_turn = h.program("b").current
    assert b_turn is not None
    h.complete(b_turn, 5_500)
    h.final("b")
    h.tick()  # room: "small" resumes home with its waiting turn
    assert h.program("small").lifecycle is Lifecycle.ACTIVE
    assert h.scheduler.table.requests[rid].expected_after_pause == 1_000
    h.abort(rid)
    rid, d = h.turn("small", 1_300)
    assert released_to(d, rid) == W0
    assert h.scheduler.table.requests[rid].expected_after_pause == 1_000


def _paused_while_w0_was_away(h: Harness) -> str:
    """"a" (300 tokens, last run on W0) has a turn waiting, paused, because W0 left before a
    tick unassigned it and W1 has no room; W0 is back. Returns the waiting turn's id."""
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 300)
    h.acting_on("b", W1, 900)
    h.workers({W1: 1_000}, live={1})
    rid, d = h.turn("a", 400)  # no room anywhere: paused, what it left on W0 remembered
    assert d.outcome(rid) is None and h.program("a").lifecycle is Lifecycle.PAUSED
    h.workers({W0: 1_000, W1: 1_000})
    return rid


def test_an_aborted_deferred_turn_leaves_its_paused_program_expecting_nothing_resident(
        h: Harness) -> None:
    h.abort(_paused_while_w0_was_away(h))  # before its turn is let in
    program = h.program("a")
    assert (program.lifecycle, program.worker) == (Lifecycle.PAUSED, W0)
    assert (program.resident_prompt_tokens, program.paused_prompt_tokens) == (0, 300)


def test_an_abort_after_a_pause_and_resume_keeps_what_the_pause_left(h: Harness) -> None:
    rid = _paused_while_w0_was_away(h)
    h.tick()  # "a" resumes on W0 with its turn
    assert h.scheduler.table.requests[rid].expected_after_pause == 300
    h.abort(rid)
    assert (h.program("a").resident_prompt_tokens, h.program("a").paused_prompt_tokens) == (
        0, 300)  # paused since its last turn: nothing counts as the engine's own loss
    rid, d = h.turn("a", 450)
    assert released_to(d, rid) == W0
    request = h.scheduler.table.requests[rid]
    assert (request.expected_cached, request.expected_after_pause) == (0, 300)


def test_an_abort_after_its_worker_was_lost_expects_nothing_cached_there(h: Harness) -> None:
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 300)
    rid, d = h.turn("a", 400)
    assert released_to(d, rid) == W0
    h.workers({W1: 1_000}, live={1})
    h.tick()  # W0 is gone, and its cache with it
    assert h.program("a").worker is None
    h.workers({W0: 1_000, W1: 1_000})  # a worker under the same id, started afresh
    h.abort(rid)
    assert h.program("a").worker == W0
    assert (h.program("a").resident_prompt_tokens, h.program("a").paused_prompt_tokens) == (0, 0)


def _finished_after_its_worker_was_unassigned(h: Harness) -> None:
    """"a" (300 tokens on W0) sent a 400-token turn to W0; W0 left and a tick unassigned "a";
    W0 drained and finished the turn all the same."""
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 300)
    rid, _ = h.turn("a", 400)
    h.scheduler.sent(rid, W0, h.now)
    h.workers({W1: 1_000}, live={1})
    h.tick()
    assert h.program("a").worker is None
    h.scheduler.completed(rid, 410, h.now, cached_tokens=300)
    assert h.program("a").resident_prompt_tokens == 0  # cached on a worker that is gone


def test_a_turn_finished_by_a_departed_worker_is_no_cache_loss_after_an_abort() -> None:
    h = make(buffer_per_program=0, hold_max_cache_loss=0.5)
    _finished_after_its_worker_was_unassigned(h)
    rid, d = h.turn("a", 450)
    assert released_to(d, rid) == W1
    h.scheduler.sent(rid, W1, h.now)
    h.abort(rid)  # it stays on W1, where nothing of it was ever cached
    rid, d = h.turn("a", 450)
    assert h.scheduler.table.requests[rid].expected_cached == 0
    h.scheduler.sent(rid, W1, h.now)
    h.scheduler.completed(rid, 460, h.now, cached_tokens=0)
    assert h.scheduler.cache_loss.snapshot() == {}  # W1's engine lost nothing


def test_a_turn_finished_by_a_departed_worker_is_no_resume_loss_after_a_pause() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_min_resume_loss=0.2)
    _finished_after_its_worker_was_unassigned(h)
    h.acting_on("b", W1, 950)  # W1 full: "a"'s next turn waits, paused
    rid, d = h.turn("a", 450)
    assert d.outcome(rid) is None and h.program("a").paused_prompt_tokens == 0
    h.scheduler.submit("b-end", "b", 0, h.now, session_final=True)  # room on W1
    h.advance(5)
    assert released_to(h.tick(), rid) == W1
    assert h.scheduler.table.requests[rid].expected_after_pause == 0


def test_a_rank_its_live_worker_no_longer_lists_is_gone_for_its_programs(h: Harness) -> None:
    rank1 = WorkerKey(W1.worker_id, 1)
    h.workers({W1: 1_000, rank1: 1_000})
    h.acting_on("a", rank1, 300)
    h.workers({W1: 1_000})  # the worker's card now lists rank 0 only
    rid, d = h.turn("a", 400)  # before any tick: not sent back to the rank that is gone
    assert released_to(d, rid) == W1
    assert h.program("a").worker == W1


def test_a_tick_unassigns_programs_of_a_rank_its_live_worker_no_longer_lists(
        h: Harness) -> None:
    rank1 = WorkerKey(W1.worker_id, 1)
    h.workers({W1: 1_000, rank1: 1_000})
    h.acting_on("a", rank1, 300)
    h.workers({W1: 1_000})
    assert h.tick().unassigned == ["a"]
    assert h.program("a").worker is None
    h.workers({W0: 1_000}, live={W0.worker_id, W1.worker_id})  # W1's card unreadable now:
    h.acting_on("b", W1, 300)  # its ranks are taken at the worker's word
    assert h.tick().unassigned == [] and h.program("b").worker == W1


def test_a_prompt_larger_than_every_worker_is_rejected_at_once(h: Harness) -> None:
    h.workers({W0: 4_096, W1: 2_048})
    rid, d = h.turn("huge", 5_000)
    reject = d.outcome(rid)
    assert isinstance(reject, Reject)
    assert "5000 tokens" in reject.reason and "largest: 4096 tokens" in reject.reason
    assert "huge" not in h.scheduler.table.programs and not h.scheduler.table.requests
    rid, d = h.turn("fits", 4_000)  # as large as the largest rank allows: waits, or runs
    assert not isinstance(d.outcome(rid), Reject)


# ---- a program that outgrows its rank's whole pool ------------------------------------------
def test_a_turn_larger_than_its_ranks_whole_pool_goes_where_a_pool_holds_it() -> None:
    # Found live, in a fleet of unequal pools (mockers of 128 and 1,024 blocks): a program
    # placed on the small worker outgrew it, and every later turn was pinned there and
    # refused by its engine ("request exceeds worker admission limits"), a wedged session.
    h = make()
    h.workers({W0: 2_000, W1: 16_000})
    h.acting_on("grows", W0, 1_500)
    rid, d = h.turn("grows", 2_500)
    assert d.outcome(rid) == Release(rid, W1)
    assert h.program("grows").worker == W1
    assert [(e.kind.value, e.reason) for e in d.steps][-2:] == [
        ("moved", "outgrown"), ("admitted", "outgrown")]
    assert h.scheduler.counters["outgrown_moves"] == 1 and h.scheduler.counters["moves"] == 1
    h.scheduler.sent(rid, W1, h.now)
    h.complete(rid, 2_500)
    rid, d = h.turn("grows", 2_800)  # at home there: sticky again
    assert d.outcome(rid) == Release(rid, W1)
    assert h.scheduler.counters["outgrown_moves"] == 1


def test_an_outgrown_program_waits_for_room_on_a_pool_that_holds_it_never_goes_home() -> None:
    h = make()
    h.workers({W0: 2_000, W1: 16_000})
    h.acting_on("grows", W0, 1_500)
    h.acting_on("big", W1, 14_000)  # W1 has no room for 2,500 more under its threshold
    rid, d = h.turn("grows", 2_500)
    assert d.outcome(rid) is None and h.state("grows") == (Phase.REASONING, Lifecycle.PAUSED)
    resumed = []
    for step in range(6):  # W0 stays empty; W1's room comes back as "big" ends
        if step == 3:
            resumed += h.final("big")[1].resumed
        h.advance(5)
        resumed += h.tick().resumed
    assert resumed == [("grows", W1)]
    assert h.scheduler.table.requests[rid].state is RequestState.RELEASED


def test_an_outgrown_program_whose_pause_saves_nothing_is_not_sent_home_either() -> None:
    # Unmeasured costs: no pause pays, and a program held back for nothing is resumed at
    # home (price_moves), unless its home's pool cannot hold it.
    h = make(pause_min_recompute_ratio=1, price_moves=True)
    h.workers({W0: 2_000, W1: 16_000})
    h.acting_on("grows", W0, 1_500)
    h.acting_on("big", W1, 14_000)
    rid, d = h.turn("grows", 2_500)
    placed = [(s, w) for s, w in d.resumed] + [
        (rid, r.worker) for r in d.released if r.request_id == rid]
    for _ in range(3):
        h.advance(5)
        placed += h.tick().resumed
    assert placed and all(worker == W1 for _, worker in placed), placed


def test_unequal_context_lengths_place_and_move_turns_where_an_engine_takes_them() -> None:
    # Engines started with different --max-model-len: W0 takes prompts up to 1,000 tokens.
    h = make()
    h.scheduler.set_workers(frozenset({0, 1}), {
        W0: CapacityCard(10_000, 1, context_length=1_000), W1: CapacityCard(10_000, 1)})
    h.acting_on("busy", W1, 3_000)  # W0 is the less used
    rid, d = h.turn("long", 1_500)  # a new program W0's engine would refuse
    assert d.outcome(rid) == Release(rid, W1)
    h.acting_on("short", W0, 800)
    rid, d = h.turn("short", 1_200)  # outgrew W0's context length: moves
    assert d.outcome(rid) == Release(rid, W1)
    assert h.scheduler.counters["outgrown_moves"] == 1


def test_a_turn_no_engine_takes_stays_home_for_its_engine_to_refuse() -> None:
    h = make()
    h.scheduler.set_workers(frozenset({0, 1}), {
        W0: CapacityCard(10_000, 1, context_length=1_000),
        W1: CapacityCard(10_000, 1, context_length=1_000)})
    h.acting_on("long", W0, 900)
    rid, d = h.turn("long", 1_200)  # beyond every engine's limit: a move buys nothing
    assert d.outcome(rid) == Release(rid, W0)
    assert h.scheduler.counters["outgrown_moves"] == 0 and h.scheduler.counters["moves"] == 0
    rid, d = h.turn("new", 1_200)  # a new program: placed at once, never held for an engine
    assert isinstance(d.outcome(rid), Release)


def test_an_empty_rank_whose_engine_refuses_the_turn_is_not_left_for() -> None:
    # leave_for_empty_rank sends a turn from a shared rank to one holding no program, only
    # where that rank's engine takes it (found live: long turns sent to an empty rank with
    # a shorter --max-model-len were refused there).
    h = make(leave_for_empty_rank=True)
    h.scheduler.set_workers(frozenset({0, 1}), {
        W0: CapacityCard(10_000, 1, context_length=1_000), W1: CapacityCard(10_000, 1)})
    h.acting_on("a", W1, 1_500)
    h.acting_on("b", W1, 1_500)
    rid, d = h.turn("a", 1_600)
    assert d.outcome(rid) == Release(rid, W1) and h.scheduler.counters["empty_rank_moves"] == 0
    h.acting_on("c", W1, 500)
    rid, d = h.turn("c", 600)  # one W0's engine takes: it leaves for the empty rank
    assert d.outcome(rid) == Release(rid, W0) and h.scheduler.counters["empty_rank_moves"] == 1
