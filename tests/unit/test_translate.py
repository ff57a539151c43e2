"""Translations between Dynamo 1.6.1 wire shapes and the scheduler's inputs (no Dynamo needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.classifier import Aborted, Completed, Responding, Sent
from dynamo_thunderagent.dynamo.translate import (
    BadSessionHeader,
    StreamTracker,
    asks_for_stop_strings,
    capacity_cards,
    classify_request,
    engine_error,
    for_frontend,
    hash_prefix_blocks,
    pin_request,
    prefill_only_workers,
    served_by,
    session_final_response,
    with_serving_worker,
    worker_loads,
)
from dynamo_thunderagent.program import (
    NO_PREFIX,
    PREFIX_LEVEL_HASHES,
    PrefixBlocks,
    WorkerKey,
    prefix_ends,
)
from dynamo_thunderagent.selector import WorkerLoad


def request(agent_context: dict[str, Any] | None = None, tokens: int = 5,
            **extra: Any) -> dict[str, Any]:
    """A tokenized request as the frontend sends it (the keys the router reads)."""
    body: dict[str, Any] = {"model": "tiny", "token_ids": list(range(100, 100 + tokens)),
                            "routing": {}, **extra}
    if agent_context is not None:
        body["agent_context"] = agent_context
    return body


def first_chunk(worker: int = 7, rank: int = 0, token: int = 1500) -> dict[str, Any]:
    return {
        "token_ids": [token], "finish_reason": None,
        "completion_usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
                             "prompt_tokens_details": {"cached_tokens": 32}},
        "routing_data": {"worker_id": {"prefill_worker_id": worker, "prefill_dp_rank": rank,
                                       "decode_worker_id": worker, "decode_dp_rank": rank}},
    }


def middle_chunk(token: int = 1501) -> dict[str, Any]:
    return {"token_ids": [token], "finish_reason": None}


def final_chunk(prompt: int = 40, completion: int = 3) -> dict[str, Any]:
    return {
        "token_ids": [], "finish_reason": "length",
        "completion_usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion,
                             "prompt_tokens_details": {"cached_tokens": 32}},
        "routing_data": {"timing": {"ttft_ms": 3.0}},
    }


# ---- classify_request --------------------------------------------------------------
def test_classify_request_reads_the_session_from_agent_context() -> None:
    req = request({"session_id": "s1", "parent_session_id": "p1",
                   "input_trigger": "user_message"}, tokens=7)
    out = classify_request(req, "r1")
    assert (out.request_id, out.session_id, out.parent_session_id) == ("r1", "s1", "p1")
    assert out.input_tokens == 7 and out.session_final is False


def test_request_without_agent_context_has_no_session() -> None:
    out = classify_request(request(None), "r1")
    assert out.session_id is None and out.parent_session_id is None
    assert out.session_final is False and out.input_tokens == 5


def test_session_ids_are_strings_and_a_missing_one_means_no_session() -> None:
    assert classify_request(request({"session_id": 42}), "r").session_id == "42"
    assert classify_request(request({"input_trigger": "user_message"}), "r").session_id is None
    assert classify_request({"token_ids": [1, 2]}, "r").session_id is None


@pytest.mark.parametrize(
    ("context", "expected"),
    [({"session_id": ""}, "got 0 characters"),
     ({"session_id": "x" * 257}, "got 257 characters"),
     ({"session_id": "x" * 8192}, "got 8192 characters"),
     ({"session_id": "sessi\u00f6n"}, "got the character"),
     ({"session_id": "tab\there"}, "got the character '\\t'"),
     ({"session_id": "ok", "parent_session_id": " "}, "X-Dynamo-Parent-Session-ID must be")],
)
def test_a_session_id_outside_the_accepted_syntax_is_refused_saying_what_is_allowed(
        context: dict[str, Any], expected: str) -> None:
    with pytest.raises(BadSessionHeader) as refused:
        classify_request(request(context), "r")
    message = str(refused.value)
    assert "1 to 256 printable ASCII characters (a UUID, say)" in message
    assert expected in message


def test_a_readable_session_id_with_spaces_is_kept_as_sent() -> None:
    # Before: a 400 for every turn of a client that names sessions "user 42 task 7",
    # which stock serves (found by a hostile-input probe).
    assert classify_request(request({"session_id": "user 42 task 7"}),
                            "r").session_id == "user 42 task 7"


def test_the_longest_accepted_session_id_is_kept_whole() -> None:
    longest = "a-Z_0.9:" * 32  # 256 characters
    assert classify_request(request({"session_id": longest}), "r").session_id == longest


def test_an_error_finish_is_an_abort_with_the_engines_message_not_a_completed_turn() -> None:
    tracker = StreamTracker("r1", prompt_tokens=1515)
    chunk = {"token_ids": [], "finish_reason":
             {"error": "request rejected: request exceeds worker admission limits"},
             "routing_data": {"worker_id": {"decode_worker_id": 7, "decode_dp_rank": 0}}}
    events = tracker.observe(chunk)
    assert events == [Sent("r1", WorkerKey(7)),
                      Aborted("r1", "engine error: request rejected: request exceeds worker "
                                    "admission limits")]
    assert tracker.engine_error == "request rejected: request exceeds worker admission limits"
    assert engine_error("error") is not None
    assert engine_error("length") is None and engine_error(None) is None


@pytest.mark.parametrize(
    ("value", "final"),
    [(True, True), ("true", True), ("True", True), (" TRUE ", True), ("1", True),
     ("yes", True), (False, False), ("false", False), ("0", False), ("", False),
     (None, False)],
)
def test_session_final_accepts_booleans_and_header_strings(value: Any, final: bool) -> None:
    req = request({"session_id": "s", "session_final": value})
    assert classify_request(req, "r").session_final is final


def test_request_without_token_ids_has_zero_input_tokens() -> None:
    assert classify_request({"agent_context": {"session_id": "s"}}, "r").input_tokens == 0


def test_classify_request_adds_prefix_hashes_only_when_asked_and_only_for_sessions() -> None:
    req = request({"session_id": "s"}, tokens=40)
    assert classify_request(req, "r").prefix == NO_PREFIX
    wanted = classify_request(req, "r", block_tokens=16, prefix_blocks=8)
    assert wanted.prefix == hash_prefix_blocks(req["token_ids"], 16, 8)
    assert len(wanted.prefix.hashes) == 2 and wanted.prefix.block_tokens == 16
    anonymous = classify_request(request(None, tokens=40), "r", block_tokens=16,
                                 prefix_blocks=8)
    assert anonymous.prefix == NO_PREFIX


def test_prefix_hashes_span_the_token_window_with_spans_doubling_per_level() -> None:
    req = request({"session_id": "s"}, tokens=2_000)
    spanned = classify_request(req, "r", block_tokens=16, prefix_blocks=256,
                               prefix_tokens=1_600)
    assert spanned.prefix == hash_prefix_blocks(req["token_ids"], 16, 256, 1_600)
    # 32 hashes of one block (512 tokens), then 32 of two (1,024 more), then one of four.
    assert [(size, len(h)) for size, h in spanned.prefix.groups()] == [
        (16, 32), (32, 32), (64, 1)]
    assert spanned.prefix.tokens == 512 + 1_024 + 64
    # A shorter prompt gets the hashes that end inside it, on the same boundaries.
    short = hash_prefix_blocks(req["token_ids"][:600], 16, 256, 1_600)
    assert short.hashes == spanned.prefix.hashes[:34] and short.tokens == 512 + 64


def test_prefix_spans_match_the_ends_they_were_hashed_at() -> None:
    ends = prefix_ends(16, 256, 32_768)
    prefix = PrefixBlocks(tuple(range(len(ends))), 16, PREFIX_LEVEL_HASHES)
    assert [prefix.tokens_of(n) for n in range(1, len(ends) + 1)] == list(ends)
    assert [prefix.span_of(i) for i in range(len(ends))] == [
        end - start for start, end in zip((0, *ends), ends, strict=False)]
    assert PrefixBlocks((1, 2, 3), 16).tokens == 48  # one block a hash


@pytest.mark.parametrize(("block", "hashes", "window", "count", "last_end"), [
    (16, 256, 32_768, 192, 32 * 63 * 16),  # the defaults: six levels, 32,256 tokens
    (64, 256, 32_768, 130, 32_768),
    (16, 256, 0, 256, 4_096),  # no window: one block a hash, as many as allowed
    (16, 40, 32_768, 40, (32 + 8 * 2) * 16),  # the hash budget binds first
    (16, 256, 8, 1, 16),  # a window under one block: still one block
    (0, 256, 32_768, 0, 0),  # no block size: nothing to hash
    (16, 0, 32_768, 0, 0),
])
def test_prefix_ends(block: int, hashes: int, window: int, count: int, last_end: int) -> None:
    ends = prefix_ends(block, hashes, window)
    assert len(ends) == count and (ends[-1] if ends else 0) == last_end
    assert all(end % block == 0 for end in ends) and list(ends) == sorted(set(ends))


def test_prefix_hashes_are_equal_exactly_while_prompts_share_a_prefix() -> None:
    shared = list(range(32))
    a = hash_prefix_blocks([*shared, *range(100, 116)], 16, 8).hashes
    b = hash_prefix_blocks([*shared, *range(200, 216)], 16, 8).hashes
    assert len(a) == len(b) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    # Only full blocks count, and at most max_blocks of them.
    assert hash_prefix_blocks(list(range(31)), 16, 8).hashes == a[:1]
    assert hash_prefix_blocks(list(range(64)), 16, 2).hashes == a[:2]


# ---- pinning and response shaping ------------------------------------------------------------
def test_pin_request_names_the_worker_and_rank_without_touching_the_original() -> None:
    original = request({"session_id": "s"}, routing={"priority": 3})
    pinned = pin_request(original, WorkerKey(9, 2))
    assert pinned["routing"] == {"priority": 3, "backend_instance_id": 9, "dp_rank": 2}
    assert original["routing"] == {"priority": 3}
    assert pinned["token_ids"] == original["token_ids"]


def test_pin_request_works_when_routing_is_missing_or_null() -> None:
    assert pin_request({"token_ids": []}, WorkerKey(1))["routing"] == {
        "backend_instance_id": 1, "dp_rank": 0}
    assert pin_request({"routing": None}, WorkerKey(1, 1))["routing"]["dp_rank"] == 1


def test_served_by_reads_the_decode_worker_and_rank() -> None:
    assert served_by(first_chunk(worker=7, rank=3)) == WorkerKey(7, 3)


def test_served_by_falls_back_to_the_prefill_worker_and_rank_zero() -> None:
    chunk = {"routing_data": {"worker_id": {"prefill_worker_id": "12"}}}
    assert served_by(chunk) == WorkerKey(12, 0)


def test_chunks_without_a_worker_are_served_by_nobody() -> None:
    assert served_by(middle_chunk()) is None
    assert served_by(final_chunk()) is None
    assert served_by({"routing_data": None}) is None


def test_serving_worker_goes_into_engine_data_next_to_what_was_there() -> None:
    chunk = {**first_chunk(), "engine_data": {"engine": {"x": 1}}}
    out = with_serving_worker(chunk, WorkerKey(7, 1))
    assert out["engine_data"] == {"engine": {"x": 1},
                                  "thunderagent": {"worker_id": 7, "dp_rank": 1}}
    assert "thunderagent" not in chunk["engine_data"]


def test_the_frontend_never_sees_the_workers_id_in_routing_data() -> None:
    chunk = first_chunk()
    assert "worker_id" in chunk["routing_data"]
    out = for_frontend(chunk, WorkerKey(7, 1))
    assert "worker_id" not in out["routing_data"]
    assert out["engine_data"]["thunderagent"] == {"worker_id": 7, "dp_rank": 1}
    assert "worker_id" in chunk["routing_data"]  # the engine's chunk is not modified
    later = for_frontend(chunk, None)
    assert "worker_id" not in later["routing_data"] and "engine_data" not in later
    plain = middle_chunk()
    assert for_frontend(plain, None) is plain  # nothing to change: no copy


def test_session_final_response_is_one_finished_chunk_with_the_prompt_usage() -> None:
    out = session_final_response(request({"session_id": "s", "session_final": True}, tokens=4))
    assert out["token_ids"] == [] and out["finish_reason"] == "stop"
    assert out["completion_usage"] == {"prompt_tokens": 4, "completion_tokens": 0,
                                       "total_tokens": 4}


# ---- StreamTracker ----------------------------------------------------------------------
def test_tracker_reports_sent_and_responding_once_then_completed_with_the_context() -> None:
    tracker = StreamTracker("r1", prompt_tokens=38)
    assert tracker.observe(first_chunk(worker=7)) == [Sent("r1", WorkerKey(7, 0)),
                                                      Responding("r1")]
    assert tracker.observe(middle_chunk()) == []
    # A later chunk that names a worker again is not a second Sent.
    assert tracker.observe({**middle_chunk(), "routing_data": first_chunk(8)["routing_data"]}) == []
    assert tracker.observe(final_chunk(prompt=40, completion=3)) == [Completed("r1", 43, 32)]
    assert tracker.terminal == Completed("r1", 43, 32)
    assert tracker.cached_tokens == 32


def test_completed_counts_generated_tokens_when_usage_is_missing() -> None:
    tracker = StreamTracker("r1", prompt_tokens=10)
    assert tracker.observe({"token_ids": [1, 2], "finish_reason": None}) == [Responding("r1")]
    assert tracker.observe({"token_ids": [3], "finish_reason": "stop"}) == [Completed("r1", 13)]
    assert tracker.sent_to is None  # no routing data: the worker stays unknown


def test_a_stream_that_names_its_worker_before_any_token_responds_at_the_first_token() -> None:
    tracker = StreamTracker("r1", prompt_tokens=10)
    routing_only = {"token_ids": [], "routing_data": first_chunk()["routing_data"]}
    assert tracker.observe(routing_only) == [Sent("r1", WorkerKey(7, 0))]
    assert tracker.observe(middle_chunk()) == [Responding("r1")]


def test_one_chunk_stream_yields_every_event_in_order() -> None:
    tracker = StreamTracker("r1", prompt_tokens=40)
    chunk = {**first_chunk(), "finish_reason": "length"}
    assert tracker.observe(chunk) == [Sent("r1", WorkerKey(7, 0)), Responding("r1"),
                                      Completed("r1", 41, 32)]


def test_abort_before_completion_is_the_one_terminal_event() -> None:
    tracker = StreamTracker("r1", prompt_tokens=40)
    tracker.observe(first_chunk())
    assert tracker.abort("worker went away") == [Aborted("r1", "worker went away")]
    assert tracker.abort("again") == []
    assert tracker.observe(final_chunk()) == []  # nothing after the terminal event


def test_abort_after_completion_yields_nothing() -> None:
    tracker = StreamTracker("r1", prompt_tokens=40)
    tracker.observe(first_chunk())
    tracker.observe(final_chunk())
    assert tracker.abort("stream ended") == []
    assert tracker.terminal == Completed("r1", 43, 32)


def test_a_stream_the_frontend_cuts_after_tokens_of_a_request_with_stop_strings_completes(
) -> None:
    # The frontend ends a stream at a stop string as it does for a client that leaves.
    tracker = StreamTracker("r1", prompt_tokens=40)
    tracker.observe(first_chunk())  # one token, 32 of the prompt cached
    assert tracker.cut_by_the_frontend("gone", stop_strings=True) == [
        Completed("r1", 41, 32)]
    assert tracker.cut_by_the_frontend("again", stop_strings=True) == []
    # No stop strings, or nothing streamed yet: the client left, an abort.
    tracker = StreamTracker("r2", prompt_tokens=40)
    tracker.observe(first_chunk())
    assert tracker.cut_by_the_frontend("gone", stop_strings=False) == [Aborted("r2", "gone")]
    tracker = StreamTracker("r3", prompt_tokens=40)
    assert tracker.cut_by_the_frontend("gone", stop_strings=True) == [Aborted("r3", "gone")]
    assert asks_for_stop_strings({"stop_conditions": {"stop": ["Observation:"]}})
    assert not asks_for_stop_strings({"stop_conditions": {"stop": None, "max_tokens": 3}})
    assert not asks_for_stop_strings({"stop_conditions": {"stop": []}})
    assert not asks_for_stop_strings({})


# ---- capacity cards ---------------------------------------------------------------------
def card(blocks: int | None = 256, block_size: int | None = 16, dp_start: int | None = None,
         dp_size: int | None = None) -> dict[str, Any]:
    runtime: dict[str, Any] = {}
    if blocks is not None:
        runtime["total_kv_blocks"] = blocks
    if dp_start is not None:
        runtime["data_parallel_start_rank"] = dp_start
    if dp_size is not None:
        runtime["data_parallel_size"] = dp_size
    out: dict[str, Any] = {"runtime_config": runtime}
    if block_size is not None:
        out["kv_cache_block_size"] = block_size
    return out


def test_prefill_only_workers_are_those_whose_card_says_so() -> None:
    # Dynamo 1.6.1's cards (a mocker with --disaggregation-mode): "prefill", "decode",
    # "aggregated"; cards that cannot be read, or say nothing, name no one.
    cards = {"1": json.dumps({"worker_type": "prefill"}), "2": {"worker_type": "decode"},
             "3": {"worker_type": "aggregated"}, "4": {"worker_type": " Prefill "},
             "5": "not json", "6": ["a", "list"], "x": {"worker_type": "prefill"}, "7": {}}
    assert prefill_only_workers(cards) == {1, 4}


def test_capacity_cards_parse_json_cards_keyed_by_string_worker_ids() -> None:
    cards = capacity_cards({"7": json.dumps(card(256, 16)), "8": card(64, 32)})
    assert cards == {WorkerKey(7, 0): CapacityCard(256, 16), WorkerKey(8, 0): CapacityCard(64, 32)}
    assert cards[WorkerKey(7, 0)].tokens == 4096


def test_capacity_cards_carry_the_engines_context_length_where_one_is_stated() -> None:
    # Dynamo 1.6.1's mocker with --max-model-len 1024 states it on the card and in its
    # runtime config; without it, 0. A value that is no whole number states none (the
    # card's capacity still counts).
    with_limit = {**card(), "context_length": 1024}
    with_limit["runtime_config"]["context_length"] = 1024
    odd = {**card(), "context_length": "lots"}
    cards = capacity_cards({"1": with_limit, "2": card(), "3": odd,
                            "4": {**card(), "context_length": 2048}})
    assert [cards[WorkerKey(w, 0)].context_length for w in (1, 2, 3, 4)] == [1024, 0, 0, 2048]
    assert cards[WorkerKey(1, 0)].holds(1024) and not cards[WorkerKey(1, 0)].holds(1025)
    assert cards[WorkerKey(2, 0)].holds(4096) and not cards[WorkerKey(2, 0)].holds(4097)


def test_capacity_cards_give_each_data_parallel_rank_its_own_pool() -> None:
    cards = capacity_cards({"7": card(100, 16, dp_start=2, dp_size=3)})
    assert sorted(cards) == [WorkerKey(7, 2), WorkerKey(7, 3), WorkerKey(7, 4)]
    assert set(cards.values()) == {CapacityCard(100, 16)}


def test_cards_without_kv_blocks_or_block_size_contribute_no_capacity() -> None:
    cards = capacity_cards({
        "1": card(blocks=None), "2": card(block_size=None), "3": card(blocks=0),
        "4": card(block_size=0), "5": {"kv_cache_block_size": 16}, "6": card(),
    })
    assert list(cards) == [WorkerKey(6, 0)]


@pytest.mark.parametrize(("raw", "why"), [
    ("{not json", "Expecting property name"),
    ("[]", "the model card is a JSON list, not an object"),
    ("null", "the model card is a JSON NoneType, not an object"),
    (json.dumps({"kv_cache_block_size": "16x", "runtime_config": {"total_kv_blocks": 9}}),
     "kv_cache_block_size must be a whole number >= 0, got '16x'"),
    (json.dumps({"kv_cache_block_size": -16, "runtime_config": {"total_kv_blocks": 9}}),
     "kv_cache_block_size must be a whole number >= 0, got -16"),
    (json.dumps({"kv_cache_block_size": 16, "runtime_config": {"total_kv_blocks": 9.5}}),
     "runtime_config.total_kv_blocks must be a whole number >= 0, got 9.5"),
    (json.dumps({"kv_cache_block_size": 16, "runtime_config": [9]}),
     "runtime_config is not an object"),
    (json.dumps(card(9, 16, dp_start=-1)),
     "runtime_config.data_parallel_start_rank must be a whole number >= 0, got -1"),
    (json.dumps(card(9, 16, dp_size=10**9)),
     "runtime_config.data_parallel_size must be at most 4096, got 1000000000"),
])
def test_an_unreadable_card_is_left_out_with_why_and_the_others_still_count(
        raw: str, why: str) -> None:
    unreadable: dict[str, str] = {}
    cards = capacity_cards({"7": raw, "8": json.dumps(card(64, 32))}, unreadable)
    assert cards == {WorkerKey(8, 0): CapacityCard(64, 32)}
    assert list(unreadable) == ["7"]
    assert why in unreadable["7"]


def test_a_worker_id_that_is_not_a_number_is_an_unreadable_card() -> None:
    unreadable: dict[str, str] = {}
    assert capacity_cards({"w1": card(), "3": card(8, 16)}, unreadable) == {
        WorkerKey(3, 0): CapacityCard(8, 16)}
    assert unreadable == {"w1": "the worker id must be a whole number >= 0, got 'w1'"}


# ---- worker loads -------------------------------------------------------------------------
def test_worker_loads_keep_live_workers_only_sorted_by_worker_and_rank() -> None:
    rows = [
        {"worker_id": 9, "dp_rank": 1, "potential_prefill_tokens": 5,
         "potential_decode_blocks": 2, "active_requests": 1},
        {"worker_id": 3, "dp_rank": 0, "potential_prefill_tokens": 0,
         "potential_decode_blocks": 0, "active_requests": 0},
        {"worker_id": 4, "dp_rank": 0, "potential_prefill_tokens": 100,
         "potential_decode_blocks": 9, "active_requests": 3},
        {"worker_id": 9, "potential_prefill_tokens": 1},
    ]
    loads = worker_loads(rows, live_worker_ids=[9, 3])
    assert loads == [
        WorkerLoad(WorkerKey(3, 0), 0, 0),
        WorkerLoad(WorkerKey(9, 0), 1, 0),
        WorkerLoad(WorkerKey(9, 1), 5, 2),
    ]
    assert worker_loads(rows, live_worker_ids=[]) == []
