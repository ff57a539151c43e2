"""The ledger of requests without a session id (``sessionless.py``), on its own."""

from __future__ import annotations

import pytest

from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.sessionless import SessionlessTraffic

W0, W1 = WorkerKey(1, 0), WorkerKey(2, 0)


def test_the_ledger_sums_running_prompts_per_rank_and_forgets_ended_ones() -> None:
    traffic = SessionlessTraffic()
    assert traffic.started("a", W0, 300, limit=10)
    assert traffic.started("b", W0, 100, limit=10)
    assert traffic.started("c", W1, 50, limit=10)
    assert dict(traffic.tokens) == {W0: 400, W1: 50}
    assert traffic.ended("a") == W0 and dict(traffic.tokens) == {W0: 100, W1: 50}
    assert traffic.ended("c") == W1 and dict(traffic.tokens) == {W0: 100}  # none: absent
    assert traffic.ended("c") is None and traffic.ended("unknown") is None
    assert "b" in traffic and "a" not in traffic


def test_the_ledger_follows_no_empty_prompt_no_id_twice_and_no_more_than_its_limit() -> None:
    traffic = SessionlessTraffic()
    assert not traffic.started("empty", W0, 0, limit=2)
    assert traffic.started("a", W0, 10, limit=2)
    assert not traffic.started("a", W1, 10, limit=2)  # already followed, where it runs
    assert traffic.started("b", W0, 10, limit=2)
    assert not traffic.started("c", W0, 10, limit=2)  # the limit: counted by the caller
    assert dict(traffic.tokens) == {W0: 20}


@pytest.mark.parametrize(("mode", "full_loss", "loss", "reserved"), [
    ("ignore", None, None, 0),      # nothing comes off
    ("reserve", None, 0.0, 1_000),  # all of it, whatever the engine loses
    ("reserve", 0.1, None, 1_000),  # not measured yet: all of it
    ("reserve", 0.1, 0.0, 0),       # the engine keeps every program's cache: none
    ("reserve", 0.1, 0.05, 500),    # half the loss that takes all: half
    ("reserve", 0.1, 0.3, 1_000),   # past it: all, never more
])
def test_the_room_taken_off_follows_the_policy_and_the_engines_loss(
        mode: str, full_loss: float | None, loss: float | None, reserved: int) -> None:
    traffic = SessionlessTraffic()
    traffic.started("a", W0, 1_000, limit=10)
    assert traffic.reserved(W0, mode, full_loss, loss) == reserved  # type: ignore[arg-type]
    assert traffic.reserved(W1, mode, full_loss, loss) == 0  # nothing runs there
