"""The ThunderAgent scheduler: admission, lifecycle events and the tick.

Pure and deterministic: every method takes ``now`` and returns
:class:`Decisions` (release request R to worker W, reject R, pause P, resume
Q on W, ...). Nothing here sleeps, awaits or logs; the asyncio shell
(:mod:`dynamo_thunderagent.classifier`) applies the decisions.

The rules behind each decision live in three seams chosen once from the
parameters: the cost model (:mod:`~dynamo_thunderagent.costs`: does a pause
pay?), the pause rule (:mod:`~dynamo_thunderagent.pressure`: who gives way) and
the resume planner (:mod:`~dynamo_thunderagent.resume`: who comes back, and
where programs run). This module applies their plans and owns every state
change, and says why it took each step where it takes it (``Decisions.steps``,
``Reject.limit``): only there is the reason known. It is longer than most
(about 1,000 lines) because admission, the four lifecycle events, pause/resume and the
tick are one algorithm that reads best top to bottom; what is not part of it lives
beside it: the ledger of traffic no program owns (:mod:`~dynamo_thunderagent.sessionless`),
where aged turns make room (the planner's ``aged_room``), carrying measured costs across
a reload (``costs.carry_costs``) and the state as plain data
(:mod:`~dynamo_thunderagent.snapshot`).
The seams are rebuilt, and everything else kept, when a policy reload brings new
parameters (:meth:`Scheduler.reconfigure`).

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

from collections.abc import Iterable, Mapping
from dataclasses import replace

from dynamo_thunderagent.cache_loss import (
    KEEPS_PAUSED_MIN_RESUMES,
    CacheLossMeter,
    expected_cached,
    keeps_paused,
)
from dynamo_thunderagent.capacity import Capacity, CapacityCard, UsageModel
from dynamo_thunderagent.costs import (
    CostModel,
    EngineCosts,
    HostTierCosts,
    TurnTiming,
    carry_costs,
    cost_model,
)
from dynamo_thunderagent.decisions import (
    Decisions,
    EventKind,
    PauseReason,
    ProgramEvent,
    Reject,
    RejectLimit,
    Release,
)
from dynamo_thunderagent.idle import IdlePrograms
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.pressure import pause_rule
from dynamo_thunderagent.program import (
    NO_PREFIX,
    Lifecycle,
    Phase,
    PrefixBlocks,
    Program,
    ProgramSnapshot,
    RequestState,
    TrackedRequest,
    WorkerKey,
)
from dynamo_thunderagent.program_table import ProgramTable
from dynamo_thunderagent.resume import ResumePlanner
from dynamo_thunderagent.sessionless import SessionlessTraffic
from dynamo_thunderagent.snapshot import scheduler_snapshot

__all__ = ["Decisions", "Reject", "Release", "Scheduler"]


class Scheduler:
    """Program table + admission gate + scheduler tick (see mission.md)."""

    def __init__(self, params: ThunderAgentParameters) -> None:
        self.params = params
        self.usage_model = _usage_model(params)
        self.table = ProgramTable(self.usage_model)
        self.capacity = Capacity()
        # What the engines lost of the cache continuing turns expected: does an engine
        # evict at all where our usage says it is full? (Kept across reloads.)
        self.cache_loss = CacheLossMeter()
        # What paused programs found of their prompt when they resumed where they had run:
        # does a pause save anything there (pause_min_resume_loss)? (Kept across reloads.)
        self.resume_loss = CacheLossMeter()
        self._build_seams(params, cost_model(params.pause_min_recompute_ratio))
        self._released = 0  # tracked requests released and not yet ended
        self.counters = {"pauses": 0, "idle_pauses": 0, "resumes": 0, "forced_resumes": 0,
                         "moves": 0, "priced_moves": 0, "move_price_ms": 0, "held_home": 0,
                         "expired": 0, "evicted": 0, "rejected": 0, "yields": 0,
                         "released_evicting": 0, "alongside": 0,
                         "aging_pauses": 0, "aging_marks": 0,
                         "aging_marks_cleared": 0, "sessionless_untracked": 0,
                         "empty_rank_moves": 0, "outgrown_moves": 0}
        # Requests without a session id running now, and their prompt tokens per rank
        # (``sessionless_kv``); at most max_tracked_requests of them are followed.
        self.sessionless = SessionlessTraffic()
        # acting_yield_factor's horizon in seconds (None: off or not measured; _set_hold):
        # the time the engine takes to re-prefill a mean pool, times the factor. The turns
        # running per rank weigh on both sides of the trade (a re-prefill holds them all
        # up; the room a program keeps would run its share of them), so they do not move it.
        self.yield_horizon: float | None = None
        # PAUSED programs whose turn waits for room: the only programs that hold a new
        # program back, and the resume candidates when idle horizons are on.
        self._deferred: dict[str, Program] = {}
        # Programs resumed without room on a rank evicting anyway, until they pause again,
        # move or leave: the overfill of our own making (``hold_excludes_let_in``).
        self._let_in: dict[str, Program] = {}
        # Idle programs: the eviction order, and (with idle horizons) the dormant ones
        # that give way first under pressure.
        self.idle = IdlePrograms(self.table.programs, factor=params.idle_horizon_factor,
                                 minimum=params.idle_horizon_min_seconds,
                                 maximum=params.session_retention_seconds)

    def _build_seams(self, params: ThunderAgentParameters, costs: CostModel) -> None:
        """The three seams, chosen from the parameters (parity by default): what
        recompute costs, who gives way under pressure, who comes back and where."""
        self.costs = costs
        self.host_tier: HostTierCosts | None = None
        if params.host_kv_blocks:
            self.costs = self.host_tier = HostTierCosts(self.costs)
        self.pause_rule = pause_rule(
            params, self.usage_model, self.costs, self.cache_loss,
            self.keeps_paused if params.pause_min_resume_loss is not None else None)
        self.planner = ResumePlanner(params, self.costs)

    def reconfigure(self, params: ThunderAgentParameters) -> None:
        """Run with ``params`` from now on, keeping every program, request and counter.

        The usage model and the three seams are rebuilt from ``params``; the program
        table (re-priced under the new usage model), capacity, counters, the waiting
        turns and the engine costs measured so far are kept. Nothing is decided here:
        the next call (an event or the tick) applies the new thresholds. Idle horizons
        already set keep their deadline; programs that go idle from now on get the new
        ones.
        """
        self.params = params
        self.usage_model = _usage_model(params)
        self.table.set_usage_model(self.usage_model)
        old_costs = self.costs
        self._build_seams(params, carry_costs(old_costs, params.pause_min_recompute_ratio))
        self.idle.reconfigure(factor=params.idle_horizon_factor,
                              minimum=params.idle_horizon_min_seconds,
                              maximum=params.session_retention_seconds)
        for worker in self.sessionless.tokens:
            self._reserve(worker)
        self._set_hold()
        # Over the pools as the new reservations leave them.
        self._set_host_spare(sum(p.tokens for p in self.table.programs.values()))

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
        for worker in before.keys() - self.capacity.known.keys():
            self.cache_loss.forget(worker)
            self.resume_loss.forget(worker)
        d = Decisions()
        if now is not None and any(
            cap > before.get(worker, 0) for worker, cap in self.capacity.known.items()
        ):
            self._room_appeared(now, d)
        return d

    def observe_turn(self, timing: TurnTiming) -> None:
        """A completed turn's engine timings (what the cost model measures)."""
        self.costs.observe(timing)

    def observe_costs(self, costs: EngineCosts) -> None:
        """Take these engine costs as measured (tests, and shells that measure them)."""
        self.costs.set_costs(costs)

    @property
    def waiting_for_room(self) -> int:
        """Paused programs whose turn waits for room."""
        return len(self._deferred)

    @property
    def batch(self) -> float:
        """Turns running per worker/rank, on average (what a re-prefill holds up)."""
        return self._released / max(1, len(self.capacity.known))

    # ---- admission -------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        session_id: str,
        input_tokens: int,
        now: float,
        *,
        session_final: bool = False,
        prefix: PrefixBlocks = NO_PREFIX,
    ) -> Decisions:
        """Admit, defer or reject one turn (or the session-final request) of a session.

        ``prefix``: the prompt's leading KV blocks; read only with
        ``shared_prefix_accounting``.
        """
        d = Decisions()
        table = self.table
        limit = self.params.max_tracked_requests
        if request_id in table.requests:
            return self._reject(d, request_id, "duplicate_request_id",
                                f"request id {request_id!r} is already in "
                                "flight; request ids must be unique")
        if input_tokens < 0:
            return self._reject(d, request_id, "invalid_input_tokens",
                                f"input_tokens must be >= 0, got {input_tokens}")
        program = table.programs.get(session_id)
        # A session-final request that ends its program at once (none, or one with no
        # turn running or queued) holds no entry past this call: never refused for room,
        # since refusing it would keep a finished program's charge on its rank.
        ends_now = session_final and (program is None or not program.busy)
        if len(table.requests) >= limit and not ends_now:
            return self._reject(d, request_id, "max_tracked_requests",
                                f"the scheduler already tracks {limit} requests "
                                f"(max_tracked_requests={limit}); retry later")
        largest = self.capacity.largest
        if not session_final and largest and input_tokens > largest:
            # It would wait for room that never comes; the engine could not run it either.
            return self._reject(d, request_id, "prompt_exceeds_capacity",
                                f"the prompt has {input_tokens} tokens, more "
                                f"than the KV capacity of any worker/rank (largest: "
                                f"{largest} tokens); shorten it or add larger workers")
        if session_final:
            if program is None or program.final_request is not None:
                # No program to end, or one already ending (a second final: a retry, a
                # harness's cleanup beside the agent's own): answered at once, rather than
                # refused while the first waits.
                d.released.append(Release(request_id, None, session_final=True))
                return d
            table.requests[request_id] = TrackedRequest(
                request_id, session_id, 0, RequestState.QUEUED, created_program=False)
            program.final_request = request_id
            self._advance(program, now, d)
            self._room_appeared(now, d)
            return d
        created = False
        if program is None:
            if len(table.programs) >= limit and not self._evict_oldest_idle(d):
                return self._reject(d, request_id, "max_tracked_programs",
                                    f"the scheduler already retains {limit} "
                                    f"active programs (max_tracked_requests={limit}); "
                                    "end finished sessions with X-Dynamo-Session-Final")
            program = table.create(session_id, now)
            created = True
            d.created.append(session_id)
        elif program.final_request is not None:
            return self._reject(d, request_id, "session_ending",
                                f"session {session_id!r} is ending (a "
                                "session-final request is pending); start a new session")
        else:
            if self._runs_alongside(program):
                self._alongside(request_id, d, program.worker)
                return d
            turns = len(program.waiting) + (program.current is not None)
            cap = self.params.max_turns_per_session
            if turns >= cap:
                return self._reject(d, request_id, "max_turns_per_session",
                                    f"session {session_id!r} already has "
                                    f"{turns} turns in flight or queued "
                                    f"(max_turns_per_session={cap}); send a session's turns "
                                    "one at a time")
            if not program.busy:
                self.idle.returned(program, now)
        request = TrackedRequest(request_id, session_id, input_tokens, RequestState.QUEUED,
                                 created_program=created)
        if self.params.shared_prefix_accounting:
            request.prefix = prefix.limited(self.params.shared_prefix_max_blocks)
        table.requests[request_id] = request
        if program.current is None:
            self._start_turn(program, request, now, d)
            if request.state is RequestState.DEFERRED:
                self._room_appeared(now, d)  # a returning paused program: room may be there
        else:
            program.waiting.append(request_id)
        return d

    def _runs_alongside(self, program: Program) -> bool:
        """``concurrent_turns: alongside``: a new turn of ``program`` runs beside its
        current one, untracked, when that turn is running; one that arrives while the
        current turn waits for room queues and goes with it (:meth:`_release`)."""
        if self.params.concurrent_turns != "alongside" or program.current is None:
            return False
        current = self.table.requests.get(program.current)
        return (current is not None and current.state is RequestState.RELEASED
                and program.lifecycle is Lifecycle.ACTIVE)

    def _start_turn(self, program: Program, request: TrackedRequest, now: float,
                    d: Decisions) -> None:
        """Make ``request`` the program's turn: released now, or deferred while it is paused."""
        self._place_turn(program, request, now, d)
        if request.state is RequestState.DEFERRED and program.lifecycle is Lifecycle.PAUSED:
            _step(d, EventKind.DEFERRED, program, program.worker, "program_paused")

    def _place_turn(self, program: Program, request: TrackedRequest, now: float,
                    d: Decisions) -> None:
        """Release the turn (sticky, cold start, or on the rank the planner picks), or pause
        its program and defer it (paused already, no queue jumping, no room)."""
        program.current = request.request_id
        program.last_active = now
        request.state = RequestState.DEFERRED
        request.prior = ProgramSnapshot(program.tokens, program.worker, program.acting_since,
                                        program.prefix, program.resident_prompt_tokens,
                                        program.paused_prompt_tokens)
        with self.table.changing(program):
            program.phase = Phase.REASONING
            program.tokens = request.input_tokens
            program.acting_since = None
            program.yielded = False
            program.prefix = request.prefix
        if program.lifecycle is Lifecycle.PAUSED:
            if program.deferred_since is None:
                program.deferred_since = now
            self._deferred[program.session_id] = program
            return
        worker = program.worker
        outgrown = False
        if worker is not None and self.capacity.is_live(worker):
            # A turn larger than its rank's whole pool or context length never runs there
            # (the engine refuses it): in a fleet of unequal pools or context lengths it
            # goes where an engine takes it, as a new program's turn would.
            outgrown = self.capacity.outgrown(worker, program.tokens)
            if not outgrown:
                empty = self._empty_rank(program, worker)
                if empty is not None:
                    self.counters["empty_rank_moves"] += 1
                    self._release(program, request, empty, now, d, why="empty_rank")
                    return
                self._release(program, request, worker, now, d)  # sticky
                return
            self.counters["outgrown_moves"] += 1
        if not self.capacity.known:
            self._release(program, request, None, now, d)  # cold start: no capacity data
            return
        pays = outgrown or self.costs.pause_pays(program.tokens, self.batch)
        if program.is_new and self._deferred and pays:
            self._pause(program, now, d)  # no queue jumping past programs waiting for room
            program.deferred_since = now
            return
        # Capped like on the resume side: a program that fits a rank's capacity but not
        # its threshold goes to an empty rank rather than waiting for one that never comes.
        need = min(program.tokens + self.params.buffer_per_program,
                   self.capacity.largest_room * self.params.pause_threshold)
        target = self.planner.place(self.table, self.capacity, need if pays else None,
                                    program.tokens)
        if target is None and self._reclaim_dormant(now, d, need):
            target = self.planner.place(self.table, self.capacity, need, program.tokens)
        if target is None:
            self._pause(program, now, d)
            program.deferred_since = now
            return
        self._release(program, request, target, now, d, why="outgrown" if outgrown else None)

    def _empty_rank(self, program: Program, home: WorkerKey) -> WorkerKey | None:
        """``leave_for_empty_rank``: a live rank with no program and nothing reserved that
        ``program`` fits, when it shares ``home`` with others and no program is paused (an
        empty rank is for paused programs first, and a rank of paused ones only looks
        empty); the lowest such rank (None: stay home). Every continuing turn asks, so it
        scans the ranks only when one holds no program at all."""
        table, capacity = self.table, self.capacity
        known = capacity.known
        if (not self.params.leave_for_empty_rank or table.any_paused
                or table.ranks_in_use >= len(known) or table.member_count(home) < 2):
            return None
        need = program.tokens + self.params.buffer_per_program
        return min((rank for rank, cap in known.items()
                    if rank != home and not table.member_count(rank)
                    and not capacity.reserved(rank)
                    and need <= cap * self.params.pause_threshold
                    and capacity.holds(rank, program.tokens)), default=None)

    def _release(self, program: Program, request: TrackedRequest, worker: WorkerKey | None,
                 now: float, d: Decisions, *, resumed: bool = False,
                 why: str | None = None) -> None:
        """Admit ``request`` to ``worker`` (None: any); ``resumed``: with its program's resume;
        ``why``: the reason of a release (and move) the cases below do not name."""
        waited = 0.0 if program.deferred_since is None else now - program.deferred_since
        if why is not None:
            reason = why
        elif worker is None:
            reason = "no_capacity_known"
        elif resumed:
            reason = "resumed"
        elif program.worker == worker:
            reason = "sticky"
        else:
            reason = "placed"
        request.state = RequestState.RELEASED
        request.released_at = now
        if worker is not None and worker == program.worker:
            request.expected_cached = expected_cached(
                program.resident_prompt_tokens, request.input_tokens,
                self.capacity.block_size(worker))
            if program.paused_prompt_tokens:  # paused since its last turn, back home
                request.expected_after_pause = expected_cached(
                    program.paused_prompt_tokens, request.input_tokens,
                    self.capacity.block_size(worker))
        program.paused_prompt_tokens = 0
        self._released += 1
        program.deferred_since = None
        if program.active_since is None:
            program.active_since = now
        if worker is not None and worker != program.worker:
            self._move(program, worker, d, why or ("resume" if resumed else "placed"))
        d.released.append(Release(request.request_id, worker))
        _step(d, EventKind.ADMITTED, program, worker, reason, waited)
        if self.params.concurrent_turns == "alongside":
            # Turns that queued while this one waited for room were sent beside it: they
            # go with it, as those sent while it runs do.
            while program.waiting:
                queued = program.waiting.popleft()
                del self.table.requests[queued]
                self._alongside(queued, d, worker)

    def _alongside(self, request_id: str, d: Decisions, worker: WorkerKey | None) -> None:
        """Release ``request_id`` untracked, beside its session's running turn on
        ``worker``, where the prompt they share is cached (``concurrent_turns:
        alongside``); to no worker in particular if that one is not live."""
        if worker is not None and not self.capacity.is_live(worker):
            worker = None
        self.counters["alongside"] += 1
        d.released.append(Release(request_id, worker, tracked=False))

    def _move(self, program: Program, worker: WorkerKey | None, d: Decisions,
              reason: str) -> None:
        """Assign ``program`` to ``worker``; a change of rank is a move, for ``reason``."""
        moving = program.worker is not None and worker is not None and worker != program.worker
        if moving:
            self._let_in.pop(program.session_id, None)  # placed with room, or not ours
            program.moves += 1
            self.counters["moves"] += 1
            program.resident_prompt_tokens = 0  # its cache stays behind
            program.paused_prompt_tokens = 0
        with self.table.changing(program):
            program.worker = worker
        if moving:
            _step(d, EventKind.MOVED, program, worker, reason)

    def _evict_oldest_idle(self, d: Decisions) -> bool:
        """Remove the program idle the longest (O(log n) amortized); False if none is idle."""
        oldest = self.idle.oldest()
        if oldest is None:
            return False
        self._drop(oldest, d, EventKind.EVICTED, "max_tracked_requests")
        self.counters["evicted"] += 1
        d.removed.append(oldest.session_id)
        return True

    def _drop(self, program: Program, d: Decisions, kind: EventKind, reason: str) -> None:
        """Remove ``program`` from the table and from every index that names it."""
        worker = program.worker
        self.table.remove(program)
        self._deferred.pop(program.session_id, None)
        self._let_in.pop(program.session_id, None)
        self.idle.forget(program.session_id)
        _step(d, kind, program, worker, reason)

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
            if program.yielded:
                continue  # it holds no room: pausing it would only make its next turn wait
            self._pause(program, now, d, idle=True)
            paused = True
            if need is not None and self.planner.place(self.table, self.capacity,
                                                       need) is not None:
                break
        return paused

    def _reject(self, d: Decisions, request_id: str, limit: RejectLimit,
                reason: str) -> Decisions:
        self.counters["rejected"] += 1
        d.rejected.append(Reject(request_id, reason, limit))
        return d

    # ---- lifecycle events ------------------------------------------------------
    def sent(self, request_id: str, worker: WorkerKey, now: float) -> Decisions:
        """The request reached ``worker``: the program now lives where it was served."""
        d = Decisions()
        request = self.table.requests.get(request_id)
        if request is None or request.state is not RequestState.RELEASED:
            return d  # unknown, finished or never admitted: nothing to learn
        program = self.table.programs[request.session_id]
        if program.current == request_id and program.worker != worker:
            self._move(program, worker, d, "served_elsewhere")
            # What it expected is on the other worker/rank.
            request.expected_cached = request.expected_after_pause = 0
        return d

    def responding(self, request_id: str, now: float) -> Decisions:
        request = self.table.requests.get(request_id)
        if request is not None and request.state is RequestState.RELEASED:
            self.table.programs[request.session_id].last_active = now
        return Decisions()

    def completed(self, request_id: str, context_tokens: int, now: float,
                  cached_tokens: int | None = None) -> Decisions:
        """The turn finished with ``context_tokens`` (prompt + generated) in the cache;
        ``cached_tokens``: of its prompt, what the engine found cached (if it said)."""
        d = Decisions()
        request = self.table.requests.get(request_id)
        if request is None or request.state is not RequestState.RELEASED:
            return d
        del self.table.requests[request_id]
        self._released -= 1
        program = self.table.programs[request.session_id]
        # A rank that has left (its worker drained this turn after set_workers forgot its
        # meters) is not measured again: its meters would outlive it for ever.
        if (cached_tokens is not None and program.worker is not None
                and program.worker in self.capacity.known):
            if request.expected_cached:
                self.cache_loss.observe(program.worker, request.expected_cached, cached_tokens)
                self._forget_kept_if_losing(program.worker)
            if request.expected_after_pause:
                # A prompt shared with programs that stayed (a system prompt) is found
                # whether or not the pause kept anything: only the program's own part says.
                shared = min(self.table.shared_prefix_tokens(program),
                             request.expected_after_pause)
                self.resume_loss.observe(program.worker, request.expected_after_pause - shared,
                                         cached_tokens - shared)
        # Its prompt is cached where it ran; a turn that finished after a tick unassigned its
        # worker (the worker left, draining) left it nowhere the program will run again.
        program.resident_prompt_tokens = request.input_tokens if program.worker else 0
        program.current = None
        program.steps += 1
        program.last_active = now
        with self.table.changing(program):
            program.tokens = max(0, context_tokens)
            self._to_acting(program, now)
        self._pause_if_marked(program, now, d)  # its tool boundary
        self._advance(program, now, d)
        self._room_appeared(now, d)
        return d

    def aborted(self, request_id: str, now: float) -> Decisions:
        """The request ended without completing (error, disconnect, cancelled wait)."""
        d = Decisions()
        request = self.table.requests.pop(request_id, None)
        if request is None:
            return d
        if request.state is RequestState.RELEASED:
            self._released -= 1
        program = self.table.programs[request.session_id]
        if program.final_request == request_id:
            program.final_request = None
            return d
        if program.current != request_id:
            program.waiting.remove(request_id)
            return d
        program.current = None
        # A turn queued behind a waiting one that is given up inherits its wait: the bound
        # on waits (resume_timeout_seconds) and the aging order count from the earlier.
        carried = (program.deferred_since
                   if request.state is RequestState.DEFERRED and program.waiting else None)
        program.deferred_since = None
        self._deferred.pop(program.session_id, None)
        if request.created_program and program.is_new and not program.busy:
            self._drop(program, d, EventKind.ENDED, "rolled_back")  # it never ran
            d.removed.append(program.session_id)
            self._room_appeared(now, d)
            return d
        program.last_active = now
        prior = request.prior
        with self.table.changing(program):
            if prior is not None:  # the aborted turn left nothing in the cache
                program.tokens = prior.tokens
                program.prefix = prior.prefix
                if prior.worker is not None and self.capacity.is_live(prior.worker):
                    if prior.worker != program.worker:  # a move at its release undone:
                        self._let_in.pop(program.session_id, None)  # let in elsewhere
                    program.worker = prior.worker  # where its cache is
                    # ... and what it expected there, which its release (and a move made
                    # then) cleared; a pause or a lost worker since rewrote the snapshot.
                    program.resident_prompt_tokens = prior.resident_prompt_tokens
                    program.paused_prompt_tokens = prior.paused_prompt_tokens
            self._to_acting(program, now)  # after: a yield clears what it expects
            if prior is not None and prior.acting_since is not None:
                program.acting_since = prior.acting_since
        self._pause_if_marked(program, now, d)
        program.deferred_since = carried
        self._advance(program, now, d)
        self._room_appeared(now, d)
        return d

    # ---- traffic no program owns ------------------------------------------------
    def sessionless_started(self, request_id: str, worker: WorkerKey, tokens: int,
                            now: float) -> Decisions:
        """A request without a session id is running on ``worker`` with ``tokens`` prompt
        tokens. With ``sessionless_kv: reserve`` its rank's capacity is that much less
        until :meth:`sessionless_ended` (the pause rule acts on it at the next tick).
        Beyond max_tracked_requests such requests are counted, not followed."""
        if tokens <= 0 or request_id in self.sessionless:
            return Decisions()
        if self.sessionless.started(request_id, worker, tokens,
                                    self.params.max_tracked_requests):
            self._reserve(worker)
        else:
            self.counters["sessionless_untracked"] += 1
        return Decisions()

    def sessionless_ended(self, request_id: str, now: float) -> Decisions:
        """That request ended (any way): its room is back, and waiting programs may use
        it at once (``resume_on_events``). Unknown ids are ignored."""
        d = Decisions()
        worker = self.sessionless.ended(request_id)
        if worker is None:
            return d
        self._reserve(worker)
        if self.params.sessionless_kv == "reserve":
            self._room_appeared(now, d)
        return d

    @property
    def sessionless_tokens(self) -> Mapping[WorkerKey, int]:
        """Prompt tokens of the requests without a session id running now, per rank."""
        return self.sessionless.tokens

    def _reserve(self, worker: WorkerKey) -> None:
        """Take what sessionless requests hold on ``worker`` off its capacity, as far as
        the policy says (``sessionless_kv``, ``sessionless_kv_full_loss``)."""
        self.capacity.reserve(worker, self.sessionless.reserved(
            worker, self.params.sessionless_kv, self.params.sessionless_kv_full_loss,
            self.cache_loss.loss_ratio(worker)))

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
            self._drop(program, d, EventKind.ENDED, "session_final")
            d.removed.append(program.session_id)
            d.released.append(Release(final, None, session_final=True))
        else:
            self.idle.went_idle(program, now)

    def _room_appeared(self, now: float, d: Decisions) -> None:
        """Event-driven resume (``resume_on_events``); the tick stays the backstop."""
        if self.params.resume_on_events and self.table.any_paused:
            self.resume_waiting(now, d)

    # ---- pause / resume --------------------------------------------------------
    def _pause(self, program: Program, now: float, d: Decisions, *, idle: bool = False,
               aging: bool = False) -> None:
        """Pause ``program``; ``idle``: it is dormant and gives way (counted apart);
        ``aging``: it gives way to a turn that waited ``max_wait_seconds``."""
        if idle:
            reason = PauseReason.IDLE
        elif aging or program.marked_for_aged:
            reason = PauseReason.AGING
        elif program.marked_for_pause:
            reason = PauseReason.TOOL_BOUNDARY
        elif program.current is not None:
            reason = PauseReason.NO_ROOM
        else:
            reason = PauseReason.PRESSURE
        with self.table.changing(program):
            program.lifecycle = Lifecycle.PAUSED
        self._let_in.pop(program.session_id, None)
        # What it leaves cached: whether it finds that again when it resumes here says
        # whether the pause saved anything (pause_min_resume_loss).
        if program.resident_prompt_tokens:
            program.paused_prompt_tokens = program.resident_prompt_tokens
        program.resident_prompt_tokens = 0  # the engine may now evict it
        self._expected_since(program)
        program.marked_for_pause = program.marked_for_aged = False
        program.active_since = None
        program.pauses += 1
        self.counters["idle_pauses" if idle else "pauses"] += 1
        if program.current is not None:
            self._deferred[program.session_id] = program
        d.paused.append(program.session_id)
        _step(d, EventKind.PAUSED, program, program.worker, reason.value)

    def _expected_since(self, program: Program) -> None:
        """What ``program`` expects cached changed while its turn is out (a pause, its
        worker gone): an abort of that turn restores this, not what held before it."""
        request = None if program.current is None else self.table.requests.get(program.current)
        if request is not None and request.prior is not None:
            request.prior = replace(request.prior,
                                    resident_prompt_tokens=program.resident_prompt_tokens,
                                    paused_prompt_tokens=program.paused_prompt_tokens)

    def _resume(self, program: Program, worker: WorkerKey | None, now: float,
                d: Decisions, *, forced: bool = False, evicting: bool = False) -> None:
        """Resume ``program`` on ``worker`` (None: where it was); ``forced``: its turn waited
        past resume_timeout; ``evicting``: released without room, its rank evicting anyway
        (``hold_max_cache_loss``)."""
        waited = 0.0 if program.deferred_since is None else now - program.deferred_since
        reason = "resume_timeout" if forced else "evicting" if evicting else "room"
        _step(d, EventKind.FORCED if forced else EventKind.RESUMED, program,
              worker if worker is not None else program.worker, reason, waited)
        if worker is not None and worker != program.worker:
            self._move(program, worker, d, "resume")
        with self.table.changing(program):
            program.lifecycle = Lifecycle.ACTIVE
        self._deferred.pop(program.session_id, None)
        if evicting:
            self._let_in[program.session_id] = program
        program.active_since = now
        program.resumes += 1
        self.counters["resumes"] += 1
        d.resumed.append((program.session_id, worker))
        if program.current is not None:
            request = self.table.requests[program.current]
            if request.state is RequestState.DEFERRED:
                self._release(program, request, worker, now, d, resumed=True)

    def resume_waiting(self, now: float, d: Decisions | None = None) -> Decisions:
        """Resume paused programs into the room below the resume level (the planner's
        plan, see :mod:`dynamo_thunderagent.resume`).

        Callable from the tick and from events (a completion or an abort frees room).
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
        plan = self.planner.plan(paused, self.table, self.capacity, now, self.batch,
                                 self.evicting_anyway())
        for resumption in plan.resumptions:
            if resumption.released_evicting:
                self.counters["released_evicting"] += 1
            if resumption.price_seconds:
                self.counters["priced_moves"] += 1
                self.counters["move_price_ms"] += round(resumption.price_seconds * 1e3)
            self._resume(resumption.program, resumption.worker, now, d,
                         evicting=resumption.released_evicting)
        self.counters["held_home"] += len(plan.held_home)
        return d

    def evicting_anyway(self) -> frozenset[WorkerKey]:
        """Ranks where holding a turn back keeps no cache: their programs hold more than
        the capacity, and the engine either evicts whatever is held back (it lost at least
        ``hold_max_cache_loss`` of what continuing turns expected cached there; with
        ``hold_excludes_let_in``, the overfill is counted without those let in without
        room, :meth:`let_in_usage`) or keeps it anyway (``pause_min_resume_loss``,
        :meth:`keeps_paused`: no pause drains such a rank, so nothing is left out)."""
        limit = self.params.hold_max_cache_loss
        if limit is None and self.params.pause_min_resume_loss is None:
            return frozenset()
        usage = self.table.usage_by_rank
        own = self.let_in_usage() if self.params.hold_excludes_let_in else {}
        return frozenset(
            worker for worker, cap in self.capacity.known.items()
            if ((limit is not None and usage.get(worker, 0.0) - own.get(worker, 0.0) > cap
                 and (loss := self.cache_loss.loss_ratio(worker)) is not None
                 and loss >= limit)
                or (usage.get(worker, 0.0) > cap and self.keeps_paused(worker))))

    def let_in_usage(self) -> dict[WorkerKey, float]:
        """Per rank, what the programs resumed there without room hold (the pressure
        side's charge), until they pause again, move or leave: an overfill of our own
        making. Counting it would keep a rank "evicting anyway" because of the turns that
        judgement let in, and the pause rule could never drain it (short tool calls: each
        pause is undone by the next release)."""
        own: dict[WorkerKey, float] = {}
        model, table = self.usage_model, self.table
        for program in self._let_in.values():
            if program.worker is not None:
                # Its marginal charge: a prefix another program there holds too is
                # credited once in the rank's usage (shared_prefix_accounting).
                shared = model.weight(program) * table.shared_prefix_tokens(program)
                own[program.worker] = (own.get(program.worker, 0.0)
                                       + max(0.0, model.charge(program) - shared))
        return own

    def relief(self, worker: WorkerKey, now: float) -> str:
        """Whether the pause rule pauses on ``worker`` now, and if not why
        (``pressure.RELIEF``)."""
        return self.pause_rule.relief(self.table, self.capacity, worker, now, self.batch)

    def keeps_paused(self, worker: WorkerKey) -> bool:
        """Whether ``worker``'s engine keeps what a pause there would save
        (``pause_min_resume_loss``; False without it)."""
        limit = self.params.pause_min_resume_loss
        return limit is not None and keeps_paused(self.resume_loss, self.cache_loss, worker,
                                                  limit, KEEPS_PAUSED_MIN_RESUMES)

    def _forget_kept_if_losing(self, worker: WorkerKey) -> None:
        """Continuing turns on ``worker`` now lose at least ``pause_min_resume_loss`` (its
        host tier is full, say): what paused programs found there before says nothing
        about now, so the rank needs fresh resumes before it is judged to keep them again
        (otherwise the old verdict would come back as soon as that loss dipped)."""
        limit = self.params.pause_min_resume_loss
        loss = self.cache_loss.loss_ratio(worker)
        if limit is not None and loss is not None and loss >= limit:
            self.resume_loss.forget(worker)

    # ---- the tick --------------------------------------------------------------
    def tick(self, now: float) -> Decisions:
        """One scheduler pass: expire, unassign, resume (and, with ``aging_makes_room``,
        make room for turns waiting too long and resume into it), force overdue, relieve
        pressure."""
        d = Decisions()
        self._sweep(now, d)
        self._set_hold()
        if self.params.sessionless_kv_full_loss is not None:
            for worker in self.sessionless.tokens:  # the engine's loss moved since
                self._reserve(worker)
        self.idle.find_dormant(now)
        self.resume_waiting(now, d)
        if self._make_room_for_aged(now, d):
            self.resume_waiting(now, d)  # into the room just made
        self._force_overdue(now, d)
        self._relieve_pressure(now, d)
        return d

    def _sweep(self, now: float, d: Decisions) -> None:
        """Expire idle programs past retention; drop assignments to workers (or ranks) that
        left.

        One pass over the table (it is the only O(programs) step of a tick).
        """
        retention = self.params.session_retention_seconds
        held = 0
        for program in list(self.table.programs.values()):
            if not program.busy and now - program.last_active >= retention:
                self._drop(program, d, EventKind.EXPIRED, "session_retention")
                self.counters["expired"] += 1
                d.expired.append(program.session_id)
                continue
            if program.worker is not None and not self.capacity.is_live(program.worker):
                self._let_in.pop(program.session_id, None)
                with self.table.changing(program):
                    program.worker = None
                # Its cache left with the worker: nothing is expected anywhere else.
                program.resident_prompt_tokens = program.paused_prompt_tokens = 0
                self._expected_since(program)
                d.unassigned.append(program.session_id)
            held += program.tokens
        self._set_host_spare(held)

    def _set_host_spare(self, held: int) -> None:
        """The host tier's spare room, with programs holding ``held`` tokens (no tier:
        nothing to do)."""
        if self.host_tier is not None:
            capacity = self.capacity
            # The GPU pools' room for programs: what sessionless traffic holds is not theirs.
            self.host_tier.set_spare(capacity.tier_tokens(self.params.host_kv_blocks),
                                     sum(capacity.known.values()), held)

    def _set_hold(self) -> None:
        """The hold of ``acting_hold_factor`` and the yield horizon of
        ``acting_yield_factor``: that many times the time the engine takes to re-prefill a
        mean worker/rank's whole pool (the hold 0, the horizon None, until the cost is
        measured)."""
        hold, yield_ = self.params.acting_hold_factor, self.params.acting_yield_factor
        known = self.capacity.known
        refill = (self.costs.stall_seconds(round(self.capacity.total / len(known)), 1.0)
                  if (hold or yield_) and known else None)
        self.usage_model.hold_seconds = 0.0 if hold is None or refill is None else hold * refill
        self.yield_horizon = None if yield_ is None or refill is None else yield_ * refill

    def _yields(self, program: Program) -> bool:
        """Whether ``program``, now at its tool boundary, is expected back later than the
        yield horizon (twice its smoothed gap past it): it then yields its room."""
        horizon = self.yield_horizon
        if horizon is None or program.lifecycle is not Lifecycle.ACTIVE:
            return False  # off, unmeasured, or paused (its turn never ran: no boundary)
        if program.waiting or program.final_request is not None:
            return False  # its next request is already here: no tool to wait for
        return program.expected_back_within(horizon) is False  # None: no gap history yet

    def _pause_if_marked(self, program: Program, now: float, d: Decisions) -> None:
        """A program marked for pause pauses at its tool boundary, unless it just yielded
        its room (that frees what the mark was for, and its next turn need not wait) or
        it was marked for turns that waited ``max_wait_seconds``, none waits any more
        (let in another way, or gone) and its rank is not over its pause threshold:
        nobody is paused for a turn no longer there. (Over the threshold the mark stands
        as the pause rule's own: the rule counted it as gone and marked nobody else.)"""
        if not program.marked_for_pause:
            return
        if program.yielded:
            program.marked_for_pause = program.marked_for_aged = False
            return
        if program.worker is not None and self.keeps_paused(program.worker):
            # Marked before its rank was seen to keep paused programs: the pause would
            # save nothing there now.
            program.marked_for_pause = program.marked_for_aged = False
            return
        if program.marked_for_aged and not any(
                self.planner.aged(p, now) for p in self._deferred.values()):
            program.marked_for_aged = False
            worker = program.worker
            if worker is None or not self.pause_rule.over_threshold(
                    self.table, self.capacity, worker, now):
                program.marked_for_pause = False
                self.counters["aging_marks_cleared"] += 1
                return
        self._pause(program, now, d)

    def _to_acting(self, program: Program, now: float) -> None:
        """Its turn ended: ACTING from ``now``, yielding its room if expected back late.
        Call inside ``table.changing(program)``."""
        program.phase = Phase.ACTING
        program.acting_since = now
        program.yielded = self._yields(program)
        if program.yielded:
            program.resident_prompt_tokens = 0  # the engine may evict it: nothing expected
            self.counters["yields"] += 1

    def _make_room_for_aged(self, now: float, d: Decisions) -> bool:
        """``aging_makes_room``, after a resume pass: room for the turns it left waiting
        that have waited ``max_wait_seconds``, on the ranks the planner books for them
        (:meth:`~dynamo_thunderagent.resume.ResumePlanner.aged_room`). The pause rule
        pauses and marks programs there until the turn fits below the resume level. True
        if a program was paused or marked."""
        if not self.params.aging_makes_room or not self._deferred or not self.capacity.known:
            return False
        acted = False
        for worker, room in self.planner.aged_room(self._deferred.values(), self.table,
                                                   self.capacity, now):
            plan = self.pause_rule.make_room(self.table, worker, room, now, self.batch)
            for victim in plan.pause:
                self.counters["aging_pauses"] += 1
                self._pause(victim, now, d, aging=True)
            for victim in plan.mark:
                self.counters["aging_marks"] += 1
                victim.marked_for_pause = victim.marked_for_aged = True
                d.marked.append(victim.session_id)
            acted = acted or bool(plan.pause or plan.mark)
        return acted

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
            worker = self.planner.most_room(self.table, self.capacity, now, program.tokens)
            self.counters["forced_resumes"] += 1
            d.forced.append(program.session_id)
            self._resume(program, worker, now, d, forced=True)

    def _relieve_pressure(self, now: float, d: Decisions) -> None:
        """Dormant programs give way first; then the pause rule pauses ACTING programs of
        each over-threshold rank and marks REASONING ones (see
        :mod:`dynamo_thunderagent.pressure`)."""
        threshold = self.params.pause_threshold
        if self.idle.dormant and any(self.table.usage(w) > c * threshold
                                     for w, c in self.capacity.known.items()):
            self._reclaim_dormant(now, d)
        plan = self.pause_rule.plan(self.table, self.capacity, now, self.batch)
        for program in plan.pause:
            self._pause(program, now, d)
        for program in plan.mark:
            program.marked_for_pause = True
            d.marked.append(program.session_id)

    # ---- introspection ---------------------------------------------------------
    @property
    def waiting_turns(self) -> Iterable[Program]:
        """The paused programs whose turn waits for room (read only)."""
        return self._deferred.values()

    def snapshot(self, now: float) -> dict[str, object]:
        """Plain-data view of the state, for the router's /state and for tests."""
        return scheduler_snapshot(self, now)


def _step(d: Decisions, kind: EventKind, program: Program, worker: WorkerKey | None,
          reason: str, wait: float = 0.0) -> None:
    """Record why ``program`` changed (``Decisions.steps``), as the step is taken."""
    d.steps.append(ProgramEvent(kind, program.session_id, worker, program.tokens, reason, wait))


def _usage_model(params: ThunderAgentParameters) -> UsageModel:
    return UsageModel(
        acting_token_weight=params.acting_token_weight,
        acting_decay_tau_seconds=params.acting_decay_tau_seconds,
        buffer_per_program=params.buffer_per_program,
    )
