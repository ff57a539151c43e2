"""The resume planner: which paused programs come back, and where programs run.

:meth:`ResumePlanner.plan` returns the programs to resume, each with its worker/rank,
in the order the scheduler applies them; :meth:`ResumePlanner.place` picks the rank
for a program that starts without a live worker. Both read the table and change
nothing. Parity, with the extensions that change one ingredient each:

* **Order**: a waiting turn of a known program, then programs that never ran (nothing
  cached yet), then paused tool-callers; smallest first. ``max_wait_seconds`` (aging)
  puts a turn deferred that long first and reserves the room left for it: while it does
  not fit, nothing behind it is chosen.
* **Choice**: programs are taken in that order while their need (tokens plus
  ``buffer_per_program``, capped at a whole rank's resume level) fits the total room
  below the resume level (``pause_threshold - resume_hysteresis``, on decayed usage).
  A program whose pause would not pay (the cost model) is resumed regardless: holding
  it back saves nothing. Neither does holding back a waiting turn at home on a rank
  whose engine evicts anyway (``hold_max_cache_loss``) or keeps paused programs anyway
  (``pause_min_resume_loss``; the scheduler names those ranks):
  once it has waited as long as the stall its re-prefill causes, it runs there ahead of
  everything else, its room booked; while every rank evicts anyway, so does a waiting
  turn with no live home.
* **Placement by room**: the chosen set is packed largest first onto the rank with the
  most room, so a program may move. ``resume_affinity`` (placement by residency) sends a
  program back to its last rank when that rank has room: its blocks may be resident.
* **Placement of a new turn** (:meth:`place`): the least-used rank with room under the
  threshold (parity), or with ``placement: least_busy`` the one serving the fewest
  prompt tokens right now.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dynamo_thunderagent.capacity import Capacity
from dynamo_thunderagent.costs import CostModel
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import Phase, Program, WorkerKey
from dynamo_thunderagent.program_table import ProgramTable

# Resume order classes: a turn is waiting on a known program, then programs that never
# ran (nothing cached yet), then paused tool-callers.
_WAITING_TURN, _NEW, _ACTING = 0, 1, 2


@dataclass(frozen=True)
class Resumption:
    program: Program
    worker: WorkerKey | None  # None: capacity unknown, any eligible worker
    price_seconds: float = 0.0  # the re-prefill a priced move pays (0: not a priced move)
    # hold_max_cache_loss / pause_min_resume_loss: released without room, holding it back
    # kept no cache on its rank.
    released_evicting: bool = False


@dataclass
class ResumePlan:
    """Programs to resume (in order), and those held for room at their own rank."""

    resumptions: list[Resumption]
    held_home: list[Program]


class ResumePlanner:
    def __init__(self, params: ThunderAgentParameters, costs: CostModel) -> None:
        self.threshold = params.pause_threshold
        self.level = params.pause_threshold - params.resume_hysteresis
        self.buffer = params.buffer_per_program
        self.affinity = params.resume_affinity or params.price_moves
        self.price_moves = params.price_moves
        self.max_wait = params.max_wait_seconds
        self.make_room = params.aging_makes_room
        self.least_busy = params.placement == "least_busy"
        self.costs = costs

    # ---- resuming -----------------------------------------------------------------
    def plan(self, paused: list[Program], table: ProgramTable, capacity: Capacity,
             now: float, batch: float,
             evicting: frozenset[WorkerKey] = frozenset()) -> ResumePlan:
        """The resumptions, in order, for these paused programs (see the module docstring);
        ``batch``: turns running per worker/rank (for the cost model); ``evicting``: ranks
        whose engine evicts whatever is held back (``hold_max_cache_loss``) or keeps it
        anyway (``pause_min_resume_loss``): a waiting turn
        of a program at home there runs without room once it has waited as long as the
        stall its re-prefill causes (:meth:`_release_evicting`)."""
        known = capacity.known
        order = sorted(paused, key=lambda p: self.order(p, now))
        plan = ResumePlan([], [])
        if not known:
            if capacity.any_live:
                # Capacity unknown: behave as at cold start (anywhere, nothing held back).
                plan.resumptions.extend(Resumption(p, None) for p in order
                                        if p.current is not None)
            return plan
        level = self.level
        room = {w: cap * level - table.decayed_usage(w, now) for w, cap in known.items()}
        # A program larger than any rank's resume level (it still fits the capacity, or
        # admission would have refused it) needs a whole empty rank, not more than that:
        # without the cap it would wait for resume_timeout and hold every new program back.
        largest = capacity.largest_room * level
        if evicting:
            order = self._release_evicting(order, capacity, evicting, room, largest, plan,
                                           now, batch)
        free = sum(max(0.0, r) for r in room.values())
        chosen = []
        for program in order:
            need = self._need(program, largest)
            if not self.costs.pause_pays(program.tokens, batch):
                chosen.append(program)  # holding it back saves nothing: resume it anyway
                free -= need
            elif need <= free and (not self.make_room or not self.aged(program, now)
                                   or max(room.values()) >= need):
                chosen.append(program)
                free -= need
            elif self.aged(program, now):
                # Reserve the room that is left for the longest waiter: its turn runs on
                # one rank, so room split between ranks is not room for it.
                break
        # Most room first; ties to the lower worker/rank. A heap keeps each placement
        # O(log ranks) at fleet scale; entries whose room changed are stale and skipped.
        heap = [(-r, w) for w, r in room.items()]
        heapq.heapify(heap)
        # The longest waiters are placed first, so that a larger program chosen behind
        # them cannot take the one rank's room they were chosen for.
        for program in sorted(chosen, key=lambda p: (
                not (self.make_room and self.aged(p, now)), -p.tokens, p.seq)):
            need = self._need(program, largest)
            home = _home(program, capacity)
            pays = self.costs.pause_pays(program.tokens, batch)
            price = 0.0
            if self.affinity and home is not None and room[home] >= need:
                worker = home
            elif self.price_moves and home is not None and not pays:
                worker = home  # held back for nothing: it runs where its cache is
            else:
                while -heap[0][0] != room[heap[0][1]]:
                    heapq.heappop(heap)
                worker = heap[0][1]
                taking = capacity.taking(program.tokens)
                if worker not in taking:  # unequal engines: rare
                    worker = max(taking, key=lambda w: (room[w], _neg(w)))
                if room[worker] < need and pays:
                    continue
                if self.price_moves and home is not None and worker != home:
                    # The move's price is the stall its re-prefill causes (the cost
                    # model's yardstick), weighed against this program's own wait.
                    move_price = self.costs.stall_seconds(program.tokens, batch)
                    waited = (now - program.deferred_since
                              if program.deferred_since is not None else 0.0)
                    if move_price is not None and waited < move_price:
                        plan.held_home.append(program)  # not yet worth a re-prefill
                        continue
                    price = move_price or 0.0
            room[worker] -= need
            heapq.heappush(heap, (-room[worker], worker))
            plan.resumptions.append(Resumption(program, worker, price))
        return plan

    def _release_evicting(self, order: list[Program], capacity: Capacity,
                          evicting: frozenset[WorkerKey], room: dict[WorkerKey, float],
                          largest: float, plan: ResumePlan, now: float,
                          batch: float) -> list[Program]:
        """``hold_max_cache_loss`` and ``pause_min_resume_loss``: release the waiting turns
        whose wait protects no cache,
        first and without room: those at home on a rank evicting anyway and, while every
        rank is, those with no live home too (on the rank with the most room left, this
        pass's releases counted). A turn goes once it has waited as long as the stall its
        re-prefill causes there (the cost model's price of a move; at once until the costs
        are measured): a release adds to the overfill, and where re-prefill is dear the
        pause rule gets that long to drain the rank first. Their room is booked; the rest
        of ``order`` is returned."""
        everywhere = capacity.known.keys() <= evicting
        rest = []
        for program in order:
            worker: WorkerKey | None
            if program.current is None or program.deferred_since is None:
                worker = None
            elif now - program.deferred_since < (
                    self.costs.stall_seconds(program.tokens, batch) or 0.0):
                worker = None  # not yet worth the re-prefill it causes
            elif program.worker in evicting and _home(program, capacity) is not None:
                worker = program.worker
            elif everywhere and program.worker not in capacity.known:
                # The most room left in this pass: releases already booked count, so
                # several turns with no home spread out instead of landing on one rank.
                worker = max(room, key=lambda w: (room[w], _neg(w)))
            else:
                worker = None
            if worker is None:
                rest.append(program)
                continue
            room[worker] -= self._need(program, largest)
            plan.resumptions.append(Resumption(program, worker, released_evicting=True))
        return rest

    def need(self, program: Program, capacity: Capacity) -> float:
        """The room ``program`` takes when it resumes (see :meth:`_need`)."""
        return self._need(program, capacity.largest_room * self.level)

    def _need(self, program: Program, largest: float) -> float:
        """The room ``program`` takes when it resumes: its tokens and
        ``buffer_per_program``, capped at ``largest`` (a whole rank's resume level)."""
        return min(program.tokens + self.buffer, largest)

    def aged(self, program: Program, now: float) -> bool:
        """Deferred at least ``max_wait_seconds`` (aging on)."""
        return (self.max_wait is not None and program.deferred_since is not None
                and now - program.deferred_since >= self.max_wait)

    def aged_room(self, waiting: Iterable[Program], table: ProgramTable, capacity: Capacity,
                  now: float) -> Iterator[tuple[WorkerKey, float]]:
        """Where the turns in ``waiting`` that have waited ``max_wait_seconds`` go to make
        room for (``aging_makes_room``), oldest first: each rank with the resume-level room
        its programs must leave there, this pass's earlier bookings counted. An aged turn
        goes home or, where home cannot take it, to the rank with the most left (usage
        counted); where no rank can take the oldest such turn, none from it on is booked
        (the resume pass holds everything behind it back anyway). Lazy: each booking reads
        the usage that the pauses made for the earlier ones left."""
        known = capacity.known
        booked: dict[WorkerKey, float] = {}

        def left(worker: WorkerKey) -> float:  # resume-level room for aged turns still
            return known[worker] * self.level - booked.get(worker, 0.0)

        aged = sorted((p for p in waiting if self.aged(p, now)),
                      key=lambda p: (p.deferred_since or 0.0, p.seq))
        for program in aged:
            need = self.need(program, capacity)
            worker = program.worker
            if (worker is None or worker not in known or need > left(worker)
                    or capacity.outgrown(worker, program.tokens)):
                worker = max(capacity.taking(program.tokens),
                             key=lambda w: (left(w) - table.usage(w), _neg(w)))
                if need > left(worker):
                    break  # no rank can take it this pass, even with every program gone
            booked[worker] = booked.get(worker, 0.0) + need
            yield worker, left(worker)

    def order(self, program: Program, now: float) -> tuple[int, float, int]:
        if self.aged(program, now):
            return (-1, program.deferred_since or 0.0, program.seq)  # oldest waiter first
        if program.is_new:
            klass = _NEW
        elif program.phase is Phase.REASONING and program.current is not None:
            klass = _WAITING_TURN
        else:
            klass = _ACTING
        return (klass, program.tokens, program.seq)

    def most_room(self, table: ProgramTable, capacity: Capacity, now: float,
                  prompt: int = 0) -> WorkerKey | None:
        """The rank with the most room by decayed usage, ties to the lower one (where an
        overdue program is forced), of those whose engine takes a ``prompt`` of that many
        tokens where any does."""
        known = capacity.known
        if not known:
            return None
        return max(capacity.taking(prompt),
                   key=lambda w: (known[w] - table.decayed_usage(w, now), _neg(w)))

    # ---- placing a new turn ---------------------------------------------------------
    def place(self, table: ProgramTable, capacity: Capacity, need: float | None,
              prompt: int = 0) -> WorkerKey | None:
        """The rank where ``need`` fits under the threshold, least used (None: any rank),
        of those whose engine takes a ``prompt`` of that many tokens (a fleet of unequal
        context lengths: :meth:`~dynamo_thunderagent.capacity.Capacity.holds`)."""
        # Runs on every new program's admission over every rank: keep it a tight loop
        # over precomputed usage (ranks are visited in key order, so the strict < keeps
        # the lowest worker/rank on equal usage).
        best: WorkerKey | None = None
        best_key = (float("inf"), float("inf"))
        threshold = self.threshold
        usage_of = table.usage_by_rank.get
        busy_of = table.reasoning_tokens if self.least_busy else None
        taking = capacity.taking(prompt)  # skip ranks whose engine would refuse it
        for worker, cap in capacity.known.items():
            if worker not in taking:
                continue
            usage = usage_of(worker, 0.0)
            if need is None or usage + need <= cap * threshold:
                # least_busy: of the ranks with room, the one with the fewest prompt tokens
                # being served now (it starts the new turn soonest), then the least used.
                key = (busy_of(worker) / cap if busy_of else 0.0, usage / cap)
                if key < best_key:
                    best, best_key = worker, key
        return best


def _home(program: Program, capacity: Capacity) -> WorkerKey | None:
    """``program``'s worker/rank, unless it is not known or the program has outgrown it
    (:meth:`~dynamo_thunderagent.capacity.Capacity.outgrown`): None."""
    home = program.worker
    if home is None or home not in capacity.known or capacity.outgrown(home, program.tokens):
        return None
    return home


def _neg(worker: WorkerKey) -> tuple[int, int]:
    """Sort key that prefers the lower worker/rank when used inside ``max``."""
    return (-worker.worker_id, -worker.dp_rank)
