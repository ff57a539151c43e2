"""The worker-selector role: honour the classifier's choice, else least loaded (with a
load slack, also least loaded where the choice is priced far above it).

A selector sees the eligible candidates (live workers/ranks serving the model,
with the KV router's load predictions) and the classifier's preferred
worker/rank. Pure: no I/O, deterministic for equal loads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel

from dynamo_thunderagent.parameters import EmptyParameters, ThunderAgentSelectorParameters
from dynamo_thunderagent.program import WorkerKey


class NoEligibleWorker(RuntimeError):
    """No live worker/rank serves the model right now."""


@dataclass(frozen=True)
class WorkerLoad:
    """Load of one candidate worker/rank, as the KV router predicts it."""

    worker: WorkerKey
    prefill_tokens: int = 0
    decode_blocks: int = 0

    def load_tokens(self, block_size: int) -> int:
        return self.prefill_tokens + self.decode_blocks * block_size


class WorkerSelector(ABC):
    """Picks the worker/rank a request is routed to."""

    Parameters: ClassVar[type[BaseModel]] = EmptyParameters
    # True for a selector that always routes to a live preferred worker/rank: the
    # router then skips the KV router's load prediction for such requests (one call
    # on every pinned turn's path) and asks for loads only when it must choose. A
    # selector that says False is asked with the loads; where the router cannot read
    # them, or they leave out the live preferred rank, it sends the turn there itself.
    takes_live_preferred: bool = False

    def __init__(self, parameters: BaseModel) -> None:
        self.parameters = parameters

    @abstractmethod
    def select(
        self, candidates: Sequence[WorkerLoad], preferred: WorkerKey | None, block_size: int
    ) -> WorkerKey:
        """Return one of ``candidates``; raise NoEligibleWorker if there are none."""


class ThunderAgentSelector(WorkerSelector):
    """The preferred worker/rank when eligible, else the least-loaded one.

    Load is the KV router's active prefill tokens plus decode blocks x block
    size; ties go to the lowest (worker_id, dp_rank) so that the same loads
    always give the same choice. With ``preferred_load_slack``, an eligible
    preferred worker/rank is left for the least-loaded one when its load is more
    than ``1 + slack`` times that one's (the loads are the KV router's predictions
    for this request, its uncached prefill on each candidate included).
    """

    Parameters: ClassVar[type[BaseModel]] = ThunderAgentSelectorParameters

    def __init__(self, parameters: BaseModel) -> None:
        super().__init__(parameters)
        self.slack = (parameters.preferred_load_slack
                      if isinstance(parameters, ThunderAgentSelectorParameters) else None)
        self.takes_live_preferred = self.slack is None

    def select(
        self, candidates: Sequence[WorkerLoad], preferred: WorkerKey | None, block_size: int
    ) -> WorkerKey:
        if not candidates:
            raise NoEligibleWorker("no live worker serves this model")
        best = min(candidates, key=lambda c: (c.load_tokens(block_size), c.worker))
        home = next((c for c in candidates if c.worker == preferred), None)
        if home is None:
            return best.worker
        if self.slack is not None and (home.load_tokens(block_size)
                                       > (1.0 + self.slack) * best.load_tokens(block_size)):
            return best.worker
        return home.worker
