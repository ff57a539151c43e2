"""What a simulator arm is: the contract between the simulation and the policies it compares.

An :class:`Arm` sees each turn when its agent sends it and decides when and where it runs by
calling ``host.dispatch(request_id, worker)``, now or later (an admission gate defers). It
learns each turn's first token and completion, each session's end, and is ticked every
``tick_interval`` simulated seconds. Arms never touch time themselves: ``host.now()`` is the
simulated clock. :func:`kv_route` is stock Dynamo's KV routing, which every arm uses for
requests without a session and some for turns they leave unpinned.

The arms themselves are in :mod:`~dynamo_thunderagent.bench.sim.arms` (with the registry of
them) and :mod:`~dynamo_thunderagent.bench.sim.python_port`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Protocol

from dynamo_thunderagent.bench.sim.engine import Cluster, SimRequest


class ArmHost(Protocol):
    """What the simulation offers an arm."""

    @property
    def cluster(self) -> Cluster: ...

    def now(self) -> float: ...

    def dispatch(self, request_id: str, worker: int) -> None:
        """Route an admitted turn to ``worker`` (its engine queue) now."""

    def reject(self, request_id: str, reason: str) -> None:
        """Fail a turn; its agent ends."""

    def request(self, request_id: str) -> SimRequest:
        """A turn sent and not yet finished or rejected."""

    def in_flight(self, request_id: str) -> bool:
        """The turn was dispatched and has not finished."""


class Arm(ABC):
    """A scheduling policy under test. Subclasses override the hooks they need."""

    name: str = ""
    tick_interval: float | None = None

    def __init__(self) -> None:
        self._host: ArmHost | None = None

    @property
    def host(self) -> ArmHost:
        assert self._host is not None, "bind() the arm to a simulation first"
        return self._host

    def bind(self, host: ArmHost) -> None:
        """Attach to a simulation before its first event."""
        self._host = host

    @abstractmethod
    def submit(self, request: SimRequest) -> None:
        """A turn was sent: dispatch it now or later, or reject it."""

    def first_token(self, request: SimRequest) -> None:
        """The turn's first token was produced."""

    def submit_sessionless(self, request: SimRequest) -> None:
        """A request without a session id was sent: routed at once as stock KV routing
        routes it (every arm passes such requests through, as the live routers do)."""
        self.host.dispatch(request.request_id, kv_route(self.host.cluster, request, None))

    def sessionless_started(self, request: SimRequest) -> None:
        """That request produced its first token on ``request.worker``."""

    def sessionless_ended(self, request: SimRequest) -> None:
        """That request finished."""

    def completed(self, request: SimRequest) -> None:
        """The turn finished; the program's cache holds ``request.context_tokens``."""

    def session_final(self, session_id: str) -> None:
        """The agent ended (its session-final request); no turn of it is in flight."""

    def tick(self) -> None:
        """Periodic pass, every ``tick_interval`` seconds (if not None)."""

    def counters(self) -> dict[str, int]:
        """Lifetime pause / resume / forced-resume counts (0 for arms without a gate)."""
        return {"pauses": 0, "resumes": 0, "forced_resumes": 0}

    def problems(self, drained: bool) -> list[str]:
        """Broken invariants of the arm's own state (empty when healthy).

        ``drained``: every agent has ended, so nothing may be left behind.
        """
        return []


# ---- request-level KV routing -------------------------------------------------------------
def kv_route(cluster: Cluster, request: SimRequest, bound: int | None,
             overlap_weight: float = 1.0, affinity_slack: float | None = None) -> int:
    """The worker stock KV routing picks: least ``overlap_weight x prefill + decode`` blocks.

    Prefill blocks: this request's uncached blocks on the worker plus the uncached prompt
    tokens already routed there; decode blocks: blocks of every unfinished request routed
    there plus this one's (Dynamo's KV router cost, at temperature 0; ties go to the lowest
    worker index). Soft session affinity: the worker the session is bound to (its previous
    turn's) always wins, as Dynamo 1.6.1's ``--router-session-affinity-mode soft`` does with
    the default selector while that worker serves (measured: sessions bound to a worker
    decoding long replies stayed there while the other idled, `tests/e2e/test_stack_smoke.py`);
    with ``affinity_slack`` (a fraction), it wins unless another worker is cheaper by more
    than that, a model of an affinity that weighs load (the simulator's stock arm used 0.1
    until 2026-12-06).
    """
    size = cluster.block_size
    blocks = math.ceil(request.prompt_tokens / size)
    costs = []
    for worker in cluster.workers:
        uncached = blocks - worker.hit_tokens(request) // size
        prefill = uncached + worker.prefill_tokens() / size
        costs.append(overlap_weight * prefill + worker.decode_blocks() + blocks)
    best = min(range(len(costs)), key=lambda i: (costs[i], i))
    if bound is not None and (affinity_slack is None
                              or costs[bound] <= costs[best] * (1.0 + affinity_slack)):
        return bound
    return best


