"""Extensions beyond the parity scheduler (policies/thunderagent-extended.yaml).

Each mechanism is a parameter that defaults to parity; each test shows the parity
behaviour and the changed one side by side.
"""

from __future__ import annotations

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.program import Lifecycle, PrefixBlocks, WorkerKey
from dynamo_thunderagent.scheduler import Release

from .conftest import W0, W1, Harness, make


def test_event_driven_resume_releases_a_waiting_turn_when_a_session_ends() -> None:
    for on_events in (False, True):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, resume_on_events=on_events)
        h.workers({W0: 1_000})
        h.acting_on("a", W0, 900)
        rid, d = h.turn("b", 500)
        assert d.outcome(rid) is None
        _, d = h.final("a")
        released = d.outcome(rid)
        if on_events:
            assert isinstance(released, Release) and released.worker == W0
        else:
            assert released is None  # waits for the tick
            assert isinstance(h.tick().outcome(rid), Release)


def test_event_driven_resume_when_a_worker_joins() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, resume_on_events=True)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    rid, _ = h.turn("b", 500)
    d = h.scheduler.set_workers(
        frozenset({0, 1}), {W0: CapacityCard(1_000, 1), W1: CapacityCard(1_000, 1)}, h.now)
    outcome = d.outcome(rid)
    assert isinstance(outcome, Release) and outcome.worker == W1


def test_event_driven_resume_when_a_turn_completes_and_its_tool_time_decays() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1, resume_on_events=True)
    h.workers({W0: 1_000})
    rid_a, _ = h.turn("a", 900)
    rid_b, d = h.turn("b", 500)
    assert d.outcome(rid_b) is None
    h.advance(10)
    d = h.complete(rid_a, 900)  # a is ACTING now, but has not decayed yet
    assert d.outcome(rid_b) is None
    h.advance(10)
    d = h.tick()  # the tick stays the backstop
    assert isinstance(d.outcome(rid_b), Release)


def test_pressure_with_decay_spares_programs_whose_cache_is_long_idle() -> None:
    for decay in (False, True):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pressure_decay=decay)
        h.workers({W0: 2_000})
        h.acting_on("idle", W0, 800)
        h.advance(30)  # its tool has run for 30 s: decayed weight ~ 1e-9
        h.acting_on("fresh", W0, 1_000)
        h.workers({W0: 1_500})  # plain usage 1,800 > 1,425; decayed usage ~1,000
        paused = h.tick().paused
        assert paused == ([] if decay else ["idle"])


def test_longest_idle_acting_program_pauses_first() -> None:
    for order, expected in (("smallest", ["small-fresh"]), ("longest_idle", ["big-old"])):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_order=order,
                 pause_target=0.9)
        h.workers({W0: 3_000})
        h.acting_on("big-old", W0, 900)
        h.advance(5)
        h.acting_on("small-fresh", W0, 300)
        h.acting_on("other", W0, 1_000)
        h.workers({W0: 2_200})  # 2,200 > 2,090: pause down to 1,980, one program is enough
        assert h.tick().paused == expected


def test_the_program_expected_back_latest_pauses_first() -> None:
    for order, expected in (("smallest", ["quick"]), ("expected_return", ["slow"])):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_order=order,
                 pause_target=0.9)
        h.workers({W0: 3_000})
        # "slow" has shown a 60 s tool gap, "quick" a 1 s one; both are ACTING again.
        for session, gap, tokens in (("slow", 60.0, 900), ("quick", 1.0, 300)):
            h.acting_on(session, W0, tokens)
            h.advance(gap)
            h.acting_on(session, W0, tokens)
        h.acting_on("other", W0, 1_000)
        assert (h.program("slow").max_gap, h.program("quick").max_gap) == (60.0, 1.0)
        h.workers({W0: 2_200})  # over the threshold: one pause is enough
        assert h.tick().paused == expected


def prefix(n_blocks: int) -> tuple[int, ...]:
    return tuple(range(1000, 1000 + n_blocks))


def test_shared_prefix_is_counted_once_per_rank() -> None:
    for accounting in (False, True):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
                 shared_prefix_accounting=accounting)
        h.workers({W0: 2_500})  # threshold 2,375
        system = prefix(50)  # 800 tokens in 16-token blocks, common to both agents
        for i, name in enumerate(("a", "b")):
            rid = f"r{i}"
            d = h.scheduler.submit(rid, name, 1_000, h.now,
                                   prefix=PrefixBlocks((*system, i), 16))
            assert isinstance(d.outcome(rid), Release)
            h.complete(rid, 1_000)
        usage = h.scheduler.table.usage(W0)
        # Each program: 800 shared + 16 own hashed + 184 unhashed tokens.
        assert usage == (1_200 if accounting else 2_000)  # 50 shared + 2 own blocks + 2 x 184
        rid, d = h.turn("c", 600)  # fits only if the shared prompt is counted once
        assert isinstance(d.outcome(rid), Release) is accounting
        # Leaving removes its own blocks; the shared ones stay while b holds them.
        h.final("a")
        assert h.scheduler.table.usage(W0) == (
            (800 + 16 + 184 + (600 if accounting else 0)) if accounting else 1_000)


def test_a_system_prompt_past_the_hash_budget_is_still_counted_once() -> None:
    """Agents' system prompts run to tens of thousands of tokens; 256 one-block hashes
    (4,096 tokens at 16-token blocks) charged the rest to every program in full."""
    from dynamo_thunderagent.classifier import ThunderAgentClassifier
    from dynamo_thunderagent.dynamo.translate import classify_request

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
             shared_prefix_accounting=True)
    h.workers({W0: 100_000})
    classifier = ThunderAgentClassifier(h.scheduler.params)
    system = list(range(6_000))  # 375 blocks of 16 tokens, common to both agents
    for i, name in enumerate(("a", "b")):
        tokens = [*system, *range(10_000 * (i + 1), 10_000 * (i + 1) + 200)]
        request = classify_request(
            {"token_ids": tokens, "agent_context": {"session_id": name}}, f"r{i}",
            block_tokens=16, prefix_blocks=classifier.prefix_blocks_wanted,
            prefix_tokens=classifier.prefix_tokens_wanted)
        d = h.scheduler.submit(request.request_id, name, request.input_tokens, h.now,
                               prefix=request.prefix)
        assert isinstance(d.outcome(request.request_id), Release)
        h.complete(request.request_id, len(tokens))
    credit = 2 * 6_200 - h.scheduler.table.usage(W0)
    # From 3,584 to 7,680 tokens the hashes cover 8 blocks (128 tokens) each at the defaults.
    assert 6_000 - 128 < credit <= 6_000


def test_the_shared_prefix_credit_does_not_move_with_a_programs_own_prompt() -> None:
    """Duplicates are credited at the weight their holders are charged at for what they
    share: a longer unshared history of one holder must not change it."""
    credits = []
    for own in (2, 40):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, acting_token_weight=0.5,
                 shared_prefix_accounting=True)
        h.workers({W0: 100_000})
        system = prefix(50)  # 800 tokens in 16-token blocks
        for name, extra in (("thinking", 1), ("tool", own)):
            blocks = (*system, *(hash((name, i)) for i in range(extra)))
            tokens = 16 * len(blocks)
            rid = f"{name}-1"
            d = h.scheduler.submit(rid, name, tokens, h.now, prefix=PrefixBlocks(blocks, 16))
            assert isinstance(d.outcome(rid), Release)
            h.scheduler.sent(rid, W0, h.now)
            if name == "tool":
                h.complete(rid, tokens)  # ACTING, charged at 0.5
        charged = 16 * 51 + 0.5 * 16 * (50 + own)
        credits.append(charged - h.scheduler.table.usage(W0))
    # 800 shared tokens, charged at 1 and at 0.5: one duplicate credited at the mean, 0.75.
    assert credits == [600.0, 600.0]


