"""One simulated run: N closed-loop agents, one arm, W workers, a fixed window.

(About 500 lines: the run's event handlers, sending, completing, rejecting and ending
agents, share one state, the agents, requests in flight and records, and the figures are
read from that state at the end; the engine, the KV pools and the arms are modules of
their own.)

The harness is the live one's (workload.md, ``bench/driver.py``) on a fake clock: each of
``agents`` slots runs an :class:`~dynamo_thunderagent.bench.workload.AgentPlan` turn by turn
(send the turn with the whole history, wait for it, run the tool, repeat); after its last
turn the agent sends its session-final and the slot takes the next plan of the stream, so N
agents are always live. At ``warmup_s + window_s`` the run stops starting turns and *drains*:
every agent ends at its next tool boundary with a session-final (the live driver's
``release``), and the run goes on until all have ended (or ``drain_limit_s`` passes), so
that a scheduler's end state can be checked.

A compaction turn (``TurnPlan.compaction``) starts a new history: its prompt is the system
prompt plus the summary, the program's old chain becomes garbage on every worker
(``KvPool.retire``), and only the system prompt can be hit; like a first turn, it counts
nothing as reusable (so compactions add no recomputed tokens). A fan-out turn
(``TurnPlan.subagents``) starts its subagents at once, as programs of their own (own session
id, own session-final) in the parent's slot; the parent's next turn is sent when the last of
them has ended, plus the turn's tool time: the closed loop waits on them as the live driver
does. Subagents do not count as completed agents.

Figures (:class:`SimFigures`) count turns that *finished* inside the steady window
``[warmup_s, warmup_s + window_s)``, the definitions of ``bench/metrics.py``:

* steps/min: such turns per minute of the window;
* hit rate: cached / prompt tokens of those turns (steady window only: the cold first turns
  of the warm-up would otherwise blur the knee);
* recomputed tokens: for each of those turns, the whole blocks that the program's previous
  turn left reusable (its prompt, plus its reply when the client sends it back verbatim)
  minus what this turn found cached;
* turn latency: sent -> last token (admission wait + engine queue + prefill + decode);
* admission wait: sent -> released by the arm; its max also covers turns still deferred at
  the end of the window (a starved agent shows even if it never got through);
* pauses, resumes, forced resumes, moves (a turn routed to another worker than its
  program's previous turn): counted inside the window.

Other tenants' traffic (``RunConfig.background``, ``bench sim --background``; the live
driver's ``Background``): ``concurrency`` loops send requests without a session id, each of
unique prompt tokens that nothing can hit, back to back (no client overhead) from the start
until the window closes. The arm routes them as stock KV routing does
(:meth:`~.contract.Arm.submit_sessionless`) and hears when each starts producing tokens and when
it ends, as the live router does. They are not turns: ``SimFigures.background`` counts those
that finished inside the window and their median latency (sent -> last token); the live
driver counts those of the whole run, warm-up included.

A rollout (``RunConfig.rollout``, ``bench sim --rollout``) is one batch instead of a closed
loop, as an RL rollout or an evaluation runs its agents: the ``agents`` plans start together
at 0 and a slot whose agent ends takes no other, so every arm runs the same agents to their
end. The run stops when the last has ended (``window_s`` caps it; there is no warm-up), and
its figures cover the whole batch: steps/min up to the batch's end, hit rate and latencies
over every turn, and ``SimFigures.rollout``: the makespan (time from the start to the last
agent's end; None when the cap cut the batch or a run was lost, as live), the runs finished,
and their mean and p90 completion time (first turn sent to session-final).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dynamo_thunderagent.bench.metrics import cache_figures, latency_percentiles
from dynamo_thunderagent.bench.records import TurnRecord
from dynamo_thunderagent.bench.sim.contract import Arm
from dynamo_thunderagent.bench.sim.engine import (
    Cluster,
    EngineConfig,
    EventLoop,
    SimRequest,
    Worker,
)
from dynamo_thunderagent.bench.workload import AgentPlan, Background
from dynamo_thunderagent.quantile import percentile

# Agents whose prompts outgrow every pool end and are replaced at once: past this many in a
# row the run cannot make progress (and the replacements nest a call each).
MAX_UNFIT_IN_A_ROW = 100


@dataclass(frozen=True)
class RunConfig:
    """Shape of one run. ``client_overhead_s`` is added before every turn is sent (client
    time per call that no GPU work explains: API, tokenisation)."""

    agents: int
    workers: int
    engine: EngineConfig
    warmup_s: float
    window_s: float
    drain_limit_s: float = 7200.0
    client_overhead_s: float = 0.0
    background: Background | None = None  # other tenants' sessionless requests
    rollout: bool = False  # one batch of ``agents`` plans, run to their end (module docstring)

    def validate(self) -> None:
        if self.agents < 1 or self.workers < 1:
            raise ValueError(f"need agents >= 1 and workers >= 1, got {self.agents}, "
                             f"{self.workers}")
        if self.warmup_s < 0 or self.window_s <= 0:
            raise ValueError("need warmup_s >= 0 and window_s > 0")
        if self.rollout and self.warmup_s:
            raise ValueError("a rollout is measured from its start: need warmup_s = 0")
        if self.background is not None:
            check_background_fits(self.background, self.engine)


def check_background_fits(background: Background, engine: EngineConfig) -> None:
    """ValueError unless one background request (prompt and output) fits a worker's KV pool:
    one that never fits would wait at the head of its worker's queue for ever."""
    if not engine.fits(background.prompt_tokens + background.output_tokens):
        raise ValueError(
            f"background requests of {background.prompt_tokens} prompt + "
            f"{background.output_tokens} output tokens exceed a worker's KV pool "
            f"({engine.total_blocks} blocks x {engine.block_size} tokens)")


