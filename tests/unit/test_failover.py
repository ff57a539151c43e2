"""Failover's pure parts: which errors are a worker's, which say it is gone, which worker an
error names, and the request that carries a turn on (no Dynamo needed)."""

from __future__ import annotations

import pytest

from dynamo_thunderagent.dynamo.failover import (
    Continuation,
    address_in_error,
    may_fail_over,
    refusal,
    worker_at,
    worker_lost,
)


# ---- a turn carried on on another worker (failover) -----------------------------------------
def test_a_continuation_asks_for_the_prompt_plus_what_was_streamed_within_the_budget() -> None:
    request = {"token_ids": [1, 2, 3], "routing": {},
               "stop_conditions": {"max_tokens": 5, "min_tokens": 3, "ignore_eos": True}}
    continuation = Continuation(request)
    assert continuation.next_request() == request  # nothing streamed: the same request
    continuation = Continuation(request)
    continuation.carry({"token_ids": [7]})
    continuation.carry({"token_ids": []})
    continuation.carry({"token_ids": [8]})
    following = continuation.next_request()
    assert following is not None
    assert following["token_ids"] == [1, 2, 3, 7, 8]
    assert following["stop_conditions"] == {"max_tokens": 3, "min_tokens": 1,
                                            "ignore_eos": True}
    assert request["token_ids"] == [1, 2, 3] and request["stop_conditions"]["max_tokens"] == 5
    assert (continuation.carried, continuation.failovers) == (2, 1)
    continuation.carry({"token_ids": [9, 10, 11]})  # the budget is spent: nothing to ask
    assert continuation.next_request() is None


