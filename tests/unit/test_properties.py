"""Invariants of the scheduler core over random event orders (hypothesis).

The state machine plays two parts: the *client* (the shell and the agents
behind it), which knows only what the scheduler told it (which requests were
released or rejected) and which events it sent back; and the *checker*, which
looks inside the program table after every step. The client behaves like a
real one, but with every interleaving the network allows: turns of the same
session overlap, completions and aborts arrive in any order, workers come and
go, capacity changes under running programs, and stale events for requests
that ended long ago still arrive.

Time moves only through the fake clock. While a worker is live the clock moves
in steps of at most one scheduler interval with a tick after each step, as the
shell does; while no worker is live the clock may jump (a cluster that is
restarting), which is when the deferral bound does not apply.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dynamo_thunderagent.capacity import CapacityCard, UsageModel
from dynamo_thunderagent.classifier import (
    AdmissionRejected,
    ClassifyRequest,
    ThunderAgentClassifier,
)
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import (
    Lifecycle,
    Phase,
    PrefixBlocks,
    Program,
    RequestState,
    WorkerKey,
)
from dynamo_thunderagent.program_table import ProgramTable
from dynamo_thunderagent.scheduler import Decisions, Scheduler
from dynamo_thunderagent.selector import ThunderAgentSelector, WorkerLoad

MAX_TRACKED = 8
SESSIONS = tuple(f"s{i}" for i in range(MAX_TRACKED + 2))  # more sessions than the bound
WORKER_IDS = (1, 2, 3)
RANKS = tuple(WorkerKey(w, r) for w in WORKER_IDS for r in (0, 1))
INTERVAL = 5.0
TIMEOUT = 30.0
RETENTION = 60.0
TOLERANCE = 1e-6

# A few parameter sets: the parity defaults scaled down, a heavy per-program
# buffer, and a light ACTING weight with a fast decay.
PARAMETER_SETS = [
    dict(buffer_per_program=10, acting_token_weight=1.0, acting_decay_tau_seconds=1.0),
    dict(buffer_per_program=100, acting_token_weight=1.0, acting_decay_tau_seconds=5.0),
    dict(buffer_per_program=0, acting_token_weight=0.5, acting_decay_tau_seconds=0.5,
         pause_threshold=0.8, pause_target=0.5, resume_hysteresis=0.3),
    # The extensions (policies/thunderagent-extended.yaml), in two mixes.
    dict(buffer_per_program=10, resume_on_events=True, resume_affinity=True,
         max_wait_seconds=12.0, shared_prefix_accounting=True),
    dict(buffer_per_program=20, acting_token_weight=0.7, pressure_decay=True,
         pause_order="longest_idle", min_residency_seconds=7.0, resume_on_events=True,
         shared_prefix_accounting=True),
    # Idle horizons (dormant programs give way first), with and without event resume.
    dict(buffer_per_program=10, resume_on_events=True, resume_affinity=True,
         idle_horizon_factor=2.0, idle_horizon_min_seconds=0.5, max_turns_per_session=3),
    dict(buffer_per_program=30, idle_horizon_factor=1.0, idle_horizon_min_seconds=0.0,
         min_residency_seconds=3.0, placement="least_busy"),
    # Priced by measured costs (engine_costs_measured): pauses that pay, the hold, and
    # programs that yield their room at a tool boundary.
    dict(buffer_per_program=10, pause_min_recompute_ratio=0.0, acting_yield_factor=1.0,
         acting_hold_factor=0.5, resume_on_events=True, shared_prefix_accounting=True,
         price_moves=True, resume_affinity=True),
    dict(buffer_per_program=0, pause_min_recompute_ratio=1.0, acting_yield_factor=0.2,
         pressure_decay=True, idle_horizon_factor=2.0, max_wait_seconds=12.0),
    # Turns held back only where holding keeps a cache (engine_cache_loss_seen).
    dict(buffer_per_program=10, hold_max_cache_loss=0.5, resume_on_events=True,
         resume_affinity=True, price_moves=True, pause_min_recompute_ratio=0.0,
         idle_horizon_factor=2.0, pause_min_cache_loss=0.2),
    # ... judged without the programs let in that way (hold_excludes_let_in, off by default).
    dict(buffer_per_program=10, hold_max_cache_loss=0.5, hold_excludes_let_in=True,
         resume_on_events=True, resume_affinity=True, price_moves=True),
    # Aging makes room: a turn waiting past max_wait_seconds pauses programs of its rank.
    dict(buffer_per_program=10, max_wait_seconds=12.0, aging_makes_room=True,
         resume_on_events=True, resume_affinity=True, min_residency_seconds=2.0),
    # A session's parallel turns run alongside its running one (untracked).
    dict(buffer_per_program=10, concurrent_turns="alongside", resume_on_events=True,
         max_turns_per_session=3, placement="least_busy"),
    # Requests without a session id take room off their rank while they run.
    dict(buffer_per_program=10, sessionless_kv="reserve", resume_on_events=True,
         resume_affinity=True, max_wait_seconds=12.0, aging_makes_room=True),
    # ... as far as the engine loses programs' caches there (the extended policy's way).
    dict(buffer_per_program=10, sessionless_kv="reserve", sessionless_kv_full_loss=0.1,
         resume_on_events=True, resume_affinity=True, hold_max_cache_loss=0.5),
    # The upstream proxy's pause rule, kept for comparison.
    dict(buffer_per_program=10, pause_rule="upstream", shared_prefix_accounting=True),
    # A program sharing its rank leaves for an empty one; a shared prompt's window cut short.
    dict(buffer_per_program=10, leave_for_empty_rank=True, resume_on_events=True,
         shared_prefix_accounting=True, shared_prefix_max_blocks=2),
    # A host tier behind each rank, and pauses only where paused programs lose their cache.
    dict(buffer_per_program=10, host_kv_blocks=20, pause_min_recompute_ratio=0.0,
         pause_min_resume_loss=0.3, hold_max_cache_loss=0.5, resume_on_events=True,
         resume_affinity=True),
    # Tool time as information: pause first those expected back latest.
    dict(buffer_per_program=20, pause_order="expected_return", idle_horizon_factor=2.0,
         idle_horizon_min_seconds=0.0, acting_hold_factor=0.5, pause_min_recompute_ratio=0.0,
         shared_prefix_accounting=True, acting_token_weight=0.6),
]
PREFIX_BLOCK_TOKENS = 8

small_cards = st.builds(CapacityCard, total_kv_blocks=st.integers(0, 40),
                        block_size=st.sampled_from([8, 16]))
cards_strategy = st.dictionaries(st.sampled_from(RANKS), small_cards)


@dataclass
class Submitted:
    """What the client remembers about one of its requests."""

    request_id: str
    session_id: str
    input_tokens: int
    final: bool
    at: float


def _decayed_recount(table: Any, model: Any, rank: WorkerKey, now: float) -> float:
    """Usage of ``rank`` with each program at its weight ``now``, less the duplicates of
    its shared prefix hashes at the average weight of the tokens their holders share."""
    members = [p for p in table.programs.values()
               if p.lifecycle is Lifecycle.ACTIVE and p.worker == rank]
    usage = sum(model.weight(p, now) * p.tokens + model.buffer_per_program for p in members)
    charged = [p for p in members if not (p.yielded and p.phase is Phase.ACTING)]
    keys = {p.session_id: [(size, h) for size, hashes in p.prefix.groups() for h in hashes]
            for p in charged}
    holders = Counter(key for held in keys.values() for key in held)
    duplicates = sum((k - 1) * size for (size, _), k in holders.items())
    if not duplicates:
        return usage
    shared = {p.session_id: sum(size for size, h in keys[p.session_id] if holders[(size, h)] >= 2)
              for p in charged}
    weighted = sum(model.weight(p, now) * shared[p.session_id] for p in charged)
    return usage - duplicates * weighted / sum(shared.values())


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.ids = itertools.count()
        self.live: frozenset[int] = frozenset()
        self.cards: dict[WorkerKey, CapacityCard] = {}
        self.live_since: float | None = None  # start of the current stretch with a live worker
        # The client's view.
        self.pending: dict[str, Submitted] = {}  # submitted, no answer yet
        self.released: dict[str, Submitted] = {}  # released turns not yet finished
        self.outcome: dict[str, str] = {}  # terminal outcome of every finished request
        self.deferred_at: dict[str, float] = {}  # when the checker first saw it DEFERRED
        # Requests without a session id running now, as the scheduler should follow them.
        self.sessionless: dict[str, tuple[WorkerKey, int]] = {}
        self.seen_deferred = False
        self.steps = 0
        self.seen_marked = False
        self.seen_sessionless = False  # room was reserved for sessionless traffic

    # ---- setup -----------------------------------------------------------------
    @initialize(params=st.sampled_from(PARAMETER_SETS),
                live=st.frozensets(st.sampled_from(WORKER_IDS), min_size=1),
                cards=st.dictionaries(st.sampled_from(RANKS), small_cards, min_size=1),
                prefill=st.sampled_from([None, 1e-3, 1e-2]))
    def start(self, params: dict[str, Any], live: frozenset[int],
              cards: dict[WorkerKey, CapacityCard], prefill: float | None) -> None:
        # Most runs start with a small live cluster, so that pressure, pausing
        # and resuming happen within a few dozen steps.
        self.params = ThunderAgentParameters(
            resume_timeout_seconds=TIMEOUT,
            session_retention_seconds=RETENTION,
            scheduler_interval_seconds=INTERVAL,
            max_tracked_requests=MAX_TRACKED,
            **params,
        )
        self.scheduler = Scheduler(self.params)
        self.set_workers(live, cards)
        if prefill is not None:  # the engine's costs known from the start (the shell's meter)
            self.engine_costs_measured(prefill)
            self.tick()

    @property
    def table(self) -> ProgramTable:
        return self.scheduler.table

    # ---- the client's bookkeeping --------------------------------------------------
    def absorb(self, d: Decisions, submitted: str | None = None) -> None:
        """Apply one call's decisions to the client's view, checking each one."""
        for release in d.released:
            rid = release.request_id
            assert rid not in self.released, f"{rid} released twice"
            assert rid not in self.outcome, f"{rid} released after it ended ({self.outcome[rid]})"
            assert rid in self.pending, f"release of a request nobody waits for: {rid}"
            sub = self.pending.pop(rid)
            assert release.session_final == sub.final, f"{rid}: session_final flag mismatch"
            if release.worker is not None:
                assert self.scheduler.capacity.is_live(release.worker), (
                    f"{rid} released to {release.worker}, which is not live")
            self.deferred_at.pop(rid, None)
            if sub.final:
                self.outcome[rid] = "final-released"
                assert release.worker is None
            elif not release.tracked:
                # concurrent_turns: alongside: a turn sent while its session's turn runs
                # goes at once, where that turn runs, and the scheduler keeps nothing.
                assert self.params.concurrent_turns == "alongside"
                assert rid not in self.table.requests
                program = self.table.programs.get(sub.session_id)
                assert program is not None and release.worker in (None, program.worker)
                self.outcome[rid] = "alongside"
            else:
                self.released[rid] = sub
        for reject in d.rejected:
            rid = reject.request_id
            assert rid == submitted, f"{rid} rejected outside its own submit"
            assert reject.reason
            self.pending.pop(rid)
            self.outcome[rid] = "rejected"

    def submit(self, session: str, tokens: int, *, final: bool) -> str:
        rid = f"r{next(self.ids)}"
        self.pending[rid] = Submitted(rid, session, tokens, final, self.now)
        # Every prompt starts with the same 3-hash system prompt, then a hash of its own
        # session, as far as its length allows: one block each, or (odd lengths, as
        # after a policy reload) spans doubling every two hashes.
        levels = 2 if tokens % 2 else 0
        ends = (8, 16, 32, 48) if levels else (8, 16, 24, 32)
        blocks = (1, 2, 3, hash(session))[: sum(1 for end in ends if end <= tokens)]
        d = self.scheduler.submit(rid, session, tokens, self.now, session_final=final,
                                  prefix=PrefixBlocks(blocks, PREFIX_BLOCK_TOKENS, levels))
        self.absorb(d, submitted=rid)
        return rid

    def pick(self, data: st.DataObject, pool: dict[str, Submitted]) -> str:
        return data.draw(st.sampled_from(sorted(pool)))

    def tick(self) -> None:
        d = self.scheduler.tick(self.now)
        self.seen_marked = self.seen_marked or bool(d.marked)
        self.absorb(d)
        self.observe()
        self.check_after_tick()

    def set_workers(self, live: frozenset[int], cards: dict[WorkerKey, CapacityCard]) -> None:
        if live and not self.live:
            self.live_since = self.now
        elif not live:
            self.live_since = None
        self.live, self.cards = live, dict(cards)
        if hasattr(self, "pending"):
            self.observe()
        self.absorb(self.scheduler.set_workers(live, dict(cards), self.now))

    def observe(self) -> None:
        """Note when each request was first seen deferred (the deferral clock)."""
        for rid, request in self.table.requests.items():
            if request.state is RequestState.DEFERRED:
                self.deferred_at.setdefault(rid, self.now)
                self.seen_deferred = True
            else:
                self.deferred_at.pop(rid, None)

    # ---- rules: requests -----------------------------------------------------------
    @rule(session=st.sampled_from(SESSIONS), tokens=st.integers(0, 400))
    def new_turn(self, session: str, tokens: int) -> None:
        self.submit(session, tokens, final=False)

    @rule(sessions=st.lists(st.sampled_from(SESSIONS), min_size=2, max_size=6, unique=True),
          tokens=st.lists(st.integers(0, 300), min_size=6, max_size=6))
    def burst_of_new_turns(self, sessions: list[str], tokens: list[int]) -> None:
        """Many agents start (or continue) at the same instant, as in an RL rollout."""
        for session, size in zip(sessions, tokens, strict=False):
            self.submit(session, size, final=False)

    @precondition(lambda self: self.released)
    @rule(data=st.data(), generated=st.integers(0, 200), tool_output=st.integers(0, 100),
          go_on=st.booleans(), tool_seconds=st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    def agent_step(self, data: st.DataObject, generated: int, tool_output: int,
                   go_on: bool, tool_seconds: float) -> None:
        """A turn completes and the agent (maybe) sends its next, longer turn after its
        tool ran ``tool_seconds`` (so that programs build a gap history)."""
        rid = self.pick(data, self.released)
        sub = self.released.pop(rid)
        context = sub.input_tokens + generated
        self.outcome[rid] = "completed"
        self.absorb(self.scheduler.completed(rid, context, self.now))
        if go_on:
            self.now += tool_seconds
            self.submit(sub.session_id, context + tool_output, final=False)

    @rule(session=st.sampled_from(SESSIONS))
    def session_final(self, session: str) -> None:
        self.submit(session, 0, final=True)

    @precondition(lambda self: self.released)
    @rule(data=st.data(), generated=st.integers(0, 200))
    def complete(self, data: st.DataObject, generated: int) -> None:
        rid = self.pick(data, self.released)
        sub = self.released.pop(rid)
        self.outcome[rid] = "completed"
        self.absorb(self.scheduler.completed(rid, sub.input_tokens + generated, self.now))
        assert rid not in self.table.requests

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def abort_released(self, data: st.DataObject) -> None:
        rid = self.pick(data, self.released)
        self.released.pop(rid)
        self.outcome[rid] = "aborted"
        self.absorb(self.scheduler.aborted(rid, self.now))
        assert rid not in self.table.requests

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def give_up_waiting(self, data: st.DataObject) -> None:
        """The client stops waiting for a deferred/queued request (disconnect, timeout)."""
        rid = self.pick(data, self.pending)
        self.pending.pop(rid)
        self.deferred_at.pop(rid, None)
        self.outcome[rid] = "cancelled"
        self.absorb(self.scheduler.aborted(rid, self.now))
        assert rid not in self.table.requests

    @precondition(lambda self: self.released)
    @rule(data=st.data(), live_only=st.booleans())
    def sent(self, data: st.DataObject, live_only: bool) -> None:
        """The frontend reports where a released turn went; the worker may have left since."""
        rid = self.pick(data, self.released)
        ranks = [w for w in RANKS if w.worker_id in self.live] if live_only else list(RANKS)
        if not ranks:
            return
        worker = data.draw(st.sampled_from(ranks))
        d = self.scheduler.sent(rid, worker, self.now)
        assert not d.changed
        program = self.table.programs[self.released[rid].session_id]
        assert program.worker == worker, "a sent turn's program lives where it was served"

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def responding(self, data: st.DataObject) -> None:
        rid = self.pick(data, self.released)
        assert not self.scheduler.responding(rid, self.now).changed

    @rule(data=st.data(), kind=st.sampled_from(["sent", "responding", "completed", "aborted",
                                                 "cancel"]))
    def stale_event(self, data: st.DataObject, kind: str) -> None:
        """Events for requests that ended (or never existed) change nothing."""
        choices = [*sorted(self.outcome), "never-submitted"]
        rid = data.draw(st.sampled_from(choices))
        before = self.scheduler.snapshot(self.now)
        if kind == "sent":
            d = self.scheduler.sent(rid, RANKS[0], self.now)
        elif kind == "responding":
            d = self.scheduler.responding(rid, self.now)
        elif kind == "completed":
            d = self.scheduler.completed(rid, 10_000, self.now)
        elif kind == "aborted":
            d = self.scheduler.aborted(rid, self.now)
        else:
            d = self.scheduler.aborted(rid, self.now)
        assert not d.changed
        assert self.scheduler.snapshot(self.now) == before

    @precondition(lambda self: self.pending or self.released)
    @rule(data=st.data())
    def duplicate_request_id(self, data: st.DataObject) -> None:
        """A request id that is still in flight is refused without touching its original."""
        rid = data.draw(st.sampled_from(sorted([*self.pending, *self.released])))
        before = {k: (r.state, r.session_id) for k, r in self.table.requests.items()}
        d = self.scheduler.submit(rid, SESSIONS[0], 1, self.now)
        assert [r.request_id for r in d.rejected] == [rid] and not d.released
        assert {k: (r.state, r.session_id) for k, r in self.table.requests.items()} == before

    # ---- rules: workers and capacity ------------------------------------------------
    @rule(live=st.frozensets(st.sampled_from(WORKER_IDS)), cards=cards_strategy)
    def workers_change(self, live: frozenset[int], cards: dict[WorkerKey, CapacityCard]) -> None:
        self.set_workers(live, cards)

    @rule(rank=st.sampled_from(RANKS), blocks=st.integers(0, 40))
    def capacity_changes(self, rank: WorkerKey, blocks: int) -> None:
        cards = dict(self.cards)
        block_size = cards[rank].block_size if rank in cards else 16
        cards[rank] = CapacityCard(blocks, block_size)
        self.set_workers(self.live, cards)

    @rule(prefill=st.sampled_from([1e-4, 1e-3, 1e-2, 5e-2]))
    def engine_costs_measured(self, prefill: float) -> None:
        """The engine's costs as the shell measures them (the hold, the yield horizon and
        whether a pause pays follow them from the next tick)."""
        self.scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=prefill,
                                                 decode_seconds=1.0))

    @rule(rank=st.sampled_from(RANKS), lost=st.sampled_from([0.0, 0.3, 0.6, 1.0]))
    def engine_cache_loss_seen(self, rank: WorkerKey, lost: float) -> None:
        """A continuing turn's cache as the engine reports it (``hold_max_cache_loss`` and
        ``pause_min_cache_loss`` read the ratio from the next decision)."""
        self.scheduler.cache_loss.observe(rank, 1_000, round(1_000 * (1 - lost)))

    @rule(rank=st.sampled_from(RANKS), tokens=st.integers(0, 300),
          rid=st.sampled_from([f"chat-{k}" for k in range(MAX_TRACKED + 2)]))
    def sessionless_request_runs(self, rank: WorkerKey, tokens: int, rid: str) -> None:
        """A request without a session id starts running on ``rank`` (a repeated id is
        ignored while the first runs)."""
        d = self.scheduler.sessionless_started(rid, rank, tokens, self.now)
        self.absorb(d)
        if tokens > 0 and rid not in self.sessionless and len(self.sessionless) < MAX_TRACKED:
            self.sessionless[rid] = (rank, tokens)

    @rule(rid=st.sampled_from([f"chat-{k}" for k in range(MAX_TRACKED + 2)] + ["nobody"]))
    def sessionless_request_ends(self, rid: str) -> None:
        self.absorb(self.scheduler.sessionless_ended(rid, self.now))
        self.sessionless.pop(rid, None)

    # ---- rules: time ------------------------------------------------------------------
    @rule(params=st.sampled_from(PARAMETER_SETS))
    def reload_policy(self, params: dict[str, Any]) -> None:
        """A policy reload (SIGHUP) mid-run: new parameters, same programs and requests."""
        self.params = ThunderAgentParameters(
            resume_timeout_seconds=TIMEOUT, session_retention_seconds=RETENTION,
            scheduler_interval_seconds=INTERVAL, max_tracked_requests=MAX_TRACKED, **params)
        before = set(self.table.programs), set(self.table.requests)
        self.scheduler.reconfigure(self.params)
        assert (set(self.table.programs), set(self.table.requests)) == before

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5, INTERVAL]))
    def advance_and_tick(self, dt: float) -> None:
        self.now += dt
        self.tick()

    @rule(ticks=st.integers(1, 15))
    def many_ticks(self, ticks: int) -> None:
        """Long tool calls: a run of full intervals, past resume_timeout and retention."""
        for _ in range(ticks):
            self.now += INTERVAL
            self.tick()

    @precondition(lambda self: not self.live)
    @rule(dt=st.floats(0.1, 3 * RETENTION), tick=st.booleans())
    def time_passes_without_workers(self, dt: float, tick: bool) -> None:
        self.now += dt
        if tick:
            self.tick()

    # ---- the end ------------------------------------------------------------------------
    @rule()
    def end_everything(self) -> None:
        """Finish every request and end every session: nothing may be left behind."""
        while self.pending or self.released:
            for rid in sorted(self.pending):
                if rid in self.pending:  # an earlier call in this loop may have released it
                    self.pending.pop(rid)
                    self.deferred_at.pop(rid, None)
                    self.outcome[rid] = "cancelled"
                    self.absorb(self.scheduler.aborted(rid, self.now))
            for rid in sorted(self.released):
                sub = self.released.pop(rid)
                self.outcome[rid] = "completed"
                self.absorb(self.scheduler.completed(rid, sub.input_tokens, self.now))
        for rid in sorted(self.sessionless):
            self.absorb(self.scheduler.sessionless_ended(rid, self.now))
        self.sessionless.clear()
        assert self.scheduler.snapshot(self.now)["sessionless_tokens"] == {}
        for session in SESSIONS:
            rid = self.submit(session, 0, final=True)
            assert self.outcome.get(rid) == "final-released", f"final of {session} not released"
        self.tick()
        table = self.table
        assert not table.programs, f"programs left: {sorted(table.programs)}"
        assert not table.requests, f"requests left: {sorted(table.requests)}"
        assert not table.paused() and not table.assigned_workers()
        for rank in RANKS:
            assert table.usage(rank) == 0.0
            assert table.decayed_usage(rank, self.now) == 0.0

    def teardown(self) -> None:
        # Visible with --hypothesis-show-statistics: which paths the examples reached.
        if hasattr(self, "scheduler"):
            for name, count in self.scheduler.counters.items():
                if count:
                    event(f"scheduler {name}")
            for outcome in set(self.outcome.values()):
                event(f"request {outcome}")
            event(f"steps {min(self.steps // 10 * 10, 50)}+")
            if self.seen_deferred:
                event("request deferred")
            if self.seen_marked:
                event("program marked for pause")
            if self.seen_sessionless:
                event("room reserved for sessionless traffic")

    # ---- invariants -------------------------------------------------------------------
    @invariant()
    def note_deferrals(self) -> None:
        if hasattr(self, "scheduler"):
            self.steps += 1
            self.observe()

    @invariant()
    def a_release_without_room_is_one_resume(self) -> None:
        """hold_max_cache_loss: each turn released without room counts one (unforced)
        resume."""
        if hasattr(self, "scheduler"):
            c = self.scheduler.counters
            assert c["released_evicting"] <= c["resumes"] - c["forced_resumes"]
            assert c["aging_pauses"] <= c["pauses"]

    @invariant()
    def every_program_has_one_state_and_every_request_one_slot(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        slots: dict[str, str] = {}
        for sid, program in self.table.programs.items():
            assert program.session_id == sid
            assert isinstance(program.phase, Phase)
            assert isinstance(program.lifecycle, Lifecycle)
            entries = [program.current, *program.waiting, program.final_request]
            for rid in entries:
                if rid is None:
                    continue
                assert rid not in slots, f"{rid} is in two slots ({slots[rid]} and {sid})"
                slots[rid] = sid
                request = self.table.requests.get(rid)
                assert request is not None, f"{sid} holds {rid}, which is not tracked"
                assert request.session_id == sid
            for rid in [*program.waiting, program.final_request]:
                if rid is not None:
                    assert self.table.requests[rid].state is RequestState.QUEUED
            if program.current is None:
                # Nothing may be stranded behind a turn that is not there.
                assert not program.waiting, f"{sid}: turns queued behind no turn"
                assert program.final_request is None, f"{sid}: session-final behind no turn"
                assert program.phase is Phase.ACTING
                assert not program.marked_for_pause
            else:
                current = self.table.requests[program.current]
                assert current.state in (RequestState.DEFERRED, RequestState.RELEASED)
                assert program.phase is Phase.REASONING
                if current.state is RequestState.DEFERRED:
                    # The force-resume path finds deferred turns by these two fields.
                    assert program.lifecycle is Lifecycle.PAUSED, f"{sid}: deferred but ACTIVE"
                    assert program.deferred_since is not None
                    assert program.deferred_since <= self.now
                else:
                    assert program.lifecycle is Lifecycle.ACTIVE, f"{sid}: in flight but PAUSED"
            if program.marked_for_pause:
                assert program.lifecycle is Lifecycle.ACTIVE
            # A mark made for an aged turn is a mark for pause, never a leftover of one.
            assert program.marked_for_pause or not program.marked_for_aged, (
                f"{sid}: marked for an aged turn but not for pause")
            if program.yielded:  # only between a turn's end and the next turn's start
                assert program.phase is Phase.ACTING and program.current is None, (
                    f"{sid}: yielded while {program.phase.value} with a turn in flight")
                assert program.lifecycle is Lifecycle.ACTIVE, f"{sid}: yielded and paused"
        assert set(slots) == set(self.table.requests), (
            f"tracked requests outside every slot: {set(self.table.requests) - set(slots)}")

    @invariant()
    def one_turn_in_flight_per_session(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        in_flight: dict[str, list[str]] = {}
        for rid, request in self.table.requests.items():
            if request.state in (RequestState.DEFERRED, RequestState.RELEASED):
                in_flight.setdefault(request.session_id, []).append(rid)
        for sid, rids in in_flight.items():
            assert len(rids) == 1, f"{sid} has {rids} in flight"
            assert self.table.programs[sid].current == rids[0]
        # The client's view agrees: at most one released turn per session.
        sessions = [sub.session_id for sub in self.released.values()]
        assert len(sessions) == len(set(sessions))

    @invariant()
    def tracking_is_bounded(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        assert len(self.table.requests) <= MAX_TRACKED
        assert len(self.table.programs) <= MAX_TRACKED

    @invariant()
    def usage_ledger_equals_a_recount(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        recount: dict[WorkerKey, float] = {}
        held: dict[WorkerKey, list[tuple[float, list[tuple[int, int]]]]] = {}
        model = self.scheduler.usage_model
        for program in self.table.programs.values():
            if program.lifecycle is Lifecycle.ACTIVE and program.worker is not None:
                recount[program.worker] = recount.get(program.worker, 0.0) + model.charge(program)
                if program.yielded and program.phase is Phase.ACTING:
                    continue  # it yielded its room: none of its blocks is charged
                held.setdefault(program.worker, []).append((model.weight(program), [
                    (size, h) for size, hashes in program.prefix.groups() for h in hashes]))
        for rank, programs in held.items():
            # Tokens under a prefix hash held by k programs are credited k - 1 times, at
            # the average weight at which the holders of shared hashes are charged for them.
            holders = Counter(key for _, keys in programs for key in keys)
            duplicates = sum((k - 1) * size for (size, _), k in holders.items())
            shared = [(w, sum(size for size, h in keys if holders[(size, h)] >= 2))
                      for w, keys in programs]
            if duplicates:
                average = sum(w * n for w, n in shared) / sum(n for _, n in shared)
                recount[rank] -= duplicates * average
        for rank in set(recount) | set(RANKS) | set(self.table.assigned_workers()):
            ledger = self.table.usage(rank)
            assert close(ledger, recount.get(rank, 0.0)), (
                f"usage({rank}) = {ledger}, recount = {recount.get(rank, 0.0)}")
            # The decayed view (what the resume pass reads) the same way, each program at
            # its weight now.
            decayed = self.table.decayed_usage(rank, self.now)
            expected = _decayed_recount(self.table, model, rank, self.now)
            assert close(decayed, expected), (
                f"decayed_usage({rank}) = {decayed}, recount = {expected}")
        members = {
            sid for rank in self.table.assigned_workers()
            for sid in (p.session_id for p in self.table.members(rank))
        }
        assert members == {
            p.session_id for p in self.table.programs.values()
            if p.lifecycle is Lifecycle.ACTIVE and p.worker is not None
        }

    @invariant()
    def the_running_turn_count_equals_a_recount(self) -> None:
        """What the cost model reads as the batch: released requests not yet ended."""
        if not hasattr(self, "scheduler"):
            return
        released = sum(1 for r in self.table.requests.values()
                       if r.state is RequestState.RELEASED)
        assert self.scheduler._released == released

    @invariant()
    def paused_bookkeeping_matches_lifecycles(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        paused = sorted(p.session_id for p in self.table.paused())
        expected = sorted(
            sid for sid, p in self.table.programs.items() if p.lifecycle is Lifecycle.PAUSED)
        assert paused == expected
        assert self.table.any_paused == bool(expected)
        # Exactly the paused programs with a turn wait for room (and hold new ones back).
        waiting = sorted(self.scheduler._deferred)
        assert waiting == sorted(
            sid for sid, p in self.table.programs.items()
            if p.lifecycle is Lifecycle.PAUSED and p.current is not None), waiting
        # Dormant programs are retained, idle, and were ACTIVE when found dormant.
        for sid, program in self.scheduler.idle.dormant.items():
            assert self.table.programs.get(sid) is program

    @invariant()
    def programs_let_in_without_room_are_retained_active_and_placed(self) -> None:
        """``hold_excludes_let_in``'s set holds only retained, ACTIVE programs with a rank
        (a pause, a move, a lost rank or the end of the program takes one out)."""
        if not hasattr(self, "scheduler"):
            return
        for sid, program in self.scheduler._let_in.items():
            assert self.table.programs.get(sid) is program, sid
            assert program.lifecycle is Lifecycle.ACTIVE and program.worker is not None, sid

    @invariant()
    def nothing_is_expected_cached_for_a_program_that_gave_its_room_up(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        # A paused or yielded program's cache may be evicted: its next turn must not count
        # a miss of it as the engine's loss (cache_loss.py).
        for sid, program in self.table.programs.items():
            if program.lifecycle is Lifecycle.PAUSED or program.yielded:
                assert program.resident_prompt_tokens == 0, (
                    sid, program.lifecycle, program.yielded, program.resident_prompt_tokens)

    @invariant()
    def deferral_is_bounded_while_a_worker_is_live(self) -> None:
        if not hasattr(self, "scheduler") or self.live_since is None:
            return
        bound = TIMEOUT + INTERVAL
        for rid, since in self.deferred_at.items():
            waited = self.now - max(since, self.live_since)
            assert waited <= bound, (
                f"{rid} deferred since {since} (workers live since {self.live_since}) "
                f"is still deferred at {self.now}: {waited}s > {bound}s")

    @invariant()
    def client_and_scheduler_agree_on_what_is_in_flight(self) -> None:
        """Every submitted request is answered exactly once, and none is forgotten."""
        if not hasattr(self, "scheduler"):
            return
        assert not (set(self.pending) & set(self.released))
        assert not ((set(self.pending) | set(self.released)) & set(self.outcome))
        assert set(self.table.requests) == set(self.pending) | set(self.released), (
            "scheduler tracks "
            f"{sorted(set(self.table.requests) - set(self.pending) - set(self.released))} "
            "that the client finished, and forgot "
            f"{sorted((set(self.pending) | set(self.released)) - set(self.table.requests))}")
        for rid in self.released:
            assert self.table.requests[rid].state is RequestState.RELEASED
        for rid in self.pending:
            assert self.table.requests[rid].state is not RequestState.RELEASED

    @invariant()
    def sessionless_room_is_what_runs_now(self) -> None:
        """Each live rank's room is its card less what requests without a session id
        running there hold (at most half of it) with reserve, its whole card without; with
        ``sessionless_kv_full_loss``, less a share of that (it follows the engine's loss)."""
        if not hasattr(self, "scheduler"):
            return
        capacity = self.scheduler.capacity
        held: dict[WorkerKey, int] = {}
        for rank, tokens in self.sessionless.values():
            held[rank] = held.get(rank, 0) + tokens
        params = self.scheduler.params
        reserve = params.sessionless_kv == "reserve"
        for rank, room in capacity.known.items():
            whole = self.cards[rank].tokens
            taken = min(held.get(rank, 0), whole // 2) if reserve else 0
            if params.sessionless_kv_full_loss is None:
                assert room == whole - taken, (
                    f"{rank}: room {room}, card {whole}, sessionless {held.get(rank, 0)}")
            else:
                assert whole - taken <= room <= whole, (
                    f"{rank}: room {room}, card {whole}, sessionless {held.get(rank, 0)}")
        assert capacity.largest == max((self.cards[r].tokens for r in capacity.known),
                                       default=0)
        assert capacity.largest_room == max(capacity.known.values(), default=0)
        if held and reserve:
            self.seen_sessionless = True

    # ---- checks right after a tick ----------------------------------------------------
    def check_after_tick(self) -> None:
        if self.scheduler.capacity.any_live:
            for rid, since in self.deferred_at.items():
                assert self.now - since < TIMEOUT, (
                    f"{rid} deferred since {since} survived a tick at {self.now} with a live "
                    "worker past resume_timeout")
        if any(p.current is not None for p in self.table.programs.values()):
            return
        # No turn in flight: pressure relief had only ACTING programs to pause.
        threshold = self.params.pause_threshold
        residency = self.params.min_residency_seconds
        for rank, capacity in self.scheduler.capacity.known.items():
            # The pressure side measures as configured: plain or decayed usage.
            usage = (self.table.decayed_usage(rank, self.now) if self.params.pressure_decay
                     else self.table.usage(rank))
            if usage <= capacity * threshold + TOLERANCE:
                continue
            # Skipped by design: a rank whose engine is seen to keep what is held
            # (pause_min_cache_loss: its loss ratio is below the gate, so no pause there).
            min_loss = self.params.pause_min_cache_loss
            loss = self.scheduler.cache_loss.loss_ratio(rank)
            if min_loss is not None and loss is not None and loss < min_loss:
                continue
            # Skipped by design: a rank's only program is not paused for room that
            # sessionless traffic holds (it would come straight back).
            if len(self.table.members(rank)) <= 1 and self.scheduler.capacity.reserved(rank):
                continue
            # Skipped by design: programs that hold no room (yielded) or whose pause would
            # not pay (the cost model; nothing pays until the engine is measured).
            costs, batch = self.scheduler.costs, self.scheduler.batch
            active_acting = [p.session_id for p in self.table.members(rank)
                             if p.phase is Phase.ACTING and not p.yielded
                             and costs.pause_pays(p.tokens, batch)
                             and not (p.active_since is not None
                                      and self.now - p.active_since < residency)]
            assert not active_acting, (
                f"after a quiet tick {rank} uses {usage} > {capacity} x {threshold} and "
                f"still has ACTING programs {active_acting} it could pause")


SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None)
TestSchedulerInvariants = SchedulerMachine.TestCase


# ---- plain properties ------------------------------------------------------------------
loads = st.lists(
    st.builds(WorkerLoad, worker=st.sampled_from(RANKS), prefill_tokens=st.integers(0, 5),
              decode_blocks=st.integers(0, 3)),
    min_size=1, max_size=len(RANKS), unique_by=lambda c: c.worker,
)


@settings(max_examples=200, deadline=None)
@given(candidates=loads, preferred=st.none() | st.sampled_from(RANKS),
       block_size=st.sampled_from([1, 16]), data=st.data())
def test_selector_honours_preferred_else_least_loaded_regardless_of_order(
    candidates: list[WorkerLoad], preferred: WorkerKey | None, block_size: int,
    data: st.DataObject,
) -> None:
    selector = ThunderAgentSelector(ThunderAgentSelector.Parameters())
    chosen = selector.select(candidates, preferred, block_size)
    if preferred is not None and preferred in {c.worker for c in candidates}:
        assert chosen == preferred
    else:
        lowest = min(c.load_tokens(block_size) for c in candidates)
        ties = [c.worker for c in candidates if c.load_tokens(block_size) == lowest]
        assert chosen == min(ties)
    shuffled = data.draw(st.permutations(candidates))
    assert selector.select(shuffled, preferred, block_size) == chosen


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(0, 100_000), weight=st.floats(0.01, 4.0),
       tau=st.floats(0.01, 100.0), buffer=st.integers(0, 1000),
       idle=st.floats(0.0, 1e4), later=st.floats(0.0, 1e4))
