"""Waiting while the client may go away (the router's request path).

Dynamo cancels a request's handler, or signals through its context, when the client
leaves. A request that waits for admission must then stop waiting, and an admission
granted in that same loop step must still be ended: nobody will forward it. A request
that waits for its worker's next chunk must stop waiting too (:class:`ClientWatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from dynamo_thunderagent.classifier import Admission
from dynamo_thunderagent.dynamo.stalls import Watched

# A request stopped rather than killed (the frontend may stop a generation it has what it
# needs of) has its read cut only once its worker has sent nothing for this long.
STOP_GRACE_SECONDS = 5.0


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


class ClientWatch:
    """Cuts a forwarded request's read of its worker's next chunk once Dynamo ends the
    request: at once when it is killed (its client left); when it is only stopped, once
    the worker has sent nothing for ``grace`` seconds (a worker still streaming finishes
    the turn as before). Dynamo signals either through the context and cancels nothing of
    a handler that waits for a chunk: a worker that sends nothing more would otherwise keep
    the turn in flight, its room booked and its session's next turns behind it, for ever.
    ``watched.client_gone`` tells the handler why its read was cancelled."""

    def __init__(self, context: Any, watched: Watched, signal: asyncio.Future[Any],
                 grace: float) -> None:
        self.context = context
        self.watched = watched
        self.signal = signal
        self.grace = grace
        self.timer: asyncio.TimerHandle | None = None
        self.tokens_seen = 0
        signal.add_done_callback(self._signalled)

    @classmethod
    def start(cls, context: Any, watched: Watched,
              grace: float | None = None) -> ClientWatch | None:
        """Watch ``context`` for ``watched``'s request (None: the context has no signal);
        ``grace``: seconds a stopped request's read may wait (default STOP_GRACE_SECONDS)."""
        if context is None:
            return None
        try:
            signal = asyncio.ensure_future(context.async_killed_or_stopped())
        except Exception:
            return None
        return cls(context, watched, signal, STOP_GRACE_SECONDS if grace is None else grace)

    def stop(self) -> None:
        """The request has ended: watch no more."""
        self.signal.cancel()
        if self.timer is not None:
            self.timer.cancel()

    def _signalled(self, signal: asyncio.Future[Any]) -> None:
        if signal.cancelled() or signal.exception() is not None:
            return
        killed = False
        with contextlib.suppress(Exception):
            killed = bool(self.context.is_killed())
        if killed:
            self._cut()
        else:
            self._wait_for_silence()

    def _wait_for_silence(self) -> None:
        self.tokens_seen = self.watched.tracker.generated_tokens
        self.timer = asyncio.get_running_loop().call_later(self.grace, self._silent_or_not)

    def _silent_or_not(self) -> None:
        if self.watched.tracker.generated_tokens != self.tokens_seen:
            self._wait_for_silence()  # still streaming: it will end on its own
        else:
            self._cut()

    def _cut(self) -> None:
        self.watched.client_gone = True
        if self.watched.pending is not None:
            self.watched.pending.cancel()
