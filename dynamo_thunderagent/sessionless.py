"""Traffic no program owns: requests without a session id, and the room they hold.

A request without ``X-Dynamo-Session-ID`` is no program's turn: the scheduler does not admit,
pause or resume it, but while it runs its prompt sits in a rank's KV pool beside the
programs'. This ledger follows those requests and their prompt tokens per worker/rank, so
that ``sessionless_kv: reserve`` can take that room off the rank's capacity, and
``sessionless_kv_full_loss`` can scale it by how much that rank's engine is seen to evict
(a rank whose engine keeps every program's cache has room beyond its card).

Bounded: past ``limit`` requests, new ones are counted by the caller, not followed. Pure and
deterministic, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from dynamo_thunderagent.program import WorkerKey


class SessionlessTraffic:
    """Requests without a session id running now, and their prompt tokens per rank."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[WorkerKey, int]] = {}
        self._by_rank: dict[WorkerKey, int] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._running

    @property
    def tokens(self) -> Mapping[WorkerKey, int]:
        """Prompt tokens running now, per rank (ranks with none are absent)."""
        return self._by_rank

    def started(self, request_id: str, worker: WorkerKey, tokens: int, limit: int) -> bool:
        """Follow ``request_id``, running on ``worker`` with ``tokens`` prompt tokens. False,
        and nothing followed, for an empty prompt, an id already followed, or when ``limit``
        requests are followed already (the caller counts that)."""
        if tokens <= 0 or request_id in self._running or len(self._running) >= limit:
            return False
        self._running[request_id] = (worker, tokens)
        self._by_rank[worker] = self._by_rank.get(worker, 0) + tokens
        return True

    def ended(self, request_id: str) -> WorkerKey | None:
        """``request_id`` ended (any way): the rank it held room on (None: not followed)."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return None
        worker, tokens = entry
        left = self._by_rank[worker] - tokens
        if left > 0:
            self._by_rank[worker] = left
        else:
            del self._by_rank[worker]
        return worker

    def reserved(self, worker: WorkerKey, mode: Literal["ignore", "reserve"],
                 full_loss: float | None, loss_ratio: float | None) -> int:
        """The tokens to take off ``worker``'s capacity: none unless ``mode`` reserves; all
        it holds, or, with ``full_loss``, the share ``loss_ratio / full_loss`` (capped at
        all) of it, where ``loss_ratio`` is what the rank's engine lost of continuing turns'
        cache (None: not measured yet, so all)."""
        held = self._by_rank.get(worker, 0) if mode == "reserve" else 0
        if held and full_loss is not None and loss_ratio is not None:
            held = int(held * min(1.0, loss_ratio / full_loss))
        return held
