"""The stack's port picks: a port handed to one process is not handed to the next before the
first has bound it (a CI run once saw two mocker workers given the same system port; the second
one's status server failed to bind, so its registration never named its port and the stack
waited for it until its start-up timeout)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from dynamo_thunderagent.stack import process
from dynamo_thunderagent.stack.process import StackError, free_port, free_system_port


@pytest.fixture(autouse=True)
def no_recent_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "_RECENT_PICKS", process.deque(maxlen=512))


def scripted(values: list[int]) -> Iterator[int]:
    yield from values
    raise AssertionError("picked more often than scripted")


def test_a_system_port_picked_and_not_yet_bound_is_not_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = free_system_port(), free_system_port()  # two ports free right now
    process._RECENT_PICKS.clear()
    picks = scripted([first, first, second])
    monkeypatch.setattr(random.SystemRandom, "randint", lambda self, a, b: next(picks))
    assert free_system_port() == first
    assert free_system_port() == second  # `first` is free still: its process has not bound it


def test_an_os_picked_port_handed_out_lately_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = scripted([41001, 41001, 41002])

    class FakeSocket:
        def __init__(self, *args: object) -> None:
            self.port = 0

        def __enter__(self) -> FakeSocket:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(ports)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(process.socket, "socket", FakeSocket)
    monkeypatch.setattr(process, "ephemeral_low", lambda: 10_500)  # no room below it
    assert free_port() == 41001
    assert free_port() == 41002


def test_ports_are_picked_below_the_range_the_os_hands_to_port_zero_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Dynamo process binding port 0 gets an ephemeral port: a port picked there for a
    # process that had not bound it yet once went to a worker's request-plane server, and
    # the router, given it as its state port, could not start.
    low = process.ephemeral_low()
    picks = [free_port() for _ in range(100)]
    assert all(process.PORT_RANGE[0] <= p < low for p in picks), picks
    first, second = picks[:2]
    process._RECENT_PICKS.clear()
    again = scripted([first, first, second])
    monkeypatch.setattr(random.SystemRandom, "randint", lambda self, a, b: next(again))
    assert free_port() == first
    assert free_port() == second  # `first` is free still: its process has not bound it


def test_a_picker_that_finds_only_recent_ports_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_system_port()
    monkeypatch.setattr(random.SystemRandom, "randint", lambda self, a, b: port)
    with pytest.raises(StackError, match="DYN_SYSTEM_PORT"):
        free_system_port()


def test_real_picks_in_a_row_are_all_different() -> None:
    picks = [free_system_port() for _ in range(50)] + [free_port() for _ in range(50)]
    assert len(set(picks)) == len(picks)
