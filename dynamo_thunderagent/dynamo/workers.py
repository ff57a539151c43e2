"""The router's view of its workers: who serves, what each rank can hold, whom to avoid.

The router reads this view every ``refresh_interval`` seconds (``ThunderAgentRouter.
refresh_workers``) and hands it to the classifier. It comes from three places:

* discovery's live instance ids, less the workers that just failed to take a request
  (put aside for ``UNREACHABLE_SECONDS``: discovery lists a killed worker until its lease
  runs out);
* the workers' model cards: each rank's KV capacity, one card at a time, so that a card
  that cannot be read costs only its own worker's capacity (``unreadable_cards``); and
  which workers only prefill (a disaggregated deployment's prefill workers answer a
  request with its first token alone): they are never a request's target, so the decode
  and aggregated workers serve every request, prefill included (``prefill_only_workers``);
* the router's own namespace, where a worker started by mistake is reached by the frontend
  directly, around the scheduler (warned about while it serves there).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.dynamo.block_size import card_block_sizes
from dynamo_thunderagent.dynamo.failover import address_in_error, worker_at
from dynamo_thunderagent.dynamo.router_card import CardSettings, stated
from dynamo_thunderagent.dynamo.stats import exposed_workers_due
from dynamo_thunderagent.dynamo.translate import capacity_cards, prefill_only_workers
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.selector import WorkerLoad

log = structlog.get_logger("dynamo_thunderagent.router")

# A worker that failed a request before its first chunk is treated as gone for this
# long. Discovery keeps a killed worker listed until its lease expires (about 10 s
# with file discovery); without this, sticky programs would keep failing on it and
# new programs could be placed on it because it looks idle.
UNREACHABLE_SECONDS = 15.0


class ClientLike(Protocol):
    def instance_ids(self) -> list[int]: ...


class CardSource(Protocol):
    def get_model_cards(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class WorkersRead:
    """One read of the workers: the live ids, the capacity card of each of their ranks
    that has a readable one, and whether either differs from the read before."""

    live: frozenset[int]
    cards: dict[WorkerKey, CapacityCard]
    changed: bool


class WorkerWatch:
    """Discovery's workers as the router should see them (see the module docstring)."""

    def __init__(self, client: ClientLike, cards: CardSource | None, *,
                 clock: Callable[[], float] = time.monotonic,
                 exposed: ClientLike | None = None,
                 exposed_endpoint: str | None = None) -> None:
        self.client = client
        self.cards = cards
        self.clock = clock
        self.live: frozenset[int] = frozenset()  # as of the last read
        self.unreachable: dict[int, float] = {}  # worker id -> until (clock time)
        # The KV block sizes the workers' model cards state, every card counted (serve
        # compares them with its KV router's, block_size.py).
        self.stated_block_sizes: set[int] = set()
        # What the cards state that the router's own card must say too (serve compares).
        self.stated_cards: list[CardSettings] = []
        # Live workers whose model card could not be read, with why: their capacity is
        # unknown (GET /state ``unreadable_cards``; logged when the set changes).
        self.unreadable_cards: dict[str, str] = {}
        # Workers whose card says they only prefill: left out of the live workers.
        self.prefill_only: frozenset[int] = frozenset()
        # Each live rank's capacity card, as of the last commit (the view /state shows).
        self.pools: dict[WorkerKey, CapacityCard] = {}
        # Workers serving under the workers' component/endpoint name in the router's own
        # namespace (``exposed_endpoint``): a frontend scoped to that namespace reaches them
        # directly, and their requests never see the program table.
        self.exposed = exposed
        self.exposed_endpoint = exposed_endpoint
        self.exposed_ids: frozenset[int] = frozenset()
        self._exposed_warned_at: float | None = None

    def listed(self) -> frozenset[int]:
        """The workers discovery lists now."""
        return frozenset(self.client.instance_ids())

    def live_ids(self) -> frozenset[int]:
        """Live workers by discovery, less those that just failed to take a request and
        those that only prefill (as of the last read of the cards)."""
        now = self.clock()
        for worker_id in [w for w, until in self.unreachable.items() if until <= now]:
            del self.unreachable[worker_id]
        return self.listed() - set(self.unreachable) - self.prefill_only

    def put_aside(self, worker_id: int) -> bool:
        """Avoid ``worker_id`` for UNREACHABLE_SECONDS, unless it is the only live worker
        (avoiding it would leave nobody to serve). True if it was not put aside already."""
        if not self.live_ids() - {worker_id}:
            return False
        new = worker_id not in self.unreachable
        self.unreachable[worker_id] = self.clock() + UNREACHABLE_SECONDS
        if new:
            log.warning("worker.unreachable", worker_id=worker_id, seconds=UNREACHABLE_SECONDS)
        return new

    def worker_at_address(self, lost: Exception) -> int | None:
        """The live worker whose request-plane address ``lost`` names (Dynamo 1.6.1's
        connection and deadline errors do), or None."""
        address = address_in_error(lost)
        if address is None:
            return None
        instances = getattr(self.client, "instances", None)  # Dynamo's Client has it
        if instances is None:
            return None
        with contextlib.suppress(Exception):
            return worker_at(address, ((i.instance_id, i.transport.address)
                                       for i in instances()))
        return None

    def read(self) -> WorkersRead:
        """Read liveness and the capacity cards (a card that cannot be read is left out,
        named in ``unreadable_cards`` and logged when that changes). The view changes only
        at :meth:`commit`, once the scheduler has been told."""
        # Each card parsed once for the readers below; one that is not JSON stays text, and
        # capacity_cards says why it cannot be read.
        model_cards = {worker_id: _parsed(raw) for worker_id, raw in
                       (self.cards.get_model_cards() if self.cards else {}).items()}
        self._note_prefill_only(prefill_only_workers(model_cards))
        live = self.live_ids()
        self.stated_block_sizes = card_block_sizes(model_cards)
        self.stated_cards = stated(model_cards)
        unreadable: dict[str, str] = {}
        cards = {key: card for key, card in capacity_cards(model_cards, unreadable).items()
                 if key.worker_id in live}
        # Cards of workers that have left say nothing about the workers that serve.
        unreadable = {w: why for w, why in unreadable.items() if _live_id(w, live)}
        if unreadable != self.unreadable_cards:
            for worker_id, why in sorted(unreadable.items()):
                if self.unreadable_cards.get(worker_id) != why:
                    log.warning("workers.card_unreadable", worker_id=worker_id, error=why,
                                effect="this worker's KV capacity is unknown until its "
                                       "card reads")
            self.unreadable_cards = unreadable
        changed = live != self.live or cards.keys() != self.pools.keys()
        return WorkersRead(live, cards, changed)

    def _note_prefill_only(self, found: frozenset[int]) -> None:
        """Follow the prefill-only workers, saying so when they change."""
        if found - self.prefill_only:
            log.warning("workers.prefill_only", instances=sorted(found),
                        effect="these workers only prefill (a disaggregated deployment): "
                               "the router sends them nothing, and the decode and aggregated "
                               "workers serve every request, prefill included")
        self.prefill_only = found

    def commit(self, read: WorkersRead) -> None:
        """``read`` is what the scheduler now knows: the view (``/state``) follows it."""
        if read.changed:
            log.info("workers.changed", live=sorted(read.live),
                     ranks={str(k): v.tokens for k, v in sorted(read.cards.items())})
        self.live, self.pools = read.live, dict(read.cards)

    def holding(self, candidates: list[WorkerLoad], tokens: int) -> list[WorkerLoad]:
        """The ``candidates`` whose engine takes a prompt of ``tokens`` (its whole pool
        holds it, within its context length; a rank without a known card is kept): in a
        fleet of unequal pools or context lengths, the least-loaded rank may be one whose
        engine refuses the prompt. All of them where none does (the engine says why)."""
        pools = self.pools
        fit = [c for c in candidates
               if (card := pools.get(c.worker)) is None or card.holds(tokens)]
        return fit or candidates

    def check_exposed(self) -> None:
        """Warn while workers serve where the frontend reaches them directly (at the first
        read, on every change, else at most once a minute)."""
        if self.exposed is None:
            return
        exposed = frozenset(self.exposed.instance_ids())
        now = self.clock()
        if exposed_workers_due(exposed, self.exposed_ids, self._exposed_warned_at, now):
            self._exposed_warned_at = now
            log.warning("workers.exposed", endpoint=self.exposed_endpoint,
                        instances=sorted(exposed),
                        hint="these workers serve in the router's namespace, so the frontend "
                             "routes requests to them directly, around the scheduler; start "
                             "them with --endpoint in the workers' namespace")
        self.exposed_ids = exposed

    def state(self) -> dict[str, Any]:
        """The workers' part of the router's GET /state."""
        return {
            "live_workers": sorted(self.live),
            "unreachable_workers": sorted(self.unreachable),
            "unreadable_cards": dict(self.unreadable_cards),
            "prefill_only_workers": sorted(self.prefill_only),
            "exposed_workers": sorted(self.exposed_ids),
            "exposed_endpoint": self.exposed_endpoint,
        }


def _parsed(raw: Any) -> Any:
    """A model card as the discovery store holds it (JSON text), parsed; text that is not
    JSON is returned as it is."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _live_id(worker_id: str, live: frozenset[int]) -> bool:
    """Whether a model card's key names a live worker (a key that is no number names none)."""
    try:
        return int(worker_id) in live
    except ValueError:
        return False