@dataclass(frozen=True)
class SimFigures:
    """Figures of one (arm, N) run; see the module docstring for definitions.

    The simulator's counterpart of ``bench.metrics.ArmMetrics`` (a live run's figures),
    computed from the same :class:`~dynamo_thunderagent.bench.records.TurnRecord` s, plus the
    arm's counters. Not a run record: that is ``bench.records.RunResult``.
    """

    arm: str
    agents: int
    steps_per_min: float
    steady_turns: int
    hit_rate: float | None
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    reusable_tokens: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    wait_p50_s: float | None
    wait_p99_s: float | None
    wait_max_s: float | None
    pauses: int
    resumes: int
    forced_resumes: int
    moves: int
    busy_fraction: float
    agents_completed: int
    errors: int
    drained: bool
    problems: tuple[str, ...] = field(default_factory=tuple)
    # Other tenants' requests finished inside the window and their median latency; None
    # without background traffic.
    background: dict[str, Any] | None = None
    # A rollout's batch: makespan_s (None: the cap cut it, or a run was lost), runs
    # (finished), run_mean_s and run_p90_s (their completion times); None in a closed loop.
    rollout: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = list(self.problems)
        # Absent, not null, when off: a closed-loop record reads as before either existed.
        for key in ("background", "rollout"):
            if data[key] is None:
                del data[key]
        return data


def _admission_wait(record: TurnRecord) -> float:
    """Sent -> released by the arm (every simulated turn was released before it finished)."""
    assert record.released is not None
    return record.released - record.start


@dataclass
class _Agent:
    slot: int
    plan: AgentPlan
    turn: int = 0
    context: int = 0  # tokens of the history after the last finished turn
    reusable: int = 0  # of which the cache can serve on the next turn (whole blocks)
    worker: int | None = None
    parent: _Agent | None = None  # the agent that spawned this one (a subagent)
    waiting: int = 0  # subagents this agent waits for
    started: float = 0.0  # when its first turn was sent


