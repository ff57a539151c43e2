"""Capacity and usage of each worker/rank's KV pool, in tokens.

Capacity comes from the worker's published model card: total KV blocks x
block size. It is used only while the worker is live: a card whose worker has
left is stale (its blocks may belong to a new process with another id).

Usage of a worker/rank counts its ACTIVE programs only (a paused program's KV
may still be resident, but the scheduler is free to let it be evicted)::

    usage = sum(REASONING tokens) + acting_token_weight * sum(ACTING tokens)
            + buffer_per_program * programs - shared-prefix credit

The decayed variant weights each ACTING program by 2^(-idle / tau): a program
whose tool has run for long is less likely to need its cache soon.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from dynamo_thunderagent.program import Phase, Program, WorkerKey


@dataclass(frozen=True)
class CapacityCard:
    """What a worker/rank publishes about its KV pool."""

    total_kv_blocks: int
    block_size: int
    # The longest prompt its engine takes (``--max-model-len``; 0: none stated).
    context_length: int = 0

    def __post_init__(self) -> None:
        if self.context_length < 0:
            raise ValueError(f"capacity card needs context_length >= 0, got "
                             f"{self.context_length}")
        if self.total_kv_blocks < 0 or self.block_size <= 0:
            raise ValueError(
                f"capacity card needs total_kv_blocks >= 0 and block_size > 0, got "
                f"{self.total_kv_blocks} x {self.block_size}"
            )

    @property
    def tokens(self) -> int:
        return self.total_kv_blocks * self.block_size

    def holds(self, tokens: int) -> bool:
        """Whether its engine can take a prompt of ``tokens`` at all: the whole pool holds
        it (a pool of 0 says nothing) and it is within the stated context length."""
        return ((self.tokens <= 0 or tokens <= self.tokens)
                and (not self.context_length or tokens <= self.context_length))


class Capacity:
    """Which workers are live and how many KV tokens each live rank holds."""

    def __init__(self) -> None:
        self._live: frozenset[int] = frozenset()
        self._cards: dict[WorkerKey, CapacityCard] = {}
        self._known: dict[WorkerKey, int] = {}
        self._largest = 0
        self._total = 0
        self._every_rank_holds = 0
        self._block_sizes: dict[WorkerKey, int] = {}
        self._reserved: dict[WorkerKey, int] = {}
        # The live workers whose cards list their ranks, and those ranks: a rank a live
        # worker's card no longer lists is gone (its data-parallel size shrank).
        self._ranked_ids: frozenset[int] = frozenset()
        self._ranks: frozenset[WorkerKey] = frozenset()

    def update(
        self, live_worker_ids: Iterable[int], cards: Mapping[WorkerKey, CapacityCard]
    ) -> None:
        """Replace the view: the runtime's live instances and the cards seen so far."""
        self._live = frozenset(live_worker_ids)
        self._cards = dict(cards)
        self._ranks = frozenset(key for key in self._cards if key.worker_id in self._live)
        self._ranked_ids = frozenset(key.worker_id for key in self._ranks)
        full = {
            key: card.tokens
            for key, card in sorted(self._cards.items())
            if key.worker_id in self._live and card.tokens > 0
        }
        # Read on every admission (the oversize check): kept, not recomputed. Whole
        # capacities: traffic that comes and goes must not make a prompt too large.
        self._largest = max(full.values(), default=0)
        self._total = sum(full.values())
        # The longest prompt every rank in ``known`` takes (fleets of unequal pools or
        # context lengths: up to it, :meth:`taking` checks no rank).
        self._every_rank_holds = min(
            (min(tokens, self._cards[key].context_length or tokens)
             for key, tokens in full.items()), default=0)
        self._block_sizes = {key: self._cards[key].block_size for key in full}
        self._known = {key: self._left(key, tokens) for key, tokens in full.items()}

    def reserve(self, worker: WorkerKey, tokens: int) -> None:
        """Set the tokens of ``worker`` that traffic no program owns holds now
        (``sessionless_kv: reserve``): ``known`` is its card's capacity less these, at
        most half of it (the rank stays known, its programs keep room). ``largest`` and
        ``total`` keep whole capacities; ``largest_room`` follows ``known``."""
        if tokens > 0:
            self._reserved[worker] = tokens
        else:
            self._reserved.pop(worker, None)
        if worker in self._known:
            self._known[worker] = self._left(worker, self._cards[worker].tokens)

    def reserved(self, worker: WorkerKey) -> int:
        """Tokens of ``worker`` reserved for traffic no program owns (0: none)."""
        return self._reserved.get(worker, 0)

    def taken_off(self, worker: WorkerKey) -> int:
        """Tokens of ``worker``'s capacity taken off for traffic no program owns now: its
        reservation, at most half of its card (0 for a rank not in ``known``)."""
        if worker not in self._known:
            return 0
        return self._cards[worker].tokens - self._known[worker]

    def _left(self, worker: WorkerKey, tokens: int) -> int:
        # At most half a rank is taken off: reservations count each request's whole
        # prompt, so requests that share a cached prefix are over-counted, and programs
        # must keep room to run at all.
        return tokens - min(self._reserved.get(worker, 0), tokens // 2)

    def is_live(self, worker: WorkerKey) -> bool:
        """The worker is live and, where its card lists ranks, lists this one (a worker
        without a card, or with one that cannot be read, is taken at its word)."""
        return worker.worker_id in self._live and (
            worker.worker_id not in self._ranked_ids or worker in self._ranks)

    def holds(self, worker: WorkerKey, tokens: int) -> bool:
        """Whether ``worker``'s engine can take a prompt of ``tokens`` at all: its whole
        pool (its card, whatever traffic reserves) holds it and it is within the context
        length the card states; True for a rank without a usable card (taken at its
        word). In a fleet of unequal pools or context lengths a program can outgrow its
        rank: its engine refuses it."""
        card = self._cards.get(worker)
        return card is None or card.holds(tokens)

    def taking(self, tokens: int) -> Collection[WorkerKey]:
        """The ranks in ``known`` whose engine takes a prompt of ``tokens`` (:meth:`holds`);
        all of them where none does (every engine would refuse it alike: none is to be
        preferred). Every rank, unchecked, up to the longest prompt all of them take."""
        if tokens <= self._every_rank_holds:
            return self._known.keys()
        return frozenset(rank for rank in self._known
                         if self.holds(rank, tokens)) or self._known.keys()

    def outgrown(self, worker: WorkerKey, tokens: int) -> bool:
        """Whether a prompt of ``tokens`` cannot run on ``worker``, a rank in ``known``,
        but can on another (:meth:`taking`): a program there must move. (Where no rank
        takes it, it stays: every engine would refuse it alike.)"""
        return worker in self._known and worker not in self.taking(tokens)

    @property
    def any_live(self) -> bool:
        return bool(self._live)

    @property
    def live_worker_ids(self) -> frozenset[int]:
        return self._live

    @property
    def known(self) -> Mapping[WorkerKey, int]:
        """Capacity in tokens of each live rank with a usable card, sorted by key, less
        what is reserved for traffic no program owns (:meth:`reserve`)."""
        return self._known

    @property
    def largest(self) -> int:
        """The largest whole capacity in tokens among the ranks in ``known`` (0: none
        known): whether a prompt could ever run, whatever traffic comes and goes."""
        return self._largest

    @property
    def largest_room(self) -> int:
        """The largest of ``known`` (reservations taken off): a whole rank's room for
        programs now, what a program larger than any rank's threshold waits for."""
        if not self._reserved:
            return self._largest
        return max(self._known.values(), default=0)

    @property
    def total(self) -> int:
        """Whole capacity in tokens of every rank in ``known``."""
        return self._total

    def block_size(self, worker: WorkerKey) -> int:
        """Tokens per KV block of ``worker`` (0: no usable card)."""
        return self._block_sizes.get(worker, 0)

    def tier_tokens(self, blocks_per_rank: int) -> int:
        """Tokens a tier of ``blocks_per_rank`` blocks behind every rank in ``known`` holds
        (each rank's blocks are its card's block size)."""
        return blocks_per_rank * sum(self._block_sizes.values())


@dataclass
class UsageModel:
    """How much of a worker/rank's capacity one program occupies.

    ``hold_seconds`` (``acting_hold_factor``) is the only field that changes while the
    scheduler runs: it follows the measured prefill cost, set once per tick.
    """

    acting_token_weight: float
    acting_decay_tau_seconds: float
    buffer_per_program: int
    hold_seconds: float = 0.0

    def weight(self, program: Program, now: float | None = None) -> float:
        """Weight of the program's tokens: 1 while REASONING, the ACTING weight while a
        tool runs, decayed by its idle time when ``now`` is given. A program expected back
        within the hold (twice its smoothed gap) and never away longer than the hold (its
        longest gap) decays only once the hold is over; one that yielded its room at its
        tool boundary weighs nothing."""
        if program.phase is Phase.REASONING:
            return 1.0
        if program.yielded:
            return 0.0
        if now is None or program.acting_since is None:
            return self.acting_token_weight
        idle = max(0.0, now - program.acting_since)
        hold = self.hold_seconds
        if hold > 0.0 and program.expected_back_within(hold) and program.max_gap <= hold:
            idle = max(0.0, idle - hold)
        return self.acting_token_weight * float(2.0 ** (-idle / self.acting_decay_tau_seconds))

    def charge(self, program: Program) -> float:
        """Capacity an ACTIVE program occupies now (the pressure side)."""
        return self.weight(program) * program.tokens + self.buffer_per_program

    def decayed_charge(self, program: Program, now: float) -> float:
        """Capacity charged when deciding whether room exists (the resume side)."""
        return self.weight(program, now) * program.tokens + self.buffer_per_program
