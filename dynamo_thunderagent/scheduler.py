"""The ThunderAgent scheduler: admission, lifecycle events and the tick.

Pure and deterministic: every method takes ``now`` and returns
:class:`Decisions` (release request R to worker W, reject R, pause P, resume
Q on W, ...). Nothing here sleeps, awaits or logs; the asyncio shell
(:mod:`dynamo_thunderagent.classifier`) applies the decisions.

Invariants the property tests check after every step:

* every program is in exactly one (phase, lifecycle) state and every tracked
  request belongs to exactly one program slot (current, waiting or final);
* at most one turn per session is released or deferred at a time;
* tracked requests and retained programs stay within ``max_tracked_requests``;
* the incremental usage ledger equals a recount;
* a deferred request is released within ``resume_timeout`` plus one tick
  while a live worker exists.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from dynamo_thunderagent.capacity import Capacity, CapacityCard, UsageModel
from dynamo_thunderagent.config import ThunderAgentParameters
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.idle import IdlePrograms
from dynamo_thunderagent.program import (
    Lifecycle,
    Phase,
    Program,
    ProgramSnapshot,
    RequestState,
    TrackedRequest,
    WorkerKey,
)
from dynamo_thunderagent.program_table import ProgramTable


@dataclass(frozen=True)
class Release:
    """Admit ``request_id``; route it to ``worker`` (None: any eligible worker).

    ``session_final`` releases carry no turn: the shell answers them without
    touching a worker.
    """

    request_id: str
    worker: WorkerKey | None
    session_final: bool = False


@dataclass(frozen=True)
class Reject:
    request_id: str
    reason: str


@dataclass
class Decisions:
    """What one call decided, in order; the shell applies and logs them."""

    released: list[Release] = field(default_factory=list)
    rejected: list[Reject] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)
    resumed: list[tuple[str, WorkerKey | None]] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    unassigned: list[str] = field(default_factory=list)

    def outcome(self, request_id: str) -> Release | Reject | None:
        """This request's release or rejection, or None if it was deferred."""
        for release in self.released:
            if release.request_id == request_id:
                return release
        for reject in self.rejected:
            if reject.request_id == request_id:
                return reject
        return None

    @property
    def changed(self) -> bool:
        return any(
            (self.released, self.rejected, self.created, self.removed, self.expired,
             self.paused, self.marked, self.resumed, self.forced, self.unassigned)
        )


# Resume order classes: a turn is waiting on a known program, then programs
# that never ran (nothing cached yet), then paused tool-callers.
_WAITING_TURN, _NEW, _ACTING = 0, 1, 2