def test_resume_affinity_returns_a_program_to_the_rank_that_holds_its_cache() -> None:
    for affinity, expected in ((False, W1), (True, W0)):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, resume_affinity=affinity)
        h.workers({W0: 2_000, W1: 2_000})
        h.acting_on("p", W0, 500)
        h.acting_on("x", W0, 900)
        h.workers({W0: 1_400, W1: 2_000})  # W0 over threshold: p (smallest) pauses
        assert h.tick().paused == ["p"]
        h.final("x")
        h.workers({W0: 1_000, W1: 4_000})  # both have room; W1 has more
        resumed = dict(h.tick().resumed)
        assert resumed["p"] == expected


def test_an_aged_waiter_goes_first_and_reserves_room() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600)
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 600)
    rid_big, _ = h.turn("big", 700)  # 600 + 700 > 950: waits
    h.advance(61)  # big has waited past max_wait
    rid_small, _ = h.turn("small", 100)
    d = h.tick()  # room at the resume level: 850 - 600 = 250 < 700, 100 would fit
    assert d.outcome(rid_small) is None, "nothing jumps ahead of an aged waiter"
    assert d.outcome(rid_big) is None
    h.final("hog")
    d = h.tick()
    assert isinstance(d.outcome(rid_big), Release)


def test_without_aging_small_programs_pass_a_large_waiter() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9)
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 900)
    rid_big, _ = h.turn("big", 700)
    h.advance(61)
    rid_small, _ = h.turn("small", 100)
    h.final("hog")
    h.workers({W0: 700})
    d = h.tick()
    assert isinstance(d.outcome(rid_small), Release) and d.outcome(rid_big) is None


def test_min_residency_spares_a_program_that_just_resumed() -> None:
    for residency, expected in ((0.0, ["r"]), (30.0, ["other"])):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_target=0.85,
                 min_residency_seconds=residency)
        h.workers({W0: 10_000})
        h.acting_on("other", W0, 600)
        h.advance(100)
        h.acting_on("r", W0, 300)  # became ACTIVE just now
        h.acting_on("filler", W0, 700)
        h.workers({W0: 1_600})  # 1,600 > 1,520: pause to 1,360
        paused = h.tick().paused
        assert paused == expected
        assert h.program(expected[0]).lifecycle is Lifecycle.PAUSED


def test_extension_defaults_are_the_parity_behaviour() -> None:
    from dynamo_thunderagent.parameters import ThunderAgentParameters

    p = ThunderAgentParameters()
    assert (p.resume_on_events, p.pressure_decay, p.pause_order, p.shared_prefix_accounting,
            p.resume_affinity, p.max_wait_seconds, p.min_residency_seconds, p.placement,
            p.idle_horizon_factor, p.pause_min_recompute_ratio, p.acting_hold_factor,
            p.leave_for_empty_rank) == (
        False, False, "smallest", False, False, None, 0.0, "least_used", None, None, None,
        False)
    assert WorkerKey(0) == W0


def test_pausing_is_skipped_where_recompute_is_cheap_next_to_decode() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    for prefill_cost, expected in ((1e-6, []), (1e-3, ["small"])):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
                 pause_min_recompute_ratio=0.5)
        h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=prefill_cost,
                                              decode_seconds=1.0))
        h.workers({W0: 2_000})
        h.acting_on("small", W0, 600)
        h.acting_on("big", W0, 1_200)
        h.workers({W0: 1_800})  # 1,800 > 1,710: parity would pause "small"
        # 600 tokens re-prefill in 0.6 ms (cheap: keep it) or 0.6 s (>= 0.5 x 1 s: pause).
        assert h.tick().paused == expected


def test_a_new_program_is_admitted_without_room_when_holding_it_back_saves_nothing() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_min_recompute_ratio=0.5)
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 900)
    h.acting_on("b", W1, 800)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    rid, d = h.turn("c", 500)
    assert d.outcome(rid) is None  # recompute is dear: held back for lack of room
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-6, decode_seconds=1.0))
    d = h.tick()
    released = d.outcome(rid)
    assert isinstance(released, Release) and released.worker == W1  # most room, though short
    rid2, d2 = h.turn("d", 500)  # no room anywhere: the least used rank (W0 at 0.9 < W1 1.3)
    released = d2.outcome(rid2)
    assert isinstance(released, Release) and released.worker == W0


def test_until_costs_are_measured_admission_stays_open_like_plain_routing() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, pause_min_recompute_ratio=0.5)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 900)
    rid, d = h.turn("b", 500)  # no room, but nothing is known to pay for a wait
    assert isinstance(d.outcome(rid), Release)
    assert not h.tick().paused


def test_cost_meter_takes_the_decode_yardstick_as_the_least_smoothed_decode() -> None:
    from dynamo_thunderagent.costs import CostMeter, TurnTiming

    meter = CostMeter(alpha=0.5, min_uncached_tokens=100)
    assert meter.observe(TurnTiming(50, 0.5, 1.0)) is None  # no large prefill seen yet
    costs = meter.observe(TurnTiming(1_000, 0.1, 2.0))
    assert costs is not None and costs.decode_seconds == 1.0  # the least it has been
    costs = meter.observe(TurnTiming(1_000, 0.3, 10.0))  # decode slowed by thrash: yardstick stays
    assert costs is not None and costs.decode_seconds == 1.0
    for _ in range(4):  # 5.75 -> 2.9 -> 1.5 -> 0.8 -> 0.45: below the old low
        meter.observe(TurnTiming(None, None, 0.1))
    assert meter.decode_seconds is not None and meter.decode_seconds < 1.0  # and falls


def test_one_token_turns_do_not_pull_the_decode_yardstick_down() -> None:
    # An agent's one-token turns (a yes/no check) have no decode: first token = last. Were
    # they samples, a few would pin the yardstick near zero and every pause would pay.
    from dynamo_thunderagent.costs import CostMeter, TurnTiming

    meter = CostMeter(alpha=0.5, min_uncached_tokens=100)
    meter.observe(TurnTiming(1_000, 0.1, 2.0, output_tokens=200))
    for _ in range(10):
        meter.observe(TurnTiming(1_000, 0.1, 0.0, output_tokens=1))
    assert meter.decode_seconds == 2.0
    meter.observe(TurnTiming(1_000, 0.1, 0.01, output_tokens=2))  # a decode, however short
    assert meter.decode_seconds == pytest.approx(1.005)
    meter.observe(TurnTiming(1_000, 0.1, 0.0))  # not counted: taken as a decode (as before)
    assert meter.decode_seconds == pytest.approx(0.5025)


def test_cost_meter_prices_a_prefilled_token_by_the_least_delayed_turns() -> None:
    from dynamo_thunderagent.costs import CostMeter, TurnTiming

    meter = CostMeter(min_uncached_tokens=1_000)
    assert meter.observe(TurnTiming(500, 0.01, 1.0)) is None  # too small to price a token
    assert meter.prefill_seconds_per_token is None
    # A loaded engine: the engine takes 20 us a token; turns wait 0 to 9 s on top.
    for i in range(10):
        meter.observe(TurnTiming(2_000, 2_000 * 20e-6 + i, 1.0))
    # The 10th percentile of ten: the turn that did not wait (the mean would be 2.3 ms).
    assert meter.prefill_seconds_per_token == 20e-6
    for _ in range(9):  # a run of slow turns moves it only once they are 9 in 10
        meter.observe(TurnTiming(2_000, 10.0, 1.0))
    assert meter.prefill_seconds_per_token == 20e-6 + 1 / 2_000


