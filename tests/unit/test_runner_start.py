"""A benchmark run survives one failed stack start (a cold machine's slow first start)."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_thunderagent.bench.runner import start_stack
from dynamo_thunderagent.stack.process import StackError


class FakeStack:
    """Starts, or fails with a StackError whose message carries log tails, as told."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.stopped = False

    def start(self) -> FakeStack:
        if self.fails:
            raise StackError("timed out after 60s waiting for 2 worker registrations\n"
                             "----- worker-0 (pid 1, alive) log\nstill importing")  # fmt: skip
        return self

    def stop(self) -> None:
        self.stopped = True


def factory(outcomes: list[bool]) -> tuple[list[FakeStack], Any]:
    made: list[FakeStack] = []

    def make() -> Any:
        stack = FakeStack(fails=outcomes[len(made)])
        made.append(stack)
        return stack

    return made, make


def test_a_failed_start_is_stopped_reported_and_retried_with_a_fresh_stack() -> None:
    made, make = factory([True, False])
    said: list[str] = []
    started = start_stack(make, said.append, "stock")
    assert started is made[1]
    assert made[0].stopped and not made[1].stopped
    assert "stack start 1/2 failed: timed out" in said[0]
    assert "starting a fresh one" in said[0]
    assert "still importing" in said[1]  # the failed processes' logs are on record


def test_the_last_failure_is_raised_after_every_attempt_failed() -> None:
    made, make = factory([True, True])
    said: list[str] = []
    with pytest.raises(StackError, match="worker registrations"):
        start_stack(make, said.append, "stock")
    assert [s.stopped for s in made] == [True, True]
    assert any("giving up" in line for line in said)


def test_attempts_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        start_stack(lambda: FakeStack(False), print, "stock", attempts=0)  # type: ignore[arg-type,return-value]