class Simulation:
    """Runs one arm against the simulated cluster (an :class:`~.contract.ArmHost`)."""

    def __init__(self, config: RunConfig, arm: Arm, plans: Iterator[AgentPlan]) -> None:
        config.validate()
        self.config = config
        self.loop = EventLoop()
        self._cluster = Cluster([
            Worker(i, config.engine, self.loop, self._first_token, self._finished)
            for i in range(config.workers)
        ])
        self.arm = arm
        self._plans = plans
        self._agents: dict[str, _Agent] = {}
        self._requests: dict[str, tuple[_Agent, SimRequest]] = {}
        self._unfit_in_a_row = 0  # prompts larger than a pool, since the last that fitted
        self._dispatched: set[str] = set()
        self.records: list[TurnRecord] = []
        self.errors = 0
        self.agents_completed = 0
        self.moves = 0
        self.stopping = False
        self._window_start = config.warmup_s
        self._window_end = config.warmup_s + config.window_s
        self._snapshots: list[dict[str, float]] = []
        self._deferred_at_end: list[float] = []
        self._problems_at_end: list[str] = []
        # Other tenants' requests in flight, by id, with the loop that sent each.
        self._background: dict[str, tuple[int, SimRequest]] = {}
        self._background_sent = 0
        self._background_latencies: list[float] = []  # finished inside the window
        self._run_times: list[float] = []  # a rollout's finished agent runs
        self._batch_end: float | None = None  # when a rollout's last agent ended
        self._launching = False  # run() is starting the agents
        arm.bind(self)

    # ---- ArmHost ----------------------------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def now(self) -> float:
        return self.loop.now

    def dispatch(self, request_id: str, worker: int) -> None:
        if request_id in self._background:
            _, request = self._background[request_id]
            request.released_at = self.loop.now
            self._cluster[worker].submit(request)
            return
        agent, request = self._requests[request_id]
        request.released_at = self.loop.now
        if agent.worker is not None and agent.worker != worker:
            self.moves += 1
        agent.worker = worker
        self._dispatched.add(request_id)
        self._cluster[worker].submit(request)

    def reject(self, request_id: str, reason: str) -> None:
        agent, _ = self._requests.pop(request_id)
        self.errors += 1
        self._end_agent(agent, completed=False)

    def request(self, request_id: str) -> SimRequest:
        return self._requests[request_id][1]

    def in_flight(self, request_id: str) -> bool:
        """The turn (or background request) was dispatched and has not finished."""
        return request_id in self._dispatched or request_id in self._background

    # ---- the run ----------------------------------------------------------------------
    def run(self) -> SimFigures:
        """Simulate warm-up, window and drain; return the window's figures."""
        loop = self.loop
        self._launching = True
        for slot in range(self.config.agents):
            self._start_agent(slot)
        self._launching = False
        if self.config.rollout and not self._agents:  # every agent ended at once (rejected)
            self._end_batch()
        background = self.config.background
        for lane in range(background.concurrency if background else 0):
            self._send_background(lane)
        if self.arm.tick_interval:
            loop.at(self.arm.tick_interval, self._tick)
        loop.at(self._window_start, self._snapshot)
        loop.at(self._window_end, self._stop)
        limit = self._window_end + self.config.drain_limit_s
        loop.run(limit, done=lambda: self.stopping and not self._agents
                 and not self._background)
        drained = not self._agents and not self._background
        if drained:
            self._cluster.check()
        return self._result(drained)

    def _start_agent(self, slot: int) -> None:
        plan = next(self._plans)
        agent = _Agent(slot, plan, context=plan.system_tokens, started=self.loop.now)
        self._agents[plan.session_id] = agent
        self._send(agent)

    def _send(self, agent: _Agent) -> None:
        if self.stopping:
            self._end_agent(agent, completed=False)
            return
        now = self.loop.now
        step = agent.plan.turns[agent.turn]
        if agent.turn > 0 and step.compaction:
            # A new history: the old chain is garbage, only the system prompt can be hit.
            for worker in self._cluster.workers:
                worker.retire(agent.plan.session_id)
            agent.context = agent.plan.system_tokens
            agent.reusable = 0
        prompt = agent.context + step.new_tokens
        request = SimRequest(
            request_id=f"{agent.plan.session_id}/{agent.turn}",
            session_id=agent.plan.session_id,
            turn=agent.turn,
            prompt_tokens=prompt,
            output_tokens=step.output_tokens,
            system_tokens=agent.plan.system_tokens,
            sent_at=now,
            reusable_tokens=min(agent.reusable, prompt),
        )
        self._requests[request.request_id] = (agent, request)
        if not all(w.fits_ever(request) for w in self._cluster.workers):
            # Its agent ends and the next starts at once: a run whose prompts all outgrow
            # the pool would start agents forever (it recursed until Python gave up).
            self._unfit_in_a_row += 1
            if self._unfit_in_a_row > MAX_UNFIT_IN_A_ROW:
                raise ValueError(
                    f"{self._unfit_in_a_row} prompts in a row are larger than a worker's KV "
                    f"pool (the last: {prompt:,} tokens): give the workers more --blocks, or "
                    "the workload a smaller --token-scale")
            self.reject(request.request_id, "context exceeds a worker's KV pool")
            return
        self._unfit_in_a_row = 0
        self.arm.submit(request)

    def _send_background(self, lane: int) -> None:
        """The next request of background loop ``lane``: a prompt nothing can hit (its
        own chain), no session id."""
        background = self.config.background
        if self.stopping or background is None:
            return
        request_id = f"\0sessionless-{self._background_sent}"  # session ids never hold NUL
        self._background_sent += 1
        request = SimRequest(request_id=request_id, session_id=request_id, turn=0,
                             prompt_tokens=background.prompt_tokens,
                             output_tokens=background.output_tokens, system_tokens=0,
                             sent_at=self.loop.now)
        self._background[request_id] = (lane, request)
        self.arm.submit_sessionless(request)

    def _first_token(self, request: SimRequest) -> None:
        if request.request_id in self._background:
            self.arm.sessionless_started(request)
            return
        self.arm.first_token(request)

    def _finished(self, request: SimRequest) -> None:
        if request.request_id in self._background:
            lane, _ = self._background.pop(request.request_id)
            now = self.loop.now
            if self._window_start <= now < self._window_end:
                self._background_latencies.append(now - request.sent_at)
            self.arm.sessionless_ended(request)
            self._send_background(lane)  # back to back, as the live driver's loops
            return
        agent, _ = self._requests.pop(request.request_id)
        self._dispatched.discard(request.request_id)
        now = self.loop.now
        assert request.released_at is not None and request.worker is not None
        self.records.append(TurnRecord(
            "turn", agent.slot, request.session_id, request.turn, request.sent_at, now,
            request.prompt_tokens, request.output_tokens,
            prompt_tokens=request.prompt_tokens, cached_tokens=request.cached_tokens,
            completion_tokens=request.output_tokens, released=request.released_at,
            worker=request.worker, reusable_tokens=request.reusable_tokens,
            parent_session_id=agent.parent.plan.session_id if agent.parent else None,
            compaction=request.turn > 0 and agent.plan.turns[request.turn].compaction,
        ))  # fmt: skip
        size = self.config.engine.block_size
        agent.context = request.context_tokens
        kept = agent.context if self.config.engine.reuse_output else request.prompt_tokens
        agent.reusable = kept // size * size
        self.arm.completed(request)
        step = agent.plan.turns[agent.turn]
        agent.turn += 1
        if agent.turn >= len(agent.plan.turns) or self.stopping:
            self._end_agent(agent, completed=agent.turn >= len(agent.plan.turns))
            return
        if step.subagents:
            agent.waiting = len(step.subagents)
            for sub in step.subagents:
                child = _Agent(agent.slot, sub, context=sub.system_tokens, parent=agent)
                self._agents[sub.session_id] = child
                self._send(child)
            return
        delay = step.tool_seconds + self.config.client_overhead_s
        self.loop.at(now + delay, lambda: self._send(agent))

    def _end_agent(self, agent: _Agent, *, completed: bool) -> None:
        del self._agents[agent.plan.session_id]
        parent = agent.parent
        now = self.loop.now
        if parent is None and completed and self._window_start <= now < self._window_end:
            self.agents_completed += 1
            if self.config.rollout:
                self._run_times.append(now - agent.started)
        self.arm.session_final(agent.plan.session_id)
        if parent is not None:
            parent.waiting -= 1
            if parent.waiting == 0:  # the fan-out's tool returns: the parent goes on
                delay = (parent.plan.turns[parent.turn - 1].tool_seconds
                         + self.config.client_overhead_s)
                self.loop.at(now + delay, lambda: self._send(parent))
        elif self.config.rollout:
            if not self._agents and not self._launching:  # the batch's last agent
                self._end_batch()
        elif not self.stopping:
            self._start_agent(agent.slot)

    def _tick(self) -> None:
        # Ticks stop with the last agent: background requests still running then need none
        # (they end on their own, and nothing waits for room any more).
        self.arm.tick()
        if not (self.stopping and not self._agents):
            assert self.arm.tick_interval is not None
            self.loop.at(self.loop.now + self.arm.tick_interval, self._tick)

    def _snapshot(self) -> None:
        counters: dict[str, float] = dict(self.arm.counters())
        counters["moves"] = self.moves
        counters["busy_s"] = sum(w.stats.busy_s for w in self._cluster.workers)
        self._snapshots.append(counters)

    def _end_batch(self) -> None:
        """A rollout's last agent has ended (unless the cap came first): the batch is over."""
        if not self.stopping:
            self._batch_end = self.loop.now
            self._stop()

    def _stop(self) -> None:
        if self.stopping:  # a rollout that ended before its cap
            return
        self._snapshot()
        now = self.loop.now
        self._deferred_at_end = [now - r.sent_at for _, r in self._requests.values()
                                 if r.released_at is None]
        self._problems_at_end = self.arm.problems(drained=False)
        self.stopping = True

    # ---- figures ----------------------------------------------------------------------
    def _result(self, drained: bool) -> SimFigures:
        start, end = self._window_start, self._window_end
        span = self.config.window_s
        if self._batch_end is None:
            steady = [r for r in self.records if start <= r.end < end]
        else:  # a rollout that ended: its window is the whole batch, last turn included
            span = self._batch_end
            steady = list(self.records)
        # Every simulated record is a finished turn with all of its fields set.
        prompt, cached, hit_rate = cache_figures(steady)
        reusable = sum(r.reusable_tokens or 0 for r in steady)
        recomputed = sum(max(0, (r.reusable_tokens or 0) - (r.cached_tokens or 0))
                         for r in steady)  # fmt: skip
        latency_p50, latency_p99 = latency_percentiles(steady)
        waits = [_admission_wait(r) for r in steady]
        wait_max = max(waits + self._deferred_at_end, default=None)
        before, after = self._snapshots if len(self._snapshots) == 2 else ({}, {})

        def delta(key: str) -> int:
            return int(after.get(key, 0) - before.get(key, 0))

        busy = (after.get("busy_s", 0.0) - before.get("busy_s", 0.0)) / (
            span * self.config.workers) if span > 0 else 0.0
        problems = list(self._problems_at_end)
        problems += self.arm.problems(drained=drained) if drained else [
            f"{len(self._agents)} agents and {len(self._background)} background requests "
            f"had not ended {self.config.drain_limit_s:g} s after the window"]
        background = None
        if self.config.background is not None:
            p50 = percentile(self._background_latencies, 0.50)
            background = {"completed": len(self._background_latencies),
                          "latency_p50_s": None if p50 is None else round(p50, 3)}
        return SimFigures(
            arm=self.arm.name,
            agents=self.config.agents,
            steps_per_min=len(steady) / (span / 60.0) if span > 0 else 0.0,
            steady_turns=len(steady),
            hit_rate=hit_rate,
            prompt_tokens=prompt,
            cached_tokens=cached,
            recomputed_tokens=recomputed,
            reusable_tokens=reusable,
            latency_p50_s=latency_p50,
            latency_p99_s=latency_p99,
            wait_p50_s=percentile(waits, 0.50),
            wait_p99_s=percentile(waits, 0.99),
            wait_max_s=wait_max,
            pauses=delta("pauses"),
            resumes=delta("resumes"),
            forced_resumes=delta("forced_resumes"),
            moves=delta("moves"),
            busy_fraction=min(1.0, busy),
            agents_completed=self.agents_completed,
            errors=self.errors,
            drained=drained,
            problems=tuple(problems),
            background=background,
            rollout=self._rollout_figures() if self.config.rollout else None,
        )

    def _rollout_figures(self) -> dict[str, Any]:
        times = self._run_times
        whole = len(times) == self.config.agents  # no run was lost
        return {"makespan_s": self._batch_end if whole else None, "runs": len(times),
                "run_mean_s": sum(times) / len(times) if times else None,
                "run_p90_s": percentile(times, 0.90)}