def test_cost_meter_forgets_turns_past_its_window() -> None:
    from dynamo_thunderagent.costs import CostMeter, TurnTiming

    meter = CostMeter(min_uncached_tokens=1_000, window=4)
    for _ in range(4):
        meter.observe(TurnTiming(2_000, 2_000 * 50e-6, 1.0))
    assert meter.prefill_seconds_per_token == 50e-6
    for _ in range(3):  # the engine got slower (a bigger model, a busier host) ...
        meter.observe(TurnTiming(2_000, 2_000 * 80e-6, 1.0))
    assert meter.prefill_seconds_per_token == 50e-6
    meter.observe(TurnTiming(2_000, 2_000 * 80e-6, 1.0))  # ... and the old turns left
    assert meter.prefill_seconds_per_token == 80e-6


def test_least_busy_placement_spreads_new_turns_over_workers_by_current_load() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, placement="least_busy")
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("idle", W1, 3_000)  # W1 holds an idle program's charge, W0 nothing
    first, d = h.turn("a", 200)
    assert d.outcome(first).worker == W0  # type: ignore[union-attr]
    second, d = h.turn("b", 200)  # parity would pick W0 again (0.04 < 0.30 used)
    assert d.outcome(second).worker == W1  # type: ignore[union-attr]


def test_a_recompute_that_holds_up_a_full_batch_is_worth_a_pause() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    # 600 tokens re-prefill in 0.06 s: below 0.5 x a 1 s decode for one running turn, but
    # a re-prefill holds up every turn running on the rank: with 10 of them it is 0.6 s.
    for running, expected in ((0, []), (10, ["small"])):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
                 pause_min_recompute_ratio=0.5)
        h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-4,
                                              decode_seconds=1.0))
        h.workers({W0: 2_000})
        h.acting_on("small", W0, 600)
        h.acting_on("big", W0, 1_200)
        for i in range(running):  # turns of other programs, running (cold start: no card)
            h.scheduler.capacity.known.clear()
            h.turn(f"busy{i}", 0)
        h.workers({W0: 1_800})  # 1,800 > 1,710: parity would pause "small"
        assert h.scheduler.batch == running
        assert h.tick().paused == expected


def priced_moves_harness() -> Harness:
    """Two ranks; "p" (800 tokens) paused on W0 by pressure, W0 then full, W1 with room;
    re-prefill measured at 1 ms a token."""
    from dynamo_thunderagent.costs import TurnTiming

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, price_moves=True)
    h.scheduler.observe_turn(TurnTiming(uncached_tokens=2_000, prefill_seconds=2.0,
                                        decode_seconds=1.0))
    h.workers({W0: 2_000, W1: 2_000})
    h.acting_on("p", W0, 800)
    h.acting_on("q", W0, 1_000)
    h.workers({W0: 1_800, W1: 2_000})  # 1,800 > 1,710 on W0: its smallest, "p", pauses
    assert h.tick().paused == ["p"]
    return h


def test_a_paused_program_waits_for_room_at_home_as_long_as_a_move_would_cost() -> None:
    h = priced_moves_harness()
    moves = h.scheduler.counters["moves"]
    rid, d = h.turn("p", 1_100)  # its next turn: W0 has 530 tokens of room, W1 1,700
    assert d.outcome(rid) is None
    h.advance(0.5)
    assert not h.tick().resumed  # waited 0.5 s < 1.1 s of re-prefill: waits for home
    assert h.scheduler.counters["held_home"] >= 1
    h.advance(1.0)
    d = h.tick()  # waited 1.5 s: a move costs no more than waiting did
    assert d.resumed == [("p", W1)] and h.program("p").worker == W1
    counters = h.scheduler.counters
    assert counters["moves"] - moves == 1
    assert (counters["priced_moves"], counters["move_price_ms"]) == (1, 1_100)


def test_without_priced_moves_a_paused_program_moves_at_once() -> None:
    h = priced_moves_harness()
    h.scheduler.planner.price_moves = False
    h.turn("p", 1_100)
    assert h.tick().resumed == [("p", W1)]
    assert h.scheduler.counters["priced_moves"] == 0


def test_a_program_whose_pause_does_not_pay_resumes_where_its_cache_is() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, price_moves=True,
             pause_min_recompute_ratio=0.5)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=1.0))
    h.workers({W0: 2_000, W1: 2_000})
    h.acting_on("p", W0, 800)
    h.acting_on("q", W0, 1_000)
    h.workers({W0: 1_800, W1: 2_000})
    assert h.tick().paused == ["p"]  # 0.8 s of re-prefill >= 0.5 x 1 s: the pause pays
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-6, decode_seconds=1.0))
    h.turn("p", 1_100)  # now holding it back saves nothing: it runs, and at home
    assert h.tick().resumed == [("p", W0)]


def test_the_price_of_a_move_grows_with_the_turns_its_re_prefill_would_hold_up() -> None:
    h = priced_moves_harness()
    cards = dict(h.scheduler.capacity.known)
    h.scheduler.capacity.known.clear()  # cold start for a moment: turns released anywhere
    for i in range(4):
        h.turn(f"busy{i}", 0)
    h.workers({w: c for w, c in cards.items()})
    assert h.scheduler.batch == 2  # 4 running turns over 2 ranks
    h.turn("p", 1_100)
    h.advance(1.5)
    assert not h.tick().resumed  # 1.5 s < 1.1 s x 2: still cheaper to wait for home
    h.advance(1.0)
    assert h.tick().resumed == [("p", W1)]
    assert h.scheduler.counters["move_price_ms"] == 2_200


def _back_from_a_tool(h: Harness, session: str, gap: float, tokens: int) -> None:
    """``session`` runs a turn on W0, comes back after ``gap`` s, runs a second turn of
    ``tokens`` and is ACTING again (its smoothed gap is then ``gap``)."""
    h.acting_on(session, W0, tokens // 2)
    h.advance(gap)
    rid, d = h.turn(session, tokens)
    assert isinstance(d.outcome(rid), Release)
    h.scheduler.sent(rid, W0, h.now)
    h.complete(rid, tokens)


def test_a_program_back_from_short_tools_keeps_its_room_for_the_hold() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    for factor in (None, 1.0):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pause_min_recompute_ratio=0,
                 acting_hold_factor=factor)
        h.workers({W0: 1_000})
        # The whole 1,000-token pool re-prefills in 20 s: the hold is 20 s.
        h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02,
                                              decode_seconds=1.0))
        _back_from_a_tool(h, "agent", gap=2.0, tokens=900)
        assert h.program("agent").gap_ewma == 2.0
        rid, d = h.turn("other", 500)
        assert d.outcome(rid) is None  # no room while the agent's tool runs
        h.advance(10)  # decayed by 2^-10 without the hold
        released = h.tick().outcome(rid)
        assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == (
            0.0 if factor is None else 20.0)
        if factor is None:
            assert isinstance(released, Release)
        else:
            assert released is None  # expected back within the hold: its room is kept
            h.advance(15)  # 25 s into its tool, 5 s past the hold
            assert isinstance(h.tick().outcome(rid), Release)


def test_a_program_whose_tools_run_long_gives_its_room_back_at_once() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pause_min_recompute_ratio=0,
             acting_hold_factor=1.0)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02, decode_seconds=1.0))
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)  # twice 15 s is past the 20 s hold
    rid, d = h.turn("other", 500)
    assert d.outcome(rid) is None
    h.advance(10)
    assert isinstance(h.tick().outcome(rid), Release)
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 20.0  # the hold was on