def test_a_continuations_usage_is_reported_as_the_original_requests() -> None:
    continuation = Continuation({"token_ids": list(range(10))})
    chunk = {"token_ids": [5], "completion_usage": {
        "prompt_tokens": 12, "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 12}}}
    assert continuation.as_one_stream(chunk) is chunk  # before any failover: unchanged
    continuation.carry({"token_ids": [3, 4]})
    continuation.next_request()
    assert continuation.as_one_stream({"token_ids": [5]}) == {"token_ids": [5]}
    assert continuation.as_one_stream(chunk)["completion_usage"] == {
        "prompt_tokens": 10, "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 10}}
    assert chunk["completion_usage"]["prompt_tokens"] == 12  # the worker's chunk is kept


def test_a_stream_longer_than_the_bound_is_not_kept_and_cannot_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo_thunderagent.dynamo import failover

    monkeypatch.setattr(failover, "CONTINUATION_MAX_TOKENS", 4)
    continuation = Continuation({"token_ids": [1], "stop_conditions": {"max_tokens": 100}})
    continuation.carry({"token_ids": [7, 8, 9]})
    assert list(continuation.streamed) == [7, 8, 9]
    continuation.carry({"token_ids": [10, 11]})  # past the bound: memory stays bounded
    assert len(continuation.streamed) == 0 and continuation.overflowed
    assert continuation.next_request() is None


def test_which_errors_are_the_workers_and_which_may_fail_over() -> None:
    def named(name: str, message: str = "x") -> Exception:
        return type(name, (Exception,), {})(message)

    # Dynamo 1.6.1: a killed worker's stream, and a connection it refuses.
    assert worker_lost(ValueError("Unavailable: Stream ended before generation completed"))
    assert worker_lost(Exception("Unavailable: TCP connection to 127.0.0.1:1 failed"))
    # ... and a request a stopped worker never took (seen live: a SIGSTOPped mocker).
    assert worker_lost(Exception("DeadlineExceeded: TCP request to 127.0.0.1:1 timed out"))
    # Other deadlines say the request waited too long, not that the worker is gone.
    assert not worker_lost(Exception("DeadlineExceeded: the request exceeded its deadline"))
    assert worker_lost(named("Disconnected")) and worker_lost(ConnectionResetError())
    assert not worker_lost(RuntimeError("engine hiccup"))
    assert may_fail_over(RuntimeError("engine hiccup"))
    for kind in ("InvalidArgument", "Cancelled", "RouterQueueLimitExceeded"):
        assert not may_fail_over(named(kind))
    # A worker's own refusal, as Dynamo 1.6.1 passes it on.
    refused = Exception(
        'Unavailable: BackendInvalidArgument: {"message": "bad grammar", "code": 400}')
    assert not may_fail_over(refused)
    assert not worker_lost(refused)  # a live worker sent it: not a reason to avoid it
    assert not worker_lost(RuntimeError("Unavailableness is not a connection error"))
    # Other errors a live worker's handler sends: only those saying its engine is gone
    # put it aside.
    assert not worker_lost(Exception("Unavailable: BackendUnknown: ValueError: bad logprobs"))
    assert not worker_lost(Exception("Unavailable: BackendResponseTimeout: engine slow"))
    assert worker_lost(Exception("Unavailable: BackendEngineShutdown: engine stopped"))
    assert worker_lost(Exception("Unavailable: BackendDisconnected: engine went away"))


def test_what_a_refusal_says_to_its_client() -> None:
    invalid = type("InvalidArgument", (Exception,), {})
    assert refusal(invalid("max_tokens must be >= 1")) == "max_tokens must be >= 1"
    assert refusal(Exception(
        'Unavailable: BackendInvalidArgument: {"message": "bad grammar", "code": 400}'
    )) == "bad grammar"
    assert refusal(Exception("Unavailable: BackendInvalidArgument: not JSON here")) == (
        "not JSON here")
    assert refusal(Exception('Unavailable: BackendInvalidArgument: {"code": 400}')) == (
        '{"code": 400}')
    assert refusal(Exception("Unavailable: BackendUnknown: ValueError: x")) is None
    assert refusal(ConnectionError("reset")) is None


def test_errors_read_on_demand_are_read_by_the_kind_their_text_starts_with() -> None:
    # Read on demand (router.DEMAND_DRIVEN), Dynamo 1.6.1 passes a worker's errors on as
    # plain exceptions that start with the kind: seen live with tests/e2e/fault_engine.py,
    # whose refusal (an InvalidArgument) came back as this.
    refused = ValueError("InvalidRequest: fault engine: this request is refused on purpose")
    assert not may_fail_over(refused)  # another worker would refuse it too
    assert not worker_lost(refused)
    assert refusal(refused) == "fault engine: this request is refused on purpose"
    assert refusal(ValueError("InvalidArgument: max_tokens must be >= 1")) == (
        "max_tokens must be >= 1")
    assert not may_fail_over(ValueError("Cancelled: the request was cancelled"))
    assert worker_lost(ValueError("Disconnected: connection reset"))
    # The failure of one request (the fault engine's Unknown, seen so in both modes) may
    # go on elsewhere and says nothing of the worker.
    failed = ValueError("Internal: fault engine: this request failed on purpose")
    assert may_fail_over(failed) and not worker_lost(failed) and refusal(failed) is None
    # Only Dynamo's kinds, and only at the start, of a plain exception: a class of ours
    # keeps its name, and a message that merely mentions a kind is not one.
    assert refusal(ValueError("Pinned worker 7 dp_rank 0 is not eligible")) is None
    assert refusal(ValueError("Weird: InvalidRequest: x")) is None
    assert may_fail_over(type("StreamCut", (Exception,), {})("InvalidRequest: no"))


def test_the_worker_address_a_dynamo_error_names_finds_its_instance() -> None:
    assert address_in_error(Exception(
        "Unavailable: TCP connection to 127.0.0.1:45289 failed")) == "127.0.0.1:45289"
    assert address_in_error(Exception(
        "DeadlineExceeded: TCP request to 127.0.0.1:43629 timed out")) == "127.0.0.1:43629"
    assert address_in_error(Exception("Unavailable: Stream ended before generation")) is None
    instances = [(1, "127.0.0.1:45289/ab/ns/backend/generate"),
                 (2, "127.0.0.1:4528/cd/ns/backend/generate")]
    assert worker_at("127.0.0.1:45289", instances) == 1
    assert worker_at("127.0.0.1:4528", instances) == 2  # the whole host:port, not a prefix
    assert worker_at("127.0.0.1:1", instances) is None
    assert worker_at("127.0.0.1:45289", [*instances, (3, "127.0.0.1:45289/ef")]) is None
