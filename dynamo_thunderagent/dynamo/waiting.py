"""Waiting while the client may go away (the router's request path).

Dynamo cancels a request's handler, or signals through its context, when the client
leaves. A request that waits for admission must then stop waiting, and an admission
granted in that same loop step must still be ended: nobody will forward it. A request
that waits for its worker's next chunk must stop waiting too (:func:`watch_the_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from dynamo_thunderagent.classifier import Admission
from dynamo_thunderagent.dynamo.stalls import Watched


async def until_stopped(awaitable: Awaitable[Admission], context: Any,
                        orphaned: Callable[[Admission], None]) -> Admission | None:
    """Await admission, but give up (cancelling it; None) if the client goes away.

    Whenever this gives up, an admission that was granted anyway (it completed in
    the same loop step) is handed to ``orphaned``, so that it is ended rather than
    left admitted with nobody to forward it.
    """
    stopped = None
    if context is not None:
        with contextlib.suppress(Exception):
            stopped = context.async_killed_or_stopped()
    admission = asyncio.ensure_future(awaitable)
    if stopped is None:
        try:
            return await asyncio.shield(admission)
        except asyncio.CancelledError:
            _give_up(admission, orphaned)
            raise
    stop_watch = asyncio.ensure_future(stopped)
    try:
        done, _ = await asyncio.wait({admission, stop_watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        stop_watch.cancel()
        _give_up(admission, orphaned)
        raise
    if admission in done:
        stop_watch.cancel()
        return admission.result()
    _give_up(admission, orphaned)
    # Let the cancelled admission finish its clean-up. asyncio.wait does not raise for
    # the admission's own outcome, while a cancellation of this handler still propagates.
    await asyncio.wait({admission})
    return None


def _give_up(admission: asyncio.Future[Admission], orphaned: Callable[[Admission], None]) -> None:
    """Cancel a pending admission; hand a granted one to ``orphaned``."""
    if not admission.done():
        admission.cancel()
    elif not admission.cancelled() and admission.exception() is None:
        orphaned(admission.result())


def watch_the_client(context: Any, watched: Watched) -> asyncio.Future[Any] | None:
    """Mark ``watched`` once Dynamo ends its request: killed (its client left), its read of
    the worker's next chunk is cut at once; only stopped (the frontend may stop a generation
    it has what it needs of), it is marked for the stall watch, which cuts it once its
    worker has been silent (stalls.py). Dynamo signals either through the context and
    cancels nothing of a handler that waits for a chunk. Returns the signal, the caller's to
    cancel when the request ends (None: the context has none)."""
    if context is None:
        return None
    try:
        signal: asyncio.Future[Any] = asyncio.ensure_future(context.async_killed_or_stopped())
    except Exception:
        return None

    def signalled(signal: asyncio.Future[Any]) -> None:
        if signal.cancelled() or signal.exception() is not None:
            return
        watched.client_stopped = True
        killed = False
        with contextlib.suppress(Exception):
            killed = bool(context.is_killed())
        if killed:
            watched.client_gone = True
            if watched.pending is not None:
                watched.pending.cancel()

    signal.add_done_callback(signalled)
    return signal