def test_the_hold_covers_a_program_whose_doubled_gap_just_fits_and_leaves_plain_usage() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pause_min_recompute_ratio=0,
             acting_hold_factor=1.0)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02, decode_seconds=1.0))
    _back_from_a_tool(h, "edge", gap=10.0, tokens=900)  # twice 10 s is exactly the hold
    h.advance(5)
    h.tick()
    assert h.scheduler.table.decayed_usage(W0, h.now) == 900  # held: not decayed
    assert h.scheduler.table.usage(W0) == 900  # the plain (pause-side) usage is unchanged
    h.advance(20)  # 25 s into its tool: 5 s past the hold, decayed by 2^-5
    assert h.scheduler.table.decayed_usage(W0, h.now) == 900 * 2.0 ** -5


def test_a_program_once_away_longer_than_the_hold_is_not_held_again() -> None:
    """The hold is for programs whose every gap so far fitted it. One that was away longer
    once (a build, a person, its own subagents) may be again at any tool: it gives its room
    back as without the hold, though its smoothed gap is short again."""
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pause_min_recompute_ratio=0,
             acting_hold_factor=1.0)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02, decode_seconds=1.0))
    h.acting_on("agent", W0, 100)
    for gap in (1.0, 30.0, 1.0, 1.0):  # one 30 s gap among 1 s ones; the hold is 20 s
        h.advance(gap)
        rid, d = h.turn("agent", 900)
        assert isinstance(d.outcome(rid), Release)
        h.scheduler.sent(rid, W0, h.now)
        h.complete(rid, 900)
    agent = h.program("agent")
    assert agent.expected_back_within(20.0) is True  # smoothed, the 30 s gap is history
    assert agent.max_gap == 30.0
    h.advance(5)
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 20.0
    assert h.scheduler.table.decayed_usage(W0, h.now) == 900 * 2.0 ** -5  # not held


def test_the_hold_follows_the_measured_prefill_cost_and_is_zero_until_measured() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h = make(acting_hold_factor=0.5, pause_min_recompute_ratio=1)
    h.workers({W0: 1_000, W1: 3_000})  # a mean rank holds 2,000 tokens
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 0.0  # nothing measured
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.01, decode_seconds=1.0))
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 0.5 * 2_000 * 0.01
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-6, decode_seconds=1.0))
    h.tick()  # recompute is cheap: the hold all but vanishes
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] < 1e-2


def _yield_harness(factor: float | None, **params: object) -> Harness:
    """One 1,000-token rank whose whole pool re-prefills in 20 s: the yield horizon of
    factor 1 is 20 s; costs measured and the horizon set (a tick) before anything runs."""
    from dynamo_thunderagent.costs import EngineCosts

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1, pause_min_recompute_ratio=0,
             acting_yield_factor=factor, **params)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=0.02, decode_seconds=1.0))
    h.tick()
    return h


def test_a_program_whose_tools_run_long_yields_its_room_at_its_tool_boundary() -> None:
    for factor in (None, 1.0):
        h = _yield_harness(factor)
        _back_from_a_tool(h, "slow", gap=15.0, tokens=900)  # twice 15 s is past 20 s
        yielded = factor is not None
        assert h.program("slow").yielded is yielded
        assert h.scheduler.counters["yields"] == (1 if yielded else 0)
        assert h.scheduler.snapshot(h.now)["acting_yield_seconds"] == (20.0 if yielded else None)
        # Yielded, it is charged nothing on either side; else all of it, as before.
        assert h.scheduler.table.usage(W0) == (0 if yielded else 900)
        assert h.scheduler.table.decayed_usage(W0, h.now) == (0 if yielded else 900)
        rid, d = h.turn("other", 500)
        if yielded:
            assert isinstance(d.outcome(rid), Release)  # the room is there at once
        else:
            assert d.outcome(rid) is None  # waits for the slow program's room


def test_a_program_expected_back_within_the_horizon_keeps_its_room() -> None:
    h = _yield_harness(1.0)
    _back_from_a_tool(h, "edge", gap=10.0, tokens=900)  # twice 10 s is exactly 20 s
    assert not h.program("edge").yielded
    assert h.scheduler.table.usage(W0) == 900
    assert h.scheduler.counters["yields"] == 0


def test_the_yield_horizon_does_not_move_with_the_turns_running() -> None:
    # A re-prefill holds up every turn running on the rank, and the room a program keeps
    # would have run its share of those same turns: the batch weighs on both sides of the
    # trade, so with two turns running the horizon is still the pool's 20 s (it was 40 s,
    # and a program whose tools ran 15 s kept room that would have run others' turns).
    h = _yield_harness(1.0)
    for session in ("a", "b"):
        rid, d = h.turn(session, 10)
        assert isinstance(d.outcome(rid), Release)
        h.scheduler.sent(rid, W0, h.now)
    assert h.scheduler.snapshot(h.now)["acting_yield_seconds"] == 20.0
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)  # twice 15 s is past 20 s
    assert h.program("slow").yielded
    # /state shows why: its smoothed gap beside the horizon (null for one not back yet).
    shown = h.scheduler.snapshot(h.now)["programs"]
    assert shown["slow"]["yielded"] and shown["slow"]["gap_seconds"] == 15.0
    assert shown["a"]["gap_seconds"] is None
    assert h.scheduler.table.usage(W0) == 20  # the two running turns only


def test_one_long_tool_among_short_ones_does_not_make_a_program_yield_at_the_next() -> None:
    # A coding agent whose tools return in a second runs a test suite now and then. Its
    # smoothed gap is a geometric mean: after one 100 s gap among 1 s ones it is about
    # 4 s, so at the next short tool it keeps its room (an arithmetic mean, about 31 s,
    # made it yield at every tool boundary for several turns after each long one).
    h = _yield_harness(1.0)
    h.acting_on("coder", W0, 100)
    for gap in (1.0, 1.0, 1.0, 100.0):
        h.advance(gap)
        rid, d = h.turn("coder", 100)
        assert isinstance(d.outcome(rid), Release)
        h.scheduler.sent(rid, W0, h.now)
        h.complete(rid, 100)
    assert h.program("coder").gap_ewma < 5.0
    assert not h.program("coder").yielded
    assert h.scheduler.table.usage(W0) == 100


def test_no_program_yields_before_it_has_a_gap_or_the_engine_is_measured() -> None:
    h = _yield_harness(1.0)
    h.acting_on("first", W0, 400)  # one turn: no gap history yet
    assert not h.program("first").yielded
    assert h.scheduler.table.usage(W0) == 400
    unmeasured = make(buffer_per_program=0, pause_min_recompute_ratio=0, acting_yield_factor=1.0)
    unmeasured.workers({W0: 1_000})
    unmeasured.tick()
    _back_from_a_tool(unmeasured, "slow", gap=15.0, tokens=900)
    assert unmeasured.scheduler.snapshot(unmeasured.now)["acting_yield_seconds"] is None
    assert not unmeasured.program("slow").yielded


def test_a_yielded_program_is_never_paused_and_its_next_turn_runs_where_it_ran() -> None:
    h = _yield_harness(1.0)
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)
    h.acting_on("busy", W0, 960)  # the rank is over its threshold with "busy" alone
    d = h.tick()
    assert "slow" not in d.paused  # it holds no room: nothing to free by pausing it
    assert "busy" in d.paused
    h.advance(15.0)
    rid, d = h.turn("slow", 1_000 - 50)
    assert d.outcome(rid) == Release(rid, W0)  # back where it ran, without waiting for room
    program = h.program("slow")
    assert not program.yielded  # its turn is charged in full again
    assert h.scheduler.table.usage(W0) == 950


