"""Waiting for admission while the client may go away (the router's request path).

Dynamo cancels a request's handler, or signals through its context, when the client
leaves. A request that waits for admission must then stop waiting, and an admission
granted in that same loop step must still be ended: nobody will forward it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from dynamo_thunderagent.classifier import Admission


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
