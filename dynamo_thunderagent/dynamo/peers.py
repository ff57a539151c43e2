"""Other routers serving this router's endpoint: one program table per set of workers.

The scheduler's state lives in one process: the program table, what each worker/rank
holds, who waits for room. A second ``serve`` at the same endpoint (a Deployment scaled past
one replica, a router started twice by a script) registers beside the first, and the
frontend spreads requests over both: a session's turns land in either table, and each
router admits programs up to the workers' whole KV as if it were alone, so together they
fill it twice over. Nothing fails; the scheduling quietly stops meaning anything.

:class:`PeerWatch` turns the instance ids discovery lists at the router's own endpoint into
that finding. An instance counts once it has been listed for :data:`CONFIRM_SECONDS`, longer
than a dead process stays listed (file discovery's lease is 10 s; under etcd a router killed
here stayed listed for about 30 s), so that a router that has just died (a restart) is not
taken for another. ``serve`` reads the ids every :data:`CHECK_SECONDS`, logs
``router.other_instances`` when the set of confirmed others changes, and shows the watch in
``/state`` (``routers``); ``doctor`` reports it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("dynamo_thunderagent.peers")

CONFIRM_SECONDS = 45.0
CHECK_SECONDS = 5.0


def problem(endpoint: str, others: Iterable[int]) -> str:
    """What is wrong while other routers serve ``endpoint``, and what to do."""
    ids = ", ".join(str(i) for i in sorted(others))
    return (f"other routers serve {endpoint} too (instances {ids}): the frontend spreads "
            "requests over them, a session's turns land in either program table, and each "
            "router admits programs up to the workers' whole KV cache as if it were alone; "
            "run exactly one `dynamo-thunderagent serve` per set of workers, and give the "
            "router of another model an endpoint of its own (--router-endpoint)")


@dataclass
class PeerWatch:
    """The instances at ``endpoint`` other than this router's (``own``; None when unknown:
    then every instance counts while more than one is listed)."""

    endpoint: str
    own: int | None
    confirmed: frozenset[int] = frozenset()  # others listed for CONFIRM_SECONDS or more
    _since: dict[int, float] = field(default_factory=dict)  # others listed at the last look

    def observe(self, instance_ids: Iterable[int], now: float) -> bool:
        """One look at the instances discovery lists at the endpoint. True when the set of
        confirmed others changed (time to say so)."""
        ids = frozenset(instance_ids)
        # Without its own id, a router cannot tell itself apart: more than one is the news.
        others = (ids - {self.own} if self.own is not None
                  else ids if len(ids) > 1 else frozenset())
        self._since = {i: self._since.get(i, now) for i in others}
        confirmed = frozenset(i for i, since in self._since.items()
                              if now - since >= CONFIRM_SECONDS)
        changed = confirmed != self.confirmed
        self.confirmed = confirmed
        return changed

    @property
    def other_routers(self) -> int:
        """How many other routers are confirmed (without its own id, this router is among
        the confirmed instances: one fewer)."""
        if self.own is None and self.confirmed:
            return len(self.confirmed) - 1
        return len(self.confirmed)

    def state(self) -> dict[str, object]:
        """/state ``routers``: this router's instance, the others listed now, those listed
        for CONFIRM_SECONDS or more, how many other routers that makes, and the problem
        while there are any (null otherwise)."""
        return {"endpoint": self.endpoint, "instance_id": self.own,
                "other_instances": sorted(self._since),
                "confirmed_instances": sorted(self.confirmed),
                "other_routers": self.other_routers,
                "problem": problem(self.endpoint, self.confirmed) if self.confirmed else None}


async def watch_peers(client: Any, watch: PeerWatch, every: float = CHECK_SECONDS,
                      clock: Callable[[], float] | None = None) -> None:
    """Look at ``client.instance_ids()`` (a Dynamo client of the router's own endpoint)
    every ``every`` seconds; log when the confirmed other routers there change, and when
    the last has gone. A failed read is logged (once while it fails the same way) and the
    watch goes on."""
    now = clock or asyncio.get_running_loop().time
    failed: str | None = None  # the last read's error, logged once until it changes
    while True:
        try:
            changed = watch.observe(client.instance_ids(), now())
            if changed and watch.confirmed:
                log.warning("router.other_instances", endpoint=watch.endpoint,
                            instance_id=watch.own, others=sorted(watch.confirmed),
                            reason=problem(watch.endpoint, watch.confirmed))
            elif changed:
                log.info("router.other_instances_gone", endpoint=watch.endpoint,
                         instance_id=watch.own)
            failed = None
        except Exception as error:  # keep watching; say what failed
            if repr(error) != failed:
                failed = repr(error)
                log.warning("router.peer_check_failed", endpoint=watch.endpoint, error=failed)
        await asyncio.sleep(every)