def test_a_turn_that_fails_is_a_tool_boundary_for_yielding_too() -> None:
    h = _yield_harness(1.0)
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)
    h.advance(15.0)
    rid, d = h.turn("slow", 950)
    assert isinstance(d.outcome(rid), Release)
    h.scheduler.sent(rid, W0, h.now)
    h.abort(rid)
    assert h.program("slow").yielded
    assert h.scheduler.table.usage(W0) == 0


def test_a_program_that_yields_at_a_failed_turn_expects_nothing_kept() -> None:
    h = _yield_harness(1.0)
    _back_from_a_tool(h, "slow", gap=2.0, tokens=900)  # short tools: it keeps its room
    assert h.program("slow").resident_prompt_tokens == 900
    # A long tool this time (smoothed with the 2 s one, a geometric mean of about 13 s):
    # expected back past the horizon.
    h.advance(600.0)
    rid, _ = h.turn("slow", 950)
    h.scheduler.sent(rid, W0, h.now)
    h.abort(rid)
    program = h.program("slow")
    assert program.yielded and program.worker == W0
    assert program.resident_prompt_tokens == 0  # the engine may evict what it yielded


def test_a_program_marked_for_pause_that_yields_is_not_paused() -> None:
    h = _yield_harness(1.0)
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)
    h.advance(15.0)
    rid, d = h.turn("slow", 960)  # over the rank's threshold while it reasons
    assert isinstance(d.outcome(rid), Release)
    h.scheduler.sent(rid, W0, h.now)
    assert "slow" in h.tick().marked
    d = h.complete(rid, 960)
    assert "slow" not in d.paused  # yielding freed what the mark was for
    program = h.program("slow")
    assert program.yielded and not program.marked_for_pause
    assert program.lifecycle is Lifecycle.ACTIVE
    h.advance(15.0)
    rid, d = h.turn("slow", 980)
    assert d.outcome(rid) == Release(rid, W0)  # its next turn does not wait for room


def test_a_program_whose_next_turn_is_already_queued_does_not_yield() -> None:
    h = _yield_harness(1.0, max_turns_per_session=4)
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)
    assert h.scheduler.counters["yields"] == 1
    h.advance(15.0)
    rid, _ = h.turn("slow", 920)
    h.scheduler.sent(rid, W0, h.now)
    queued, _ = h.turn("slow", 940)  # sent before the first finished
    h.complete(rid, 930)
    assert h.scheduler.counters["yields"] == 1  # no tool to wait for: no second yield
    assert h.program("slow").current == queued


def test_a_yielded_program_gone_idle_is_not_paused_to_make_room() -> None:
    h = _yield_harness(1.0, idle_horizon_factor=1.0, idle_horizon_min_seconds=0.0)
    _back_from_a_tool(h, "slow", gap=15.0, tokens=900)
    assert h.program("slow").yielded
    h.advance(100.0)  # far past its idle horizon: dormant
    h.acting_on("busy", W0, 960)  # pressure: dormant programs give way first
    d = h.tick()
    assert "slow" not in d.paused  # it holds no room; pausing it would only delay it
    assert h.program("slow").lifecycle is Lifecycle.ACTIVE


# ---- concurrent_turns: a session's parallel turn runs alongside its running one -------------
def test_a_concurrent_turn_queues_in_parity_and_runs_alongside_with_the_extension() -> None:
    for mode in ("queue", "alongside"):
        h = make(concurrent_turns=mode)
        h.workers({W0: 10_000})
        first, d = h.turn("s", 1_000)
        assert d.outcome(first) == Release(first, W0)
        h.scheduler.sent(first, W0, h.now)
        second, d = h.turn("s", 1_200)  # while the first is on W0
        if mode == "queue":
            assert d.outcome(second) is None and list(h.program("s").waiting) == [second]
            continue
        # At once, where the running turn is (their shared prompt is cached there), untracked.
        assert d.outcome(second) == Release(second, W0, tracked=False)
        assert second not in h.scheduler.table.requests
        assert h.scheduler.counters["alongside"] == 1
        program = h.program("s")
        assert program.current == first and program.tokens == 1_000 and not program.waiting
        # Its events teach the scheduler nothing; the running turn's still do.
        h.scheduler.sent(second, W1, h.now)
        h.complete(second, 1_300)
        assert program.worker == W0 and program.current == first
        h.complete(first, 1_100)
        assert program.current is None and program.tokens == 1_100
        third, d = h.turn("s", 1_500)
        assert d.outcome(third) == Release(third, W0)  # the next turn is sticky as ever


def test_a_paused_programs_parallel_turns_wait_with_its_turn_and_then_go_with_it() -> None:
    h = make(concurrent_turns="alongside", buffer_per_program=0, pause_target=0.9)
    h.workers({W0: 10_000})
    h.acting_on("s", W0, 1_000)
    h.acting_on("a", W0, 4_000)
    h.acting_on("b", W0, 4_000)
    h.turn("a", 5_000)  # sticky: 10,000 held
    assert h.tick().paused == ["s"]  # the smallest acting program pauses, down to 9,000
    first, d = h.turn("s", 1_100)
    assert d.outcome(first) is None  # deferred behind its pause
    second, d = h.turn("s", 500)  # its current turn waits for room: so does this one
    assert d.outcome(second) is None and list(h.program("s").waiting) == [second]
    assert h.scheduler.counters["alongside"] == 0
    third, _ = h.turn("s", 600)
    # Room appears (session "a" ends): the waiting turn resumes, and the two sent beside
    # it while it waited go with it, untracked, instead of one after another.
    a_turn = h.program("a").current
    assert a_turn is not None
    h.complete(a_turn, 5_000)
    h.final("a")
    released = {r.request_id: r for d in h.log[-1:] for r in d.released}
    released.update({r.request_id: r for r in h.tick().released})
    assert released[first] == Release(first, W0)
    assert released[second] == Release(second, W0, tracked=False)
    assert released[third] == Release(third, W0, tracked=False)
    assert not h.program("s").waiting and h.scheduler.counters["alongside"] == 2
    assert second not in h.scheduler.table.requests and third not in h.scheduler.table.requests


def test_turns_alongside_do_not_count_against_the_sessions_turn_bound() -> None:
    h = make(concurrent_turns="alongside", max_turns_per_session=1)
    h.workers({W0: 10_000})
    first, _ = h.turn("s", 1_000)
    h.scheduler.sent(first, W0, h.now)  # running on W0
    for _ in range(3):
        rid, d = h.turn("s", 800)
        assert d.outcome(rid) == Release(rid, W0, tracked=False)
    assert h.scheduler.counters["alongside"] == 3 and h.scheduler.counters["rejected"] == 0


def test_a_turn_alongside_goes_to_no_worker_in_particular_when_its_sessions_is_gone() -> None:
    h = make(concurrent_turns="alongside")
    h.workers({W0: 10_000})
    first, _ = h.turn("s", 1_000)
    h.scheduler.sent(first, W1, h.now)  # served by a rank that is not (or no longer) live
    second, d = h.turn("s", 800)
    assert d.outcome(second) == Release(second, None, tracked=False)


def _aged_behind_a_hog(make_room: bool, **params: object) -> tuple[Harness, str]:
    """``hog`` (600 tokens) is ACTING on W0 (capacity 1,000, resume level 850); ``big``
    (700) has waited past max_wait for room that a rank below its threshold never frees."""
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=make_room, **params)
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 600)
    rid_big, _ = h.turn("big", 700)
    h.advance(61)
    return h, rid_big