class Scheduler:
    """Program table + admission gate + scheduler tick (see mission.md)."""

    def __init__(self, params: ThunderAgentParameters) -> None:
        self.params = params
        self.usage_model = UsageModel(
            acting_token_weight=params.acting_token_weight,
            acting_decay_tau_seconds=params.acting_decay_tau_seconds,
            buffer_per_program=params.buffer_per_program,
        )
        self.table = ProgramTable(self.usage_model)
        self.capacity = Capacity()
        self.costs: EngineCosts | None = None
        self.counters = {"pauses": 0, "idle_pauses": 0, "resumes": 0, "forced_resumes": 0,
                         "moves": 0, "expired": 0, "evicted": 0, "rejected": 0}
        # PAUSED programs whose turn waits for room: the only programs that hold a new
        # program back, and the resume candidates when idle horizons are on.
        self._deferred: dict[str, Program] = {}
        # Idle programs: the eviction order, and (with idle horizons) the dormant ones
        # that give way first under pressure.
        self.idle = IdlePrograms(self.table.programs, factor=params.idle_horizon_factor,
                                 minimum=params.idle_horizon_min_seconds,
                                 maximum=params.session_retention_seconds)

    # ---- workers ---------------------------------------------------------------
    def set_workers(
        self,
        live_worker_ids: set[int] | frozenset[int],
        cards: dict[WorkerKey, CapacityCard],
        now: float | None = None,
    ) -> Decisions:
        """Replace the live set and capacity cards; the next tick acts on it.

        With ``resume_on_events`` and ``now`` given, room that appeared (a worker
        joined, capacity grew) is used at once.
        """
        before = dict(self.capacity.known)
        self.capacity.update(live_worker_ids, cards)
        d = Decisions()
        if now is not None and any(
            cap > before.get(worker, 0) for worker, cap in self.capacity.known.items()
        ):
            self._room_appeared(now, d)
        return d

    def observe_costs(self, costs: EngineCosts | None) -> None:
        """The latest measured prefill cost per token and turn service time."""
        self.costs = costs

    def pause_pays(self, tokens: int) -> bool:
        """Would pausing a program of ``tokens`` save more than it costs?

        Parity (``pause_min_recompute_ratio`` unset): yes. Otherwise re-prefilling
        the program must take at least that fraction of a turn's decode time; below
        it, a pause only idles the agent. Until the engine's costs are measured
        nothing is known to pay, so admission stays open like plain KV routing (a
        pause made on a guess costs a wait that stock routing never imposes).
        """
        ratio = self.params.pause_min_recompute_ratio
        if ratio is None:
            return True
        if self.costs is None:
            return False
        recompute = tokens * self.costs.prefill_seconds_per_token
        return recompute >= ratio * self.costs.decode_seconds

    # ---- admission -------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        session_id: str,
        input_tokens: int,
        now: float,
        *,
        session_final: bool = False,
        parent_session_id: str | None = None,
        prefix_blocks: tuple[int, ...] = (),
        prefix_block_tokens: int = 0,
    ) -> Decisions:
        """Admit, defer or reject one turn (or the session-final request) of a session.

        ``prefix_blocks`` are hashes of the prompt's leading KV blocks of
        ``prefix_block_tokens`` tokens each; they matter only with
        ``shared_prefix_accounting``.
        """
        d = Decisions()
        table = self.table
        limit = self.params.max_tracked_requests
        if request_id in table.requests:
            return self._reject(d, request_id, f"request id {request_id!r} is already in "
                                "flight; request ids must be unique")
        if input_tokens < 0:
            return self._reject(d, request_id, f"input_tokens must be >= 0, got {input_tokens}")
        if len(table.requests) >= limit:
            return self._reject(d, request_id, f"the scheduler already tracks {limit} requests "
                                f"(max_tracked_requests={limit}); retry later")
        largest = self.capacity.largest
        if not session_final and largest and input_tokens > largest:
            # It would wait for room that never comes; the engine could not run it either.
            return self._reject(d, request_id, f"the prompt has {input_tokens} tokens, more "
                                f"than the KV capacity of any worker/rank (largest: "
                                f"{largest} tokens); shorten it or add larger workers")
        program = table.programs.get(session_id)
        if session_final:
            if program is None:
                d.released.append(Release(request_id, None, session_final=True))
                return d
            if program.final_request is not None:
                return self._reject(d, request_id, f"session {session_id!r} is already ending")
            table.requests[request_id] = TrackedRequest(
                request_id, session_id, 0, now, RequestState.QUEUED, created_program=False)
            program.final_request = request_id
            self._advance(program, now, d)
            self._room_appeared(now, d)
            return d
        created = False
        if program is None:
            if len(table.programs) >= limit and not self._evict_oldest_idle(d):
                return self._reject(d, request_id, f"the scheduler already retains {limit} "
                                    f"active programs (max_tracked_requests={limit}); "
                                    "end finished sessions with X-Dynamo-Session-Final")
            program = table.create(session_id, now, parent_session_id)
            created = True
            d.created.append(session_id)
        elif program.final_request is not None:
            return self._reject(d, request_id, f"session {session_id!r} is ending (a "
                                "session-final request is pending); start a new session")
        else:
            turns = len(program.waiting) + (program.current is not None)
            cap = self.params.max_turns_per_session
            if turns >= cap:
                return self._reject(d, request_id, f"session {session_id!r} already has "
                                    f"{turns} turns in flight or queued "
                                    f"(max_turns_per_session={cap}); send a session's turns "
                                    "one at a time")
            if not program.busy:
                self.idle.returned(program, now)
        request = TrackedRequest(request_id, session_id, input_tokens, now,
                                 RequestState.QUEUED, created_program=created)
        if self.params.shared_prefix_accounting and prefix_block_tokens > 0:
            limit_blocks = self.params.shared_prefix_max_blocks
            request.prefix_blocks = tuple(prefix_blocks[:limit_blocks])
            request.prefix_block_tokens = prefix_block_tokens
        table.requests[request_id] = request
        if program.current is None:
            self._start_turn(program, request, now, d)
            if request.state is RequestState.DEFERRED:
                self._room_appeared(now, d)  # a returning paused program: room may be there
        else:
            program.waiting.append(request_id)
        return d

    def _start_turn(self, program: Program, request: TrackedRequest, now: float,
                    d: Decisions) -> None:
        program.current = request.request_id
        program.last_active = now
        request.state = RequestState.DEFERRED
        request.prior = ProgramSnapshot(program.tokens, program.worker, program.acting_since,
                                        program.prefix_blocks, program.prefix_block_tokens)
        with self.table.changing(program):
            program.phase = Phase.REASONING
            program.tokens = request.input_tokens
            program.acting_since = None
            program.prefix_blocks = request.prefix_blocks
            program.prefix_block_tokens = request.prefix_block_tokens
        if program.lifecycle is Lifecycle.PAUSED:
            if program.deferred_since is None:
                program.deferred_since = now
            self._deferred[program.session_id] = program
            return
        worker = program.worker
        if worker is not None and self.capacity.is_live(worker):
            self._release(program, request, worker, now, d)  # sticky
            return
        if not self.capacity.known:
            self._release(program, request, None, now, d)  # cold start: no capacity data
            return
        pays = self.pause_pays(program.tokens)
        if program.is_new and self._deferred and pays:
            self._pause(program, now, d)  # no queue jumping past programs waiting for room
            program.deferred_since = now
            return
        # Capped like on the resume side: a program that fits a rank's capacity but not
        # its threshold goes to an empty rank rather than waiting for one that never comes.
        need = min(program.tokens + self.params.buffer_per_program,
                   self.capacity.largest * self.params.pause_threshold)
        target = self._least_used_with_room(need if pays else None)
        if target is None and self._reclaim_dormant(now, d, need):
            target = self._least_used_with_room(need)
        if target is None:
            self._pause(program, now, d)
            program.deferred_since = now
            return
        self._release(program, request, target, now, d)

    def _least_used_with_room(self, need: float | None) -> WorkerKey | None:
        """The least-used rank where ``need`` fits under the threshold (None: any rank)."""
        # Runs on every new program's admission over every rank: keep it a
        # tight loop over precomputed usage (ranks are visited in key order,
        # so the strict < keeps the lowest worker/rank on equal usage).
        best: WorkerKey | None = None
        best_key = (float("inf"), float("inf"))
        threshold = self.params.pause_threshold
        usage_of = self.table.usage_by_rank.get
        busy_of = self.table.reasoning_tokens if self.params.placement == "least_busy" else None
        for worker, capacity in self.capacity.known.items():
            usage = usage_of(worker, 0.0)
            if need is None or usage + need <= capacity * threshold:
                # least_busy: of the ranks with room, the one with the fewest prompt tokens
                # being served now (it starts the new turn soonest), then the least used.
                key = (busy_of(worker) / capacity if busy_of else 0.0, usage / capacity)
                if key < best_key:
                    best, best_key = worker, key
        return best

    def _release(self, program: Program, request: TrackedRequest, worker: WorkerKey | None,
                 now: float, d: Decisions) -> None:
        request.state = RequestState.RELEASED
        request.released_to = worker
        request.released_at = now
        program.deferred_since = None
        if program.active_since is None:
            program.active_since = now
        if worker is not None and worker != program.worker:
            self._move(program, worker)
        d.released.append(Release(request.request_id, worker))

    def _move(self, program: Program, worker: WorkerKey | None) -> None:
        if program.worker is not None and worker is not None and worker != program.worker:
            program.moves += 1
            self.counters["moves"] += 1
        with self.table.changing(program):
            program.worker = worker

    def _evict_oldest_idle(self, d: Decisions) -> bool:
        """Remove the program idle the longest (O(log n) amortized); False if none is idle."""
        oldest = self.idle.oldest()
        if oldest is None:
            return False
        self._drop(oldest)
        self.counters["evicted"] += 1
        d.removed.append(oldest.session_id)
        return True

    def _drop(self, program: Program) -> None:
        """Remove ``program`` from the table and from every index that names it."""
        self.table.remove(program)
        self._deferred.pop(program.session_id, None)
        self.idle.forget(program.session_id)

    def _reclaim_dormant(self, now: float, d: Decisions, need: float | None = None) -> bool:
        """Pause dormant programs, longest past their horizon first, to make room.

        With ``need``, stop as soon as some rank has room for it; without, pause
        every dormant program. True if anything was paused.
        """
        if self.params.idle_horizon_factor is None:
            return False
        self.idle.find_dormant(now)
        paused = False
        while (program := self.idle.pop_dormant()) is not None:
            self._pause(program, now, d, idle=True)
            paused = True
            if need is not None and self._least_used_with_room(need) is not None:
                break
        return paused

    def _reject(self, d: Decisions, request_id: str, reason: str) -> Decisions:
        self.counters["rejected"] += 1
        d.rejected.append(Reject(request_id, reason))
        return d

    # ---- lifecycle events ------------------------------------------------------
    def sent(self, request_id: str, worker: WorkerKey, now: float) -> Decisions:
        """The request reached ``worker``: the program now lives where it was served."""
        d = Decisions()
        request = self.table.requests.get(request_id)
        if request is None or request.state is not RequestState.RELEASED:
            return d  # unknown, finished or never admitted: nothing to learn
        request.sent_to = worker
        program = self.table.programs[request.session_id]
        if program.current == request_id and program.worker != worker:
            self._move(program, worker)
        return d

    def responding(self, request_id: str, now: float) -> Decisions:
        request = self.table.requests.get(request_id)
        if request is not None and request.state is RequestState.RELEASED:
            request.responding = True
            self.table.programs[request.session_id].last_active = now
        return Decisions()

    def completed(self, request_id: str, context_tokens: int, now: float) -> Decisions:
        """The turn finished with ``context_tokens`` (prompt + generated) in the cache."""
        d = Decisions()
        request = self.table.requests.get(request_id)
        if request is None or request.state is not RequestState.RELEASED:
            return d
        del self.table.requests[request_id]
        program = self.table.programs[request.session_id]
        program.current = None
        program.steps += 1
        program.last_active = now
        with self.table.changing(program):
            program.phase = Phase.ACTING
            program.tokens = max(0, context_tokens)
            program.acting_since = now
        if program.marked_for_pause:
            self._pause(program, now, d)  # its tool boundary
        self._advance(program, now, d)
        self._room_appeared(now, d)
        return d

    def aborted(self, request_id: str, now: float) -> Decisions:
        """The request ended without completing (error, disconnect, cancelled wait)."""
        d = Decisions()
        request = self.table.requests.pop(request_id, None)
        if request is None:
            return d
        program = self.table.programs[request.session_id]
        if program.final_request == request_id:
            program.final_request = None
            return d
        if program.current != request_id:
            program.waiting.remove(request_id)
            return d
        program.current = None
        program.deferred_since = None
        self._deferred.pop(program.session_id, None)
        if request.created_program and program.is_new and not program.busy:
            self._drop(program)  # roll back: the program never ran
            d.removed.append(program.session_id)
            self._room_appeared(now, d)
            return d
        program.last_active = now
        prior = request.prior
        with self.table.changing(program):
            program.phase = Phase.ACTING
            program.acting_since = now
            if prior is not None:  # the aborted turn left nothing in the cache
                program.tokens = prior.tokens
                program.prefix_blocks = prior.prefix_blocks
                program.prefix_block_tokens = prior.prefix_block_tokens
                if prior.acting_since is not None:
                    program.acting_since = prior.acting_since
                if prior.worker is not None and self.capacity.is_live(prior.worker):
                    program.worker = prior.worker  # where its cache is
        if program.marked_for_pause:
            self._pause(program, now, d)
        self._advance(program, now, d)
        self._room_appeared(now, d)
        return d

    cancel = aborted  # a cancelled deferral is an abort before release

    def _advance(self, program: Program, now: float, d: Decisions) -> None:
        """Start the session's next turn, end it if only session-final is left, or else
        note that it is idle from ``now`` on."""
        if program.current is not None:
            return
        if program.waiting:
            request = self.table.requests[program.waiting.popleft()]
            self._start_turn(program, request, now, d)
        elif program.final_request is not None:
            final = program.final_request
            del self.table.requests[final]
            self._drop(program)
            d.removed.append(program.session_id)
            d.released.append(Release(final, None, session_final=True))
        else:
            self.idle.went_idle(program, now)

    def _room_appeared(self, now: float, d: Decisions) -> None:
        """Event-driven resume (``resume_on_events``); the tick stays the backstop."""
        if self.params.resume_on_events and self.table.any_paused:
            self.resume_waiting(now, d)

    # ---- pause / resume --------------------------------------------------------
    def _pause(self, program: Program, now: float, d: Decisions, *, idle: bool = False) -> None:
        """Pause ``program``; ``idle``: it is dormant and gives way (counted apart)."""
        with self.table.changing(program):
            program.lifecycle = Lifecycle.PAUSED
        program.marked_for_pause = False
        program.active_since = None
        program.pauses += 1
        self.counters["idle_pauses" if idle else "pauses"] += 1
        if program.current is not None:
            self._deferred[program.session_id] = program
        d.paused.append(program.session_id)

    def _resume(self, program: Program, worker: WorkerKey | None, now: float,
                d: Decisions) -> None:
        if worker is not None and worker != program.worker:
            self._move(program, worker)
        with self.table.changing(program):
            program.lifecycle = Lifecycle.ACTIVE
        self._deferred.pop(program.session_id, None)
        program.active_since = now
        program.resumes += 1
        self.counters["resumes"] += 1
        d.resumed.append((program.session_id, worker))
        if program.current is not None:
            request = self.table.requests[program.current]
            if request.state is RequestState.DEFERRED:
                self._release(program, request, worker, now, d)

    def resume_waiting(self, now: float, d: Decisions | None = None) -> Decisions:
        """Resume paused programs into the room below the resume level.

        Callable from the tick and from events (a completion or an abort frees
        room). Candidates are ordered by class (waiting turn, new, ACTING),
        then smallest first; the chosen set is packed largest-first onto the
        rank with most room, so a program may move to another worker. With
        ``resume_affinity`` a program goes back to its last rank when that rank
        has room. With ``max_wait_seconds`` a turn deferred that long comes
        first, and while it does not fit nothing behind it is resumed.
        """
        d = d if d is not None else Decisions()
        if self.params.idle_horizon_factor is None:
            paused = self.table.paused()
        else:
            # Idle paused programs resume when their next turn arrives, not ahead of it.
            paused = list(self._deferred.values())
            if paused:
                self._reclaim_dormant(now, d)
        if not paused:
            return d
        known = self.capacity.known
        if not known:
            if self.capacity.any_live:  # capacity unknown: behave as at cold start
                for program in sorted(paused, key=lambda p: self._resume_order(p, now)):
                    if program.current is not None:
                        self._resume(program, None, now, d)
            return d
        level = self.params.pause_threshold - self.params.resume_hysteresis
        buffer = self.params.buffer_per_program
        room = {w: cap * level - self.table.decayed_usage(w, now) for w, cap in known.items()}
        free = sum(max(0.0, r) for r in room.values())
        # A program larger than any rank's resume level (it still fits the capacity, or
        # admission would have refused it) needs a whole empty rank, not more than that:
        # without the cap it would wait for resume_timeout and hold every new program back.
        largest = self.capacity.largest * level
        chosen = []
        for program in sorted(paused, key=lambda p: self._resume_order(p, now)):
            need = min(program.tokens + buffer, largest)
            if not self.pause_pays(program.tokens):
                chosen.append(program)  # holding it back saves nothing: resume it anyway
                free -= need
            elif need <= free:
                chosen.append(program)
                free -= need
            elif self._aged(program, now):
                break  # reserve the room that is left for the longest waiter
        # Most room first; ties to the lower worker/rank. A heap keeps each
        # placement O(log ranks) at fleet scale; entries whose room changed are
        # stale and skipped.
        heap = [(-r, w) for w, r in room.items()]
        heapq.heapify(heap)
        for program in sorted(chosen, key=lambda p: (-p.tokens, p.seq)):
            need = min(program.tokens + buffer, largest)
            home = program.worker
            if (self.params.resume_affinity and home is not None and home in room
                    and room[home] >= need):
                worker = home
            else:
                while -heap[0][0] != room[heap[0][1]]:
                    heapq.heappop(heap)
                worker = heap[0][1]
                if room[worker] < need and self.pause_pays(program.tokens):
                    continue
            room[worker] -= need
            heapq.heappush(heap, (-room[worker], worker))
            self._resume(program, worker, now, d)
        return d

    def _aged(self, program: Program, now: float) -> bool:
        limit = self.params.max_wait_seconds
        return (limit is not None and program.deferred_since is not None
                and now - program.deferred_since >= limit)

    def _resume_order(self, program: Program, now: float) -> tuple[int, float, int]:
        if self._aged(program, now):
            return (-1, program.deferred_since or 0.0, program.seq)  # oldest waiter first
        if program.is_new:
            klass = _NEW
        elif program.phase is Phase.REASONING and program.current is not None:
            klass = _WAITING_TURN
        else:
            klass = _ACTING
        return (klass, program.tokens, program.seq)

    # ---- the tick --------------------------------------------------------------
    def tick(self, now: float) -> Decisions:
        """One scheduler pass: expire, unassign, resume, force overdue, relieve pressure."""
        d = Decisions()
        self._sweep(now, d)
        self.idle.find_dormant(now)
        self.resume_waiting(now, d)
        self._force_overdue(now, d)
        self._relieve_pressure(now, d)
        return d

    def _sweep(self, now: float, d: Decisions) -> None:
        """Expire idle programs past retention; drop assignments to workers that left.

        One pass over the table (it is the only O(programs) step of a tick).
        """
        retention = self.params.session_retention_seconds
        live = self.capacity.live_worker_ids
        for program in list(self.table.programs.values()):
            if not program.busy and now - program.last_active >= retention:
                self._drop(program)
                self.counters["expired"] += 1
                d.expired.append(program.session_id)
            elif program.worker is not None and program.worker.worker_id not in live:
                with self.table.changing(program):
                    program.worker = None
                d.unassigned.append(program.session_id)

    def _force_overdue(self, now: float, d: Decisions) -> None:
        """A deferral never outlives resume_timeout while a live worker exists."""
        if not self.capacity.any_live:
            return
        timeout = self.params.resume_timeout_seconds
        overdue = [
            p for p in self._deferred.values()
            if p.deferred_since is not None and now - p.deferred_since >= timeout
        ]
        for program in sorted(overdue, key=lambda p: (p.deferred_since or 0.0, p.seq)):
            known = self.capacity.known
            worker = None
            if known:
                worker = max(known, key=lambda w: (
                    known[w] - self.table.decayed_usage(w, now), _neg(w)))
            self.counters["forced_resumes"] += 1
            d.forced.append(program.session_id)
            self._resume(program, worker, now, d)

    def _relieve_pressure(self, now: float, d: Decisions) -> None:
        """Pause ACTING programs of each over-threshold rank, then mark REASONING ones.

        Parity: plain usage, smallest ACTING programs first. ``pressure_decay``
        measures with the same decayed usage as the resume side; ``pause_order:
        longest_idle`` pauses the programs whose tool has run longest first;
        ``min_residency_seconds`` spares programs that only just became ACTIVE.
        """
        decay = self.params.pressure_decay
        model = self.usage_model

        def charge(program: Program) -> float:
            return model.decayed_charge(program, now) if decay else model.charge(program)

        if self.params.pause_order == "longest_idle":
            def victim_order(p: Program) -> tuple[float, int, int]:
                return (p.acting_since if p.acting_since is not None else now, p.tokens, p.seq)
        else:
            def victim_order(p: Program) -> tuple[float, int, int]:
                return (0.0, p.tokens, p.seq)

        residency = self.params.min_residency_seconds
        threshold = self.params.pause_threshold
        if self.idle.dormant and any(self.table.usage(w) > c * threshold
                                 for w, c in self.capacity.known.items()):
            self._reclaim_dormant(now, d)  # idle programs give way first
        for worker, capacity in self.capacity.known.items():
            usage = (self.table.decayed_usage(worker, now) if decay
                     else self.table.usage(worker))
            if usage <= capacity * self.params.pause_threshold:
                continue
            target = capacity * self.params.pause_target
            members = self.table.members(worker)
            usage -= sum(charge(p) for p in members if p.marked_for_pause)
            acting = sorted(
                (p for p in members if p.phase is Phase.ACTING
                 and not (residency and p.active_since is not None
                          and now - p.active_since < residency)
                 and self.pause_pays(p.tokens)),
                key=victim_order,
            )
            for program in acting:
                if usage <= target:
                    break
                usage -= charge(program)
                self._pause(program, now, d)
            reasoning = sorted(
                (p for p in members if p.phase is Phase.REASONING and not p.marked_for_pause
                 and self.pause_pays(p.tokens)),
                key=lambda p: (p.tokens, p.seq),
            )
            for program in reasoning:
                if usage <= target:
                    break
                usage -= charge(program)
                program.marked_for_pause = True
                d.marked.append(program.session_id)

    # ---- introspection ---------------------------------------------------------
    def snapshot(self, now: float) -> dict[str, object]:
        """Plain-data view of the state, for the router's /state and for tests."""
        ranks = {}
        for worker in sorted(set(self.capacity.known) | set(self.table.assigned_workers())):
            ranks[str(worker)] = {
                "capacity_tokens": self.capacity.known.get(worker),
                "usage_tokens": self.table.usage(worker),
                "decayed_usage_tokens": self.table.decayed_usage(worker, now),
                "programs": len(self.table.members(worker)),
            }
        programs = {
            p.session_id: {
                "phase": p.phase.value, "lifecycle": p.lifecycle.value,
                "worker": None if p.worker is None else str(p.worker), "tokens": p.tokens,
                "steps": p.steps, "marked_for_pause": p.marked_for_pause,
                "in_flight": p.current, "waiting": len(p.waiting),
                "pauses": p.pauses, "resumes": p.resumes, "moves": p.moves,
            }
            for p in self.table.programs.values()
        }
        return {
            "programs": programs,
            "tracked_requests": len(self.table.requests),
            "paused": len(self.table.paused()),
            "waiting_for_room": len(self._deferred),
            "dormant": len(self.idle.dormant),
            "return_evidence": self.idle.evidence.as_dict(),
            "ranks": ranks,
            "live_workers": sorted(self.capacity.live_worker_ids),
            "counters": dict(self.counters),
        }


def _neg(worker: WorkerKey) -> tuple[int, int]:
    """Sort key that prefers the lower worker/rank when used inside ``max``."""
    return (-worker.worker_id, -worker.dp_rank)
