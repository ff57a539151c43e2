"""Which streams the stall watch cuts: stalled on a worker discovery no longer lists."""

from __future__ import annotations

import asyncio

from dynamo_thunderagent.dynamo.stalls import STALL_SECONDS, StallWatch, Watched
from dynamo_thunderagent.dynamo.translate import StreamTracker

A, B = 11, 22


async def watched_on(worker: int | None, *, waiting: bool = True) -> Watched:
    watched = Watched(StreamTracker("r", 10), worker_id=worker)
    if waiting:
        watched.pending = asyncio.get_running_loop().create_future()
    return watched


async def watching_one(worker: int) -> tuple[StallWatch, Watched]:
    """A watch with one stream, waiting for its worker's next chunk."""
    watch, watched = StallWatch(), await watched_on(worker)
    watch.streams = {1: watched}
    return watch, watched


async def test_only_a_stream_on_a_worker_gone_and_silent_for_the_stall_time_is_cut() -> None:
    watch = StallWatch()
    gone, listed = await watched_on(A), await watched_on(B)
    unknown, busy = await watched_on(None), await watched_on(A, waiting=False)
    watch.streams = {1: gone, 2: listed, 3: unknown, 4: busy}
    assert watch.stalled({B}, now=0.0) == []  # A first seen gone
    assert watch.stalled({B}, now=STALL_SECONDS - 0.1) == []
    # The stream waiting for its worker's next chunk is cut; one not waiting for it now (it
    # is handing a chunk on) is not, nor one whose worker is listed or unknown.
    assert watch.stalled({B}, now=STALL_SECONDS) == [gone]


async def test_a_worker_that_left_while_it_still_streams_is_left_to_finish() -> None:
    watch, draining = await watching_one(A)
    assert watch.stalled(set(), now=0.0) == []
    for second in range(1, 20):  # a token a second: never silent for the stall time
        draining.tracker.generated_tokens += 1
        assert watch.stalled(set(), now=float(second)) == []
    assert watch.stalled(set(), now=19 + STALL_SECONDS) == [draining]


async def test_a_worker_listed_again_starts_the_clock_over() -> None:
    watch, watched = await watching_one(A)
    watch.stalled(set(), now=0.0)
    watch.stalled({A}, now=4.0)  # back in discovery's list
    assert watch.stalled(set(), now=6.0) == []  # gone again since 6.0 only
    assert watch.stalled(set(), now=6.0 + STALL_SECONDS) == [watched]


async def test_a_stream_already_cut_is_not_cut_twice() -> None:
    watch, watched = await watching_one(A)
    watch.stalled(set(), now=0.0)
    watched.cut = True
    assert watch.stalled(set(), now=60.0) == []


async def test_a_stream_its_client_stopped_is_cut_once_silent_whatever_its_worker() -> None:
    watch, stopped = await watching_one(A)
    stopped.client_stopped = True  # its worker is listed: only the client makes it a case
    assert watch.stalled({A}, now=0.0) == []
    assert watch.stalled({A}, now=STALL_SECONDS) == [stopped]
    streaming, _ = await watching_one(A)
    streaming.streams[1].client_stopped = True
    assert streaming.stalled({A}, now=0.0) == []
    streaming.streams[1].tracker.generated_tokens += 1  # a token came: the clock starts over
    assert streaming.stalled({A}, now=STALL_SECONDS) == []
    assert streaming.stalled({A}, now=2 * STALL_SECONDS) == [streaming.streams[1]]