def test_aging_only_reserves_room_that_a_rank_below_its_threshold_never_frees() -> None:
    h, rid_big = _aged_behind_a_hog(make_room=False)
    for _ in range(5):
        d = h.tick()
        assert d.outcome(rid_big) is None and not d.paused
        h.advance(60)  # 600 < 950: no pressure, so hog stays and big waits on


def test_an_aged_turn_has_room_made_by_pausing_acting_programs_of_its_rank() -> None:
    h, rid_big = _aged_behind_a_hog(make_room=True)
    d = h.tick()
    assert d.paused == ["hog"] and isinstance(d.outcome(rid_big), Release)
    assert [s.reason for s in d.steps if s.program == "hog"] == ["aging"]
    counters = h.scheduler.snapshot(h.now)["counters"]
    assert isinstance(counters, dict)
    assert (counters["aging_pauses"], counters["aging_marks"]) == (1, 0)


def test_room_is_made_only_once_a_turn_has_waited_max_wait() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True)
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 600)
    rid_big, _ = h.turn("big", 700)
    h.advance(59)
    d = h.tick()
    assert not d.paused and d.outcome(rid_big) is None


def test_a_reasoning_program_is_marked_to_make_room_and_pauses_at_its_tool_boundary() -> None:
    h, rid_big = _aged_behind_a_hog(make_room=True)
    rid_hog, d = h.turn("hog", 650)  # hog's next turn runs: REASONING, not pausable now
    assert isinstance(d.outcome(rid_hog), Release)
    h.scheduler.sent(rid_hog, W0, h.now)
    d = h.tick()
    assert d.marked == ["hog"] and not d.paused and d.outcome(rid_big) is None
    assert "hog" in h.complete(rid_hog, 700).paused  # at its tool boundary
    assert isinstance(h.tick().outcome(rid_big), Release)
    assert h.scheduler.counters["aging_marks"] == 1


def _hog_marked_for_big() -> tuple[Harness, str, str]:
    """``_aged_behind_a_hog`` with room made: hog's next turn runs (REASONING), so the
    tick marks it to pause at its tool boundary for big, which still waits."""
    h, rid_big = _aged_behind_a_hog(make_room=True)
    rid_hog, _ = h.turn("hog", 650)
    h.scheduler.sent(rid_hog, W0, h.now)
    assert h.tick().marked == ["hog"]
    return h, rid_big, rid_hog


def test_a_mark_made_for_an_aged_turn_lapses_once_no_aged_turn_waits() -> None:
    h, rid_big, rid_hog = _hog_marked_for_big()
    h.scheduler.aborted(rid_big, h.now)  # big's client gave up: nobody waits for room
    d = h.complete(rid_hog, 700)
    assert not d.paused and not h.program("hog").marked_for_pause
    assert h.program("hog").lifecycle is Lifecycle.ACTIVE
    assert h.scheduler.counters["aging_marks_cleared"] == 1


def test_a_mark_for_an_aged_turn_lapses_when_that_turn_runs_on_another_rank() -> None:
    h, rid_big, rid_hog = _hog_marked_for_big()
    h.workers({W0: 1_000, W1: 1_000})  # a worker joins: big is let in there
    assert h.tick().outcome(rid_big) == Release(rid_big, W1)
    d = h.complete(rid_hog, 700)
    assert not d.paused and h.scheduler.counters["aging_marks_cleared"] == 1


def test_a_mark_for_an_aged_turn_stands_as_a_pressure_mark_on_a_rank_over_threshold() -> None:
    # The pause rule counts marked programs as gone: had the mark lapsed here, nobody on a
    # rank over its threshold would be paused at all.
    h, rid_big, rid_hog = _hog_marked_for_big()
    h.scheduler.aborted(rid_big, h.now)
    d = h.complete(rid_hog, 990)  # 990 > 950, the pause threshold of W0
    assert d.paused == ["hog"]
    assert [s.reason for s in d.steps if s.program == "hog"] == ["tool_boundary"]
    assert h.scheduler.counters["aging_marks_cleared"] == 0
    assert not h.program("hog").marked_for_aged


def test_a_program_marked_for_an_aged_turn_pauses_with_the_reason_aging() -> None:
    h, _, rid_hog = _hog_marked_for_big()
    d = h.complete(rid_hog, 700)
    assert [s.reason for s in d.steps if s.program == "hog"] == ["aging"]
    assert h.scheduler.counters["aging_marks_cleared"] == 0


def test_programs_that_just_resumed_or_whose_pause_does_not_pay_make_no_room() -> None:
    from dynamo_thunderagent.costs import EngineCosts

    h, rid_big = _aged_behind_a_hog(make_room=True, min_residency_seconds=1_000)
    d = h.tick()
    assert not d.paused and d.outcome(rid_big) is None  # hog is within its residency

    # Measured costs where big's re-prefill (700 tokens x 1 ms) is worth a pause and hog's
    # (600) is not: big waits for room, and hog is not paused to make it.
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True, pause_min_recompute_ratio=1)
    h.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=1e-3, decode_seconds=0.65))
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 600)
    rid_big, _ = h.turn("big", 700)
    assert h.scheduler.waiting_for_room == 1
    h.advance(61)
    d = h.tick()
    assert not d.paused and d.outcome(rid_big) is None


def test_two_aged_turns_on_one_rank_get_room_for_both() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True)
    h.workers({W0: 2_000})
    for name in ("a", "b", "c", "d"):
        h.acting_on(name, W0, 450)  # 1,800 < 1,900: no pressure
    rid_x, _ = h.turn("x", 300)
    rid_y, _ = h.turn("y", 300)  # both wait: 600 against 1,700 - 1,800 of room
    assert h.scheduler.waiting_for_room == 2
    h.advance(61)
    d = h.tick()
    assert sorted(d.paused) == ["a", "b"]  # 1,800 - 900 <= 1,700 - 600, not 1,700 - 300
    assert isinstance(d.outcome(rid_x), Release) and isinstance(d.outcome(rid_y), Release)


def test_room_split_between_ranks_is_not_room_for_an_aged_turn() -> None:
    for make_room, small_runs in ((False, True), (True, False)):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
                 resume_timeout_seconds=600, aging_makes_room=make_room,
                 min_residency_seconds=1_000)  # nobody can be paused to make room
        h.workers({W0: 1_000, W1: 1_000})
        h.acting_on("h0", W0, 400)
        h.acting_on("h1", W1, 400)
        h.acting_on("filler", W0, 50)
        h.acting_on("filler1", W1, 50)
        rid_big, _ = h.turn("big", 700)  # 400 + 400 of room, but 400 on each rank
        h.advance(61)
        rid_small, _ = h.turn("small", 100)
        d = h.tick()
        assert d.outcome(rid_big) is None
        assert isinstance(d.outcome(rid_small), Release) is small_runs


def test_no_room_is_made_for_an_aged_turn_that_would_not_fit_this_tick_anyway() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True)
    h.workers({W0: 1_000})  # resume level 850
    h.acting_on("a", W0, 300)
    h.acting_on("b", W0, 300)
    rid_x, _ = h.turn("x", 500)
    rid_y, _ = h.turn("y", 500)  # x and y together need more than the rank's resume level
    h.advance(61)
    d = h.tick()
    assert d.paused == ["a"]  # room for x; pausing b too would not make room for y
    assert isinstance(d.outcome(rid_x), Release) and d.outcome(rid_y) is None


