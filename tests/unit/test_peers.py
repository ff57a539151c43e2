"""Other routers at the router's own endpoint are found and said (``dynamo/peers.py``)."""

from __future__ import annotations

import asyncio
import contextlib

from structlog.testing import capture_logs

from dynamo_thunderagent.dynamo.peers import CONFIRM_SECONDS, PeerWatch, watch_peers

OWN, OTHER, THIRD = 7, 8, 9


def test_its_own_instance_is_not_another_router() -> None:
    watch = PeerWatch("ta.router.generate", OWN)
    assert not watch.observe([OWN], 0.0)
    assert not watch.observe([OWN], 100.0)
    assert watch.state() == {"endpoint": "ta.router.generate", "instance_id": OWN,
                             "other_instances": [], "confirmed_instances": [],
                             "other_routers": 0, "problem": None}


def test_another_router_counts_once_it_has_been_listed_longer_than_a_lease() -> None:
    # A router that has just died stays listed (10 s under file discovery, about 30 s under
    # etcd): that is a restart, not a second router.
    watch = PeerWatch("ta.router.generate", OWN)
    assert not watch.observe([OWN, OTHER], 0.0)
    state = watch.state()
    assert state["other_instances"] == [OTHER] and state["problem"] is None
    assert not watch.observe([OWN, OTHER], CONFIRM_SECONDS - 1)
    assert watch.observe([OWN, OTHER], CONFIRM_SECONDS)
    state = watch.state()
    assert state["confirmed_instances"] == [OTHER] and state["other_routers"] == 1
    problem = state["problem"]
    assert isinstance(problem, str)
    assert f"instances {OTHER}" in problem and "run exactly one" in problem
    assert not watch.observe([OWN, OTHER], CONFIRM_SECONDS + 5)  # said once


def test_a_router_that_leaves_within_the_lease_is_never_reported() -> None:
    watch = PeerWatch("ta.router.generate", OWN)
    watch.observe([OWN, OTHER], 0.0)
    watch.observe([OWN], 5.0)  # gone (restarted): forgotten
    watch.observe([OWN, OTHER], 6.0)  # listed again: its time starts over
    assert not watch.observe([OWN, OTHER], 6.0 + CONFIRM_SECONDS - 1)
    assert watch.state()["problem"] is None


def test_the_finding_follows_the_others_and_clears_when_they_go() -> None:
    watch = PeerWatch("ta.router.generate", OWN)
    watch.observe([OWN, OTHER], 0.0)
    assert watch.observe([OWN, OTHER, THIRD], CONFIRM_SECONDS)  # OTHER confirmed
    assert watch.observe([OWN, OTHER, THIRD], 2 * CONFIRM_SECONDS)  # THIRD too
    assert watch.confirmed == {OTHER, THIRD}
    assert watch.observe([OWN], 2 * CONFIRM_SECONDS + 5)  # both gone: a change to say
    assert watch.confirmed == frozenset() and watch.state()["problem"] is None


def test_without_its_own_id_more_than_one_instance_is_the_finding() -> None:
    watch = PeerWatch("ta.router.generate", None)
    assert not watch.observe([OWN], 0.0)
    assert not watch.observe([OWN], CONFIRM_SECONDS)
    watch.observe([OWN, OTHER], CONFIRM_SECONDS)
    assert watch.observe([OWN, OTHER], 2 * CONFIRM_SECONDS)
    assert watch.confirmed == {OWN, OTHER}
    assert watch.other_routers == 1  # one of the two is this router


async def test_the_watch_logs_a_second_router_and_its_going_and_survives_bad_reads() -> None:
    listings: list[list[int] | Exception] = [
        [OWN, OTHER], [OWN, OTHER], RuntimeError("store gone"), RuntimeError("store gone"),
        [OWN]]
    seen: list[object] = []

    class Client:
        def instance_ids(self) -> list[int]:
            listing = listings[min(len(seen), len(listings) - 1)]
            seen.append(listing)
            if isinstance(listing, Exception):
                raise listing
            return listing

    ticks = iter(range(0, 10_000, int(CONFIRM_SECONDS)))
    watch = PeerWatch("ta.router.generate", OWN)
    async def all_read() -> None:
        while len(seen) < len(listings) + 1:
            await asyncio.sleep(0.001)

    with capture_logs() as logs:
        task = asyncio.create_task(
            watch_peers(Client(), watch, every=0.001, clock=lambda: float(next(ticks))))
        try:
            await asyncio.wait_for(all_read(), 5.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    events = [entry["event"] for entry in logs]
    assert events == ["router.other_instances", "router.peer_check_failed",
                      "router.other_instances_gone"], logs
    assert logs[0]["others"] == [OTHER]


class _Router:
    """What serve's watch touches of the router: its /state parts."""

    def __init__(self) -> None:
        self.state_extensions: dict[str, object] = {}


class _Runtime:
    """A Dynamo runtime whose every endpoint is ``endpoint``."""

    def __init__(self, endpoint: object) -> None:
        self._endpoint = endpoint

    def endpoint(self, path: str) -> object:
        return self._endpoint


async def test_serve_serves_on_without_the_watch_when_its_endpoint_has_no_client() -> None:
    from dynamo_thunderagent.dynamo.serve import _watch_peers

    class Endpoint:
        async def client(self) -> object:
            raise RuntimeError("no discovery")

    router = _Router()
    with capture_logs() as logs:
        await asyncio.wait_for(_watch_peers(_Runtime(Endpoint()), OWN,
                                            "ta.router.generate", router), 1.0)
    state = router.state_extensions["routers"]
    assert callable(state)
    assert state() == {"endpoint": "ta.router.generate",
                       "unwatched": "RuntimeError('no discovery')"}
    assert [entry["event"] for entry in logs] == ["router.peer_check_failed"]


async def test_without_its_own_instance_id_serve_still_watches_by_counting() -> None:
    from dynamo_thunderagent.dynamo.serve import _instance_id, _watch_peers

    class Client:
        def instance_ids(self) -> list[int]:
            return [OWN]

    class Endpoint:
        def connection_id(self) -> int:
            raise AttributeError("no connection_id in this binding")

        async def client(self) -> Client:
            return Client()

    router = _Router()
    with capture_logs() as logs:
        own = _instance_id(Endpoint())
        task = asyncio.create_task(_watch_peers(_Runtime(Endpoint()), own,
                                                "ta.router.generate", router))
        try:
            await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    state = router.state_extensions["routers"]
    assert callable(state)
    assert state()["instance_id"] is None and state()["other_instances"] == []
    assert [entry["event"] for entry in logs] == ["router.instance_id_unreadable"]
