from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import (
    NO_PREFIX,
    Lifecycle,
    Phase,
    PrefixBlocks,
    Program,
    WorkerKey,
)
from dynamo_thunderagent.scheduler import Decisions, Release, Scheduler

W0 = WorkerKey(0, 0)
W1 = WorkerKey(1, 0)
W2 = WorkerKey(2, 0)


@dataclass
class Harness:
    """Drives the pure scheduler with a fake clock; capacities in tokens (block size 1)."""

    scheduler: Scheduler
    now: float = 0.0
    counter: int = 0
    log: list[Decisions] = field(default_factory=list)

    def workers(self, capacities: dict[WorkerKey, int], live: set[int] | None = None) -> None:
        cards = {w: CapacityCard(total_kv_blocks=c, block_size=1) for w, c in capacities.items()}
        ids = {w.worker_id for w in capacities} if live is None else live
        self.scheduler.set_workers(frozenset(ids), cards)

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def turn(
        self, session: str, tokens: int, request_id: str | None = None,
        prefix: PrefixBlocks = NO_PREFIX,
    ) -> tuple[str, Decisions]:
        self.counter += 1
        rid = request_id or f"{session}-r{self.counter}"
        d = self.scheduler.submit(rid, session, tokens, self.now, prefix=prefix)
        self.log.append(d)
        return rid, d

    def final(self, session: str) -> tuple[str, Decisions]:
        self.counter += 1
        rid = f"{session}-final{self.counter}"
        d = self.scheduler.submit(rid, session, 0, self.now, session_final=True)
        return rid, d

    def complete(self, rid: str, context: int) -> Decisions:
        return self.scheduler.completed(rid, context, self.now)

    def abort(self, rid: str) -> Decisions:
        return self.scheduler.aborted(rid, self.now)

    def tick(self) -> Decisions:
        return self.scheduler.tick(self.now)

    def program(self, session: str) -> Program:
        return self.scheduler.table.programs[session]

    def acting_on(self, session: str, worker: WorkerKey, tokens: int,
                  prefix: PrefixBlocks = NO_PREFIX) -> None:
        """A program that finished one turn on ``worker`` and is now ACTING."""
        rid, d = self.turn(session, tokens, prefix=prefix)
        released = d.outcome(rid)
        assert isinstance(released, Release), f"{session} was not released: {d}"
        self.scheduler.sent(rid, worker, self.now)
        self.complete(rid, tokens)

    def state(self, session: str) -> tuple[Phase, Lifecycle]:
        p = self.program(session)
        return p.phase, p.lifecycle


def over_threshold_on_w0(h: Harness, capacities: dict[WorkerKey, int] | None = None) -> None:
    """Two programs on W0 (10,000, unless ``capacities`` says otherwise) whose usage is past
    pause_threshold: "small" (1,000) and "big" (8,000, grown by a turn to 8,800)."""
    h.workers(capacities or {W0: 10_000})
    h.acting_on("small", W0, 1_000)
    h.acting_on("big", W0, 8_000)
    rid, _ = h.turn("big", 8_800)  # a continuing turn grows it: 9,800 > 9,500
    h.complete(rid, 8_800)


def waiting_turn_on_w0(h: Harness, b_tokens: int = 5_500) -> str:
    """W0 (10,000) holds ``b_tokens`` + 5,000 in two running turns, and "small", paused
    under pressure, has a turn waiting for room there (its request id is returned)."""
    if not h.scheduler.capacity.known:
        h.workers({W0: 10_000})
    h.acting_on("small", W0, 1_000)
    h.acting_on("a", W0, 4_000)
    h.acting_on("b", W0, 4_000)
    h.turn("a", 5_000)  # sticky: 10,000 > 9,500
    assert h.tick().paused == ["small"]
    h.turn("b", b_tokens)  # sticky
    rid, d = h.turn("small", 1_200)
    assert d.outcome(rid) is None  # deferred behind its pause
    return rid


def make(**params: Any) -> Harness:
    return Harness(Scheduler(ThunderAgentParameters(**params)))


@pytest.fixture
def h() -> Harness:
    # No buffer and no decay by default, so the arithmetic in tests is plain.
    return make(buffer_per_program=0, acting_decay_tau_seconds=1e9)


@contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serves ``handler`` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