def test_no_room_is_made_where_an_aged_turn_can_already_run_elsewhere() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True, pause_target=0.9)
    h.workers({W0: 1_000})
    h.acting_on("big", W0, 100)
    h.acting_on("hog", W0, 600)
    rid_p, _ = h.turn("p", 250)  # 950: just fits
    h.scheduler.sent(rid_p, W0, h.now)
    h.complete(rid_p, 300)
    rid_p, _ = h.turn("p", 300)  # sticky: 1,000 > 950, so the pressure rule pauses big
    h.scheduler.sent(rid_p, W0, h.now)
    assert h.tick().paused == ["big"]
    rid_big, _ = h.turn("big", 700)  # big's turn waits, its home W0 full
    h.workers({W0: 1_000, W1: 1_000})  # room appears on a new rank (no event resume)
    h.advance(61)
    d = h.tick()
    assert not d.paused and not d.marked  # nobody on W0 gives way for nothing
    release = d.outcome(rid_big)
    assert isinstance(release, Release) and release.worker == W1


def test_dormant_programs_give_way_before_room_is_made_for_an_aged_turn() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True, idle_horizon_factor=3)
    h.workers({W0: 1_000})

    def step(session: str, tokens: int) -> None:
        rid, d = h.turn(session, tokens)
        assert isinstance(d.outcome(rid), Release)
        h.scheduler.sent(rid, W0, h.now)
        h.complete(rid, tokens)

    step("old", 300)
    step("hog", 100)
    h.advance(10)
    step("old", 400)  # a 10 s gap: dormant 30 s after this turn
    h.advance(15)
    step("hog", 200)  # a 25 s gap: dormant 75 s after this turn
    h.advance(5)
    rid_big, _ = h.turn("big", 500)  # 600 + 500 > 950, nobody dormant yet: waits
    h.advance(61)  # big has aged; old is dormant, hog is not
    d = h.tick()
    assert [(s.program, s.reason) for s in d.steps if s.kind.value == "paused"] == [
        ("old", "idle")]
    assert isinstance(d.outcome(rid_big), Release)
    assert h.scheduler.counters["aging_pauses"] == 0


def test_an_aged_turn_is_placed_before_a_larger_one_chosen_with_it() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True, min_residency_seconds=1e4)
    h.workers({W0: 1_000, W1: 1_000})  # resume level 850 each
    h.acting_on("a", W0, 350)
    h.acting_on("b", W1, 550)
    h.acting_on("f0", W0, 500)
    h.acting_on("f1", W1, 300)  # both ranks at 850
    rid_x, _ = h.turn("x", 350)  # no room: waits
    h.advance(61)
    rid_y, _ = h.turn("y", 420)  # waits behind x
    h.final("f0")
    h.final("f1")  # room: 500 on W0, 300 on W1; both are chosen, only one fits W0
    d = h.tick()
    release = d.outcome(rid_x)
    assert isinstance(release, Release) and release.worker == W0
    assert d.outcome(rid_y) is None  # larger, but it would have taken the room x waited for


def test_a_turn_just_let_in_is_not_marked_to_make_room_for_the_next() -> None:
    from dynamo_thunderagent.program import Phase

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True, min_residency_seconds=30)
    h.workers({W0: 1_000})
    h.acting_on("hog", W0, 600)
    h.advance(100)  # hog is past its residency
    rid_a, _ = h.turn("a", 700)
    h.advance(1)
    rid_b, _ = h.turn("b", 700)
    h.advance(60)  # a has aged: hog is paused for it, and a runs
    d = h.tick()
    assert d.paused == ["hog"] and isinstance(d.outcome(rid_a), Release)
    h.scheduler.sent(rid_a, W0, h.now)
    h.advance(5)  # b has aged too, and W0 holds only a, which just came in
    d = h.tick()
    assert h.program("a").phase is Phase.REASONING and not h.program("a").marked_for_pause
    assert not d.marked and d.outcome(rid_b) is None


# ---- sessionless_kv: traffic no program owns ---------------------------------------------
def _sessionless(**params: object) -> Harness:
    h = make(buffer_per_program=0, sessionless_kv="reserve", **params)
    h.workers({W0: 1_000})
    return h


def test_a_sessionless_request_running_takes_its_room_from_admission_until_it_ends() -> None:
    h = _sessionless(resume_on_events=True)
    h.acting_on("a", W0, 500)
    h.scheduler.sessionless_started("chat-1", W0, 400, h.now)
    assert h.scheduler.capacity.known[W0] == 600
    rid, d = h.turn("b", 200)  # 500 + 200 > 600 x 0.95: no room while the chat runs
    assert d.outcome(rid) is None
    d = h.scheduler.sessionless_ended("chat-1", h.now)
    assert isinstance(d.outcome(rid), Release)  # its room is back, used at once
    assert h.scheduler.capacity.known[W0] == 1_000


def test_sessionless_traffic_is_ignored_unless_reserve_is_asked() -> None:
    h = make(buffer_per_program=0)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 500)
    h.scheduler.sessionless_started("chat-1", W0, 400, h.now)
    rid, d = h.turn("b", 200)
    assert isinstance(d.outcome(rid), Release) and h.scheduler.capacity.known[W0] == 1_000
    # Followed all the same: switching to reserve live takes what runs now into account.
    h.scheduler.reconfigure(h.scheduler.params.model_copy(update={"sessionless_kv": "reserve"}))
    assert h.scheduler.capacity.known[W0] == 600
    state = h.scheduler.snapshot(h.now)
    assert state["sessionless_tokens"] == {str(W0): 400}


def test_a_rank_filled_by_sessionless_traffic_pauses_a_tool_waiting_program() -> None:
    h = _sessionless()
    h.acting_on("a", W0, 350)
    rid, _ = h.turn("b", 150)
    h.scheduler.sent(rid, W0, h.now)
    h.scheduler.sessionless_started("chat-1", W0, 250, h.now)
    h.scheduler.sessionless_started("chat-2", W0, 250, h.now)  # 500 > 500 x 0.95
    assert h.tick().paused == ["a"]


def test_a_ranks_only_program_is_not_paused_for_sessionless_traffic() -> None:
    # Paused, it would be let straight back in: nobody else could use its room.
    h = _sessionless()
    h.acting_on("a", W0, 580)
    h.scheduler.sessionless_started("chat-1", W0, 400, h.now)  # 580 > 600 x 0.95
    assert not h.tick().paused


def test_at_most_half_a_rank_is_reserved_for_sessionless_traffic() -> None:
    # Each request counts its whole prompt, so chats sharing a cached system prompt are
    # over-counted; programs keep room to run.
    h = _sessionless()
    for k in range(5):
        h.scheduler.sessionless_started(f"chat-{k}", W0, 300, h.now)
    assert h.scheduler.capacity.known[W0] == 500 and h.scheduler.capacity.reserved(W0) == 1_500
    assert h.scheduler.snapshot(h.now)["sessionless_reserved_tokens"] == {str(W0): 500}
    assert h.scheduler.capacity.largest == 1_000  # whole, for the oversize check


def test_a_program_larger_than_the_room_sessionless_traffic_leaves_goes_to_an_empty_rank(
) -> None:
    h = _sessionless()
    h.scheduler.sessionless_started("chat-1", W0, 900, h.now)
    rid, d = h.turn("big", 950)  # fits the whole capacity: neither refused nor left waiting
    assert isinstance(d.outcome(rid), Release) and not d.rejected
    h.scheduler.sessionless_ended("chat-1", h.now)
    assert h.scheduler.capacity.known[W0] == 1_000


def test_a_worker_refresh_keeps_what_sessionless_traffic_holds() -> None:
    h = _sessionless()
    h.scheduler.sessionless_started("chat-1", W0, 300, h.now)
    h.workers({W0: 1_000})  # the same card again
    assert h.scheduler.capacity.known[W0] == 700
    h.workers({W0: 2_000})  # a resized card
    assert h.scheduler.capacity.known[W0] == 1_700
    h.scheduler.sessionless_ended("chat-1", h.now)
    assert h.scheduler.capacity.known[W0] == 2_000