def test_decayed_charge_of_acting_program_never_exceeds_charge_and_only_shrinks(
    tokens: int, weight: float, tau: float, buffer: int, idle: float, later: float,
) -> None:
    model = UsageModel(acting_token_weight=weight, acting_decay_tau_seconds=tau,
                       buffer_per_program=buffer)
    acting = Program("a", seq=1, phase=Phase.ACTING, tokens=tokens,
                     acting_since=0.0)
    reasoning = Program("b", seq=2, phase=Phase.REASONING, tokens=tokens)
    now = model.decayed_charge(acting, idle)
    assert buffer - TOLERANCE <= now <= model.charge(acting) * (1 + TOLERANCE)
    assert model.decayed_charge(acting, idle + later) <= now * (1 + TOLERANCE)
    assert model.decayed_charge(reasoning, idle) == model.charge(reasoning) == tokens + buffer


# ---- the asyncio shell keeps the same promise ----------------------------------------------
async def test_rejecting_a_duplicate_request_id_leaves_the_original_waiting() -> None:
    """Every request ends in exactly one outcome, also through ThunderAgentClassifier.

    The scheduler rejects a second request that reuses an in-flight id; that
    rejection answers the *second* classify call only. The original, deferred
    request must keep waiting (the scheduler still tracks it as DEFERRED), or
    its session is wedged: released later to nobody, never completed.
    """
    gate = ThunderAgentClassifier(ThunderAgentParameters(buffer_per_program=0), clock=lambda: 0.0)
    gate.update_workers({1}, {WorkerKey(1): CapacityCard(100, 1)})
    await gate.classify(ClassifyRequest("r1", "a", 90))
    original = asyncio.create_task(gate.classify(ClassifyRequest("r2", "b", 50)))
    await asyncio.sleep(0)
    assert gate.scheduler.table.requests["r2"].state is RequestState.DEFERRED
    try:
        await gate.classify(ClassifyRequest("r2", "c", 5))
    except AdmissionRejected:
        pass
    else:
        raise AssertionError("a duplicate in-flight request id must be rejected")
    await asyncio.sleep(0)
    assert not original.done(), (
        f"the duplicate's rejection answered the original request: {original.exception()!r}")
    original.cancel()
