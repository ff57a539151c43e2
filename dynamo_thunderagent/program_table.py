"""The program table: programs, tracked requests and per-rank usage.

Admission runs on every request, so usage per worker/rank is kept
incrementally instead of summed over all programs: every change to a field
that enters usage goes through :meth:`ProgramTable.changing`, which takes the
program out of the ledger and puts it back. The ledger holds integer token
sums (not float usage) so that it never drifts; the property tests compare it
with a recount after every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dynamo_thunderagent.capacity import UsageModel
from dynamo_thunderagent.program import (
    Lifecycle,
    Phase,
    PrefixBlocks,
    Program,
    TrackedRequest,
    WorkerKey,
)


@dataclass
class _RankLedger:
    reasoning_tokens: int = 0
    acting_tokens: int = 0
    programs: int = 0
    # Shared-prefix accounting: the tokens under each program's prefix hashes, per phase,
    # and how many programs hold each hash, by the tokens one hash covers. A hash held by
    # k programs was charged k times; the k - 1 duplicates are credited back (see
    # ProgramTable._shared_credit).
    reasoning_prefix_tokens: int = 0
    acting_prefix_tokens: int = 0
    prefix_counts: dict[int, Counter[int]] = field(default_factory=dict)
    # Tokens each charged program shares with another here (those sharing any), found
    # when first asked after a change on the rank (None: to be found).
    shared: dict[str, int] | None = None


class ProgramTable:
    def __init__(self, usage_model: UsageModel) -> None:
        self.usage_model = usage_model
        self.programs: dict[str, Program] = {}
        self.requests: dict[str, TrackedRequest] = {}
        self._ledger: dict[WorkerKey, _RankLedger] = {}
        self._members: dict[WorkerKey, dict[str, Program]] = {}
        self._paused: dict[str, Program] = {}
        self._seq = 0
        # usage(w) as a float, refreshed from the integer ledger on every change:
        # admission reads it for every rank, so it must be a dict lookup.
        self._usage: dict[WorkerKey, float] = {}

    def set_usage_model(self, usage_model: UsageModel) -> None:
        """Price every rank under ``usage_model`` from now on (a policy reload): the
        integer ledger is kept, only the usage derived from it is recomputed."""
        self.usage_model = usage_model
        for worker, ledger in self._ledger.items():
            self._refresh(worker, ledger)

    # ---- programs -------------------------------------------------------------
    def create(self, session_id: str, now: float) -> Program:
        self._seq += 1
        program = Program(session_id=session_id, seq=self._seq, last_active=now)
        self.programs[session_id] = program
        self._attach(program)
        return program

    def remove(self, program: Program) -> None:
        self._detach(program)
        del self.programs[program.session_id]

    @contextmanager
    def changing(self, program: Program) -> Iterator[Program]:
        """Mutate phase, lifecycle, worker or tokens of ``program`` inside this block."""
        # The rank it leaves is priced once, after the change: by _attach where the program
        # stays there, here where it moved, paused or lost its rank.
        left = self._detach(program, refresh=False)
        try:
            yield program
        finally:
            self._attach(program)
            stayed = program.lifecycle is Lifecycle.ACTIVE and program.worker == left
            if left is not None and not stayed and left in self._ledger:
                self._refresh(left, self._ledger[left])

    def _attach(self, program: Program) -> None:
        if program.lifecycle is Lifecycle.PAUSED:
            self._paused[program.session_id] = program
            return
        if program.worker is None:
            return
        ledger = self._ledger.setdefault(program.worker, _RankLedger())
        ledger.shared = None
        prefix = program.prefix
        prefix_tokens = prefix.tokens
        charged = _charged(program)
        if program.phase is Phase.REASONING:
            ledger.reasoning_tokens += program.tokens
            ledger.reasoning_prefix_tokens += prefix_tokens
        elif charged:
            ledger.acting_tokens += program.tokens
            ledger.acting_prefix_tokens += prefix_tokens
        ledger.programs += 1
        if charged:
            for size, hashes in prefix.groups():
                ledger.prefix_counts.setdefault(size, Counter()).update(hashes)
        self._members.setdefault(program.worker, {})[program.session_id] = program
        self._refresh(program.worker, ledger)

    def _detach(self, program: Program, *, refresh: bool = True) -> WorkerKey | None:
        """Take ``program`` out of its rank's ledger; the rank it left, while that rank
        still holds programs (priced again here unless ``refresh`` is False)."""
        if program.lifecycle is Lifecycle.PAUSED:
            del self._paused[program.session_id]
            return None
        if program.worker is None:
            return None
        ledger = self._ledger[program.worker]
        ledger.shared = None
        prefix = program.prefix
        prefix_tokens = prefix.tokens
        charged = _charged(program)
        if program.phase is Phase.REASONING:
            ledger.reasoning_tokens -= program.tokens
            ledger.reasoning_prefix_tokens -= prefix_tokens
        elif charged:
            ledger.acting_tokens -= program.tokens
            ledger.acting_prefix_tokens -= prefix_tokens
        ledger.programs -= 1
        if charged:
            for size, hashes in prefix.groups():
                counts = ledger.prefix_counts[size]
                counts.subtract(hashes)
                for block in hashes:
                    if counts[block] <= 0:
                        del counts[block]
                if not counts:
                    del ledger.prefix_counts[size]
        members = self._members[program.worker]
        del members[program.session_id]
        if not members:
            del self._members[program.worker]
            del self._ledger[program.worker]
            self._usage.pop(program.worker, None)
            return None
        if refresh:
            self._refresh(program.worker, ledger)
        return program.worker

    def _refresh(self, worker: WorkerKey, ledger: _RankLedger) -> None:
        model = self.usage_model
        self._usage[worker] = (
            ledger.reasoning_tokens
            + model.acting_token_weight * ledger.acting_tokens
            + model.buffer_per_program * ledger.programs
            # Charged at the ACTING weight or at 1: with an ACTING weight of 1, all at 1.
            - self._shared_credit(worker, ledger,
                                  None if model.acting_token_weight == 1.0 else model.weight)
        )

    def _shared_credit(self, worker: WorkerKey, ledger: _RankLedger,
                       weight: Callable[[Program], float] | None) -> float:
        """Tokens charged more than once for prefix blocks that several programs share.

        Each duplicate is credited at the average weight (``weight``: 1 while REASONING,
        the ACTING weight, or decayed; None: every charged program at 1) at which the
        programs sharing a prefix are charged for it, so a credit never exceeds what was
        charged for the copies, and a program's own, unshared prompt does not move it.
        """
        total = ledger.reasoning_prefix_tokens + ledger.acting_prefix_tokens
        distinct = sum(size * len(counts) for size, counts in ledger.prefix_counts.items())
        duplicates = total - distinct
        if duplicates <= 0:
            return 0.0
        if weight is None:
            return float(duplicates)
        members = self._members[worker]
        if ledger.shared is None:
            ledger.shared = {}
            for session, program in members.items():
                if _charged(program):
                    tokens = _shared_tokens(ledger, program.prefix)
                    if tokens:
                        ledger.shared[session] = tokens
        shared = sum(ledger.shared.values())
        weighted = sum(weight(members[session]) * tokens
                       for session, tokens in ledger.shared.items())
        return duplicates * weighted / shared if shared else 0.0

    # ---- queries --------------------------------------------------------------
    def usage(self, worker: WorkerKey) -> float:
        """Usage of ``worker`` in tokens (the pressure side; no decay)."""
        return self._usage.get(worker, 0.0)

    @property
    def usage_by_rank(self) -> dict[WorkerKey, float]:
        """Usage of every rank that has any (read-only view)."""
        return self._usage

    def reasoning_tokens(self, worker: WorkerKey) -> int:
        """Prompt tokens of the turns on ``worker`` right now (its compute load)."""
        ledger = self._ledger.get(worker)
        return 0 if ledger is None else ledger.reasoning_tokens

    def decayed_usage(self, worker: WorkerKey, now: float) -> float:
        """Usage of ``worker`` with ACTING programs decayed by their idle time."""
        ledger = self._ledger.get(worker)
        if ledger is None:
            return 0.0
        model = self.usage_model
        usage = 0.0
        weights: dict[str, float] = {}
        for session, program in self._members[worker].items():
            weights[session] = weight = model.weight(program, now)
            usage += weight * program.tokens + model.buffer_per_program
        return usage - self._shared_credit(worker, ledger,
                                           lambda program: weights[program.session_id])

    def shared_prefix_tokens(self, program: Program) -> int:
        """Leading tokens of ``program``'s last prompt that another program on its rank
        holds too (a shared system prompt; 0 without prefix hashes or a rank)."""
        ledger = None if program.worker is None else self._ledger.get(program.worker)
        if ledger is None or not program.prefix.hashes:
            return 0
        return _shared_tokens(ledger, program.prefix)

    def member_count(self, worker: WorkerKey) -> int:
        """ACTIVE programs assigned to ``worker`` (no sort: for hot paths)."""
        return len(self._members.get(worker, ()))

    @property
    def ranks_in_use(self) -> int:
        """Workers/ranks with at least one ACTIVE program assigned."""
        return len(self._members)

    def members(self, worker: WorkerKey) -> list[Program]:
        """ACTIVE programs assigned to ``worker``, in creation order."""
        return sorted(self._members.get(worker, {}).values(), key=lambda p: p.seq)

    def assigned_workers(self) -> list[WorkerKey]:
        return sorted(self._members)

    def paused(self) -> list[Program]:
        return list(self._paused.values())

    @property
    def any_paused(self) -> bool:
        return bool(self._paused)


def _shared_tokens(ledger: _RankLedger, prefix: PrefixBlocks) -> int:
    """Tokens under the leading hashes of ``prefix`` that another program on the rank
    holds too. The hashes are chained (each covers the whole prefix up to its end), so
    those are a leading run: a binary search."""
    hashes = prefix.hashes
    low, high = 0, len(hashes)
    while low < high:
        middle = (low + high) // 2
        counts = ledger.prefix_counts.get(prefix.span_of(middle))
        if counts is not None and counts.get(hashes[middle], 0) >= 2:
            low = middle + 1
        else:
            high = middle
    return prefix.tokens_of(low)


def _charged(program: Program) -> bool:
    """Whether the program's tokens and prefix blocks count in its rank's ledger: not
    while it is ACTING after yielding its room (``acting_yield_factor``)."""
    return program.phase is Phase.REASONING or not program.yielded