def test_the_room_reserved_follows_the_engines_cache_loss_with_full_loss_set() -> None:
    h = _sessionless(sessionless_kv_full_loss=0.1)
    h.acting_on("a", W0, 500)
    h.scheduler.sessionless_started("chat-1", W0, 400, h.now)
    assert h.scheduler.capacity.known[W0] == 600  # no loss measured yet: all of it
    rid, d = h.turn("b", 200)  # 500 + 200 > 600 x 0.95: waits
    assert d.outcome(rid) is None
    loss = h.scheduler.cache_loss
    loss.observe(W0, 1_000, 1_000)  # the engine kept everything programs expected
    d = h.tick()  # ... so nothing is held back for the chat, and b goes in at once
    assert h.scheduler.capacity.known[W0] == 1_000 and isinstance(d.outcome(rid), Release)
    for _ in range(3):
        loss.observe(W0, 1_000, 500)  # it starts to lose half of it
    ratio = loss.loss_ratio(W0)
    assert ratio is not None and ratio >= 0.1
    h.tick()
    assert h.scheduler.capacity.known[W0] == 600  # from a 10% loss up: all of it again
    state = h.scheduler.snapshot(h.now)
    assert state["sessionless_reserved_tokens"] == {str(W0): 400}


def test_a_partial_loss_reserves_that_share_of_the_room() -> None:
    h = _sessionless(sessionless_kv_full_loss=0.2)
    h.scheduler.cache_loss.observe(W0, 1_000, 950)  # 5% lost: a quarter of 0.2
    h.scheduler.sessionless_started("chat-1", W0, 400, h.now)
    assert h.scheduler.capacity.reserved(W0) == 100
    assert h.scheduler.capacity.known[W0] == 900
    h.scheduler.sessionless_ended("chat-1", h.now)
    assert h.scheduler.capacity.known[W0] == 1_000
    assert h.scheduler.snapshot(h.now)["sessionless_reserved_tokens"] == {}


def test_sessionless_bookkeeping_ignores_repeats_and_unknown_ids_and_is_bounded() -> None:
    h = _sessionless(max_tracked_requests=2)
    for rid in ("c1", "c1", "c2", "c3"):  # c1 twice; c3 is past the bound
        h.scheduler.sessionless_started(rid, W0, 100, h.now)
    assert h.scheduler.capacity.known[W0] == 800
    assert h.scheduler.counters["sessionless_untracked"] == 1
    h.scheduler.sessionless_ended("c3", h.now)  # never followed: nothing to give back
    h.scheduler.sessionless_ended("nobody", h.now)
    assert h.scheduler.capacity.known[W0] == 800
    h.scheduler.sessionless_ended("c1", h.now)
    h.scheduler.sessionless_ended("c1", h.now)  # ended twice: given back once
    assert h.scheduler.capacity.known[W0] == 900
    h.scheduler.sessionless_ended("c2", h.now)
    assert h.scheduler.capacity.known[W0] == 1_000 and not h.scheduler.snapshot(h.now)[
        "sessionless_tokens"]


def test_a_program_sharing_its_rank_runs_on_a_rank_that_holds_no_program() -> None:
    for leave, expected in ((False, W0), (True, W1)):
        h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9,
                 leave_for_empty_rank=leave)
        h.workers({W0: 1_000, W1: 1_000})
        h.acting_on("a", W0, 300)
        h.acting_on("b", W0, 300)
        h.acting_on("c", W1, 300)
        h.final("c")  # W1 holds no program now; a and b share W0
        moves = h.scheduler.counters["moves"]
        rid, d = h.turn("b", 350)
        released = d.outcome(rid)
        assert isinstance(released, Release) and released.worker == expected
        assert h.scheduler.table.programs["b"].worker == expected
        assert h.scheduler.counters["empty_rank_moves"] == int(leave)
        assert h.scheduler.counters["moves"] - moves == int(leave)
    steps = [(e.kind.name, e.program, e.reason) for e in d.steps]
    assert ("MOVED", "b", "empty_rank") in steps and ("ADMITTED", "b", "empty_rank") in steps


@pytest.mark.parametrize("case", ["alone", "too_large", "someone_waits", "rank_holds_one",
                                  "rank_of_a_paused_program", "rank_reserved"])
def test_a_program_stays_home_unless_it_shares_it_and_an_empty_rank_fits_it(case: str) -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, leave_for_empty_rank=True,
             sessionless_kv="reserve")
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("a", W0, 300)
    if case != "alone":
        h.acting_on("b", W0, 300)
    if case == "rank_of_a_paused_program":
        h.acting_on("c", W1, 800)
        h.workers({W0: 1_000, W1: 700})  # W1 over its threshold: c pauses, W1 looks empty
        assert h.tick().paused == ["c"]
        h.workers({W0: 1_000, W1: 1_000})  # the rank c would resume into
    if case == "rank_reserved":  # a request without a session id runs on W1
        h.scheduler.sessionless_started("x", W1, 100, h.now)
    if case == "someone_waits":
        h.acting_on("c", W1, 900)
        rid_w, d = h.turn("w", 600)  # fits no rank: paused, waiting for room
        assert d.outcome(rid_w) is None
        h.final("c")  # W1 now holds no program, but w waits for it
        assert h.scheduler.table.programs["w"].lifecycle is Lifecycle.PAUSED
    if case == "rank_holds_one":
        h.acting_on("c", W1, 300)
    tokens = 980 if case == "too_large" else 350  # past W1's threshold (0.95 x 1,000)
    rid, d = h.turn("a", tokens)
    released = d.outcome(rid)
    assert isinstance(released, Release) and released.worker == W0, case
    assert h.scheduler.counters["empty_rank_moves"] == 0


def test_of_several_empty_ranks_a_program_takes_the_lowest() -> None:
    w2 = WorkerKey(2)
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, leave_for_empty_rank=True)
    h.workers({w2: 1_000, W1: 1_000, W0: 1_000})
    h.acting_on("a", W0, 300)
    h.acting_on("b", W0, 300)
    rid, d = h.turn("b", 350)
    released = d.outcome(rid)
    assert isinstance(released, Release) and released.worker == W1


def test_aged_turns_are_booked_lazily_reading_usage_the_earlier_pauses_left() -> None:
    # Two aged turns of programs with no home, 400 tokens each; W0 holds 300, W1 400, both
    # ranks 1,000 (resume level 850). The first goes to W0 (550 left after usage, against
    # 450). Once the pause made for it empties W0, the second sees W0 and W1 level (450
    # each) and goes to the lower rank, W0; booked on the usage before that pause it would
    # have gone to W1 (150 against 450).
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9, max_wait_seconds=60,
             resume_timeout_seconds=600, aging_makes_room=True)
    h.workers({W0: 1_000, W1: 1_000})
    h.acting_on("x", W0, 300)
    h.acting_on("y", W1, 400)
    table, scheduler = h.scheduler.table, h.scheduler
    aged = []
    for name in ("a", "b"):
        program = table.create(name, h.now)
        program.tokens, program.deferred_since = 400, h.now - 61
        aged.append(program)
    bookings = scheduler.planner.aged_room(aged, table, scheduler.capacity, h.now)
    assert next(bookings) == (W0, 450.0)
    with table.changing(h.program("x")):
        h.program("x").lifecycle = Lifecycle.PAUSED
    assert table.usage(W0) == 0
    assert next(bookings) == (W0, 50.0)
    assert next(bookings, None) is None
