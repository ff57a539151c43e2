"""Streams stalled on a worker that has left: a hung worker's turns go on elsewhere.

A worker process that stops without dying (stopped by a signal, stuck in a driver call, on a
machine that froze) keeps its connections open: its streams neither fail nor end, so each
would wait for its client's timeout, and a client without one would wait for ever, holding
its session. Discovery drops such a worker once its registration lapses (about 10 s with
file or etcd discovery). The router's worker watch then asks :class:`StallWatch` which
streams are served by a worker discovery no longer lists and have streamed nothing for
``STALL_SECONDS`` since; the router cuts those (it cancels the pending read of the worker's
next chunk, nothing else), and its failover carries each turn on on a live worker. A worker
that leaves while it still streams tokens (a graceful drain) is left to finish those streams;
one of its streams with no token for that long (queued, or in a long prefill) is cut too.

The same silence ends a stream whose client Dynamo has stopped (``Watched.client_stopped``):
Dynamo cancels nothing of a handler waiting for a chunk, so a worker that sends nothing more
would hold that turn for ever; one still streaming is left to finish, as above. Such a cut
is the client's (``client_gone``), not the worker's: the turn ends, nothing fails over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from dynamo_thunderagent.dynamo.translate import StreamTracker

# How long a stream whose worker has left may stream nothing before it is cut.
STALL_SECONDS = 5.0


class WorkerLeft(ConnectionError):
    """The worker serving a stream left discovery, and the stream stalled there."""


@dataclass(eq=False)
class Watched:
    """One stream the router is forwarding, as the stall watch sees it."""

    tracker: StreamTracker
    worker_id: int | None = None  # the worker serving it, once known
    # The pending read of the worker's next chunk, set only while the router waits for it:
    # cancelling it cuts the stream and interrupts nothing else (once the chunk is in, it
    # cannot be cancelled).
    pending: asyncio.Future[Any] | None = None
    cut: bool = False  # its read cancelled by the watch
    client_stopped: bool = False  # Dynamo stopped the request: cut once it is silent
    client_gone: bool = False  # its read cancelled for its client (killed, or stopped and silent)
    gone_since: float | None = None  # its worker not listed since (or its last token since)
    tokens_seen: int = 0


class StallWatch:
    """The streams in flight, and which of them to cut (deterministic: ``now`` is passed)."""

    def __init__(self, stall_seconds: float = STALL_SECONDS) -> None:
        self.stall_seconds = stall_seconds
        self.streams: dict[int, Watched] = {}

    def stalled(self, listed: Collection[int], now: float) -> list[Watched]:
        """The streams to cut: served by a worker not in ``listed`` (discovery's workers) or
        stopped by their client, with no new token for ``stall_seconds`` since that was
        first seen, and waiting for the worker's next chunk now."""
        cut: list[Watched] = []
        for watched in self.streams.values():
            worker_left = watched.worker_id is not None and watched.worker_id not in listed
            if not (worker_left or watched.client_stopped):
                watched.gone_since = None
                continue
            tokens = watched.tracker.generated_tokens
            if watched.gone_since is None or tokens != watched.tokens_seen:
                watched.gone_since, watched.tokens_seen = now, tokens
            elif (now - watched.gone_since >= self.stall_seconds
                  and watched.pending is not None and not watched.cut):
                cut.append(watched)
        return cut
