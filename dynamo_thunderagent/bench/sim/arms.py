"""Scheduling policies the simulator compares ("arms"), and the registry of them.

Each arm implements the contract of :mod:`~dynamo_thunderagent.bench.sim.contract`.

* ``ours``: the request classifier built through the plugin catalog from a router-policy
  file, whose pure :class:`~dynamo_thunderagent.scheduler.Scheduler` is driven exactly as the
  asyncio shell drives it (submit on arrival, ``sent`` on routing, ``completed`` with the
  context tokens, ``tick`` every ``scheduler_interval_seconds``), and the policy's worker
  selector choosing among workers by load.
* ``stock``: request-level KV routing, no gate (stock Dynamo ``--router-mode kv``; live's
  ``stock`` arm).
* ``ttl-pinning``: KV routing plus Continuum-style pinning of a program's cache for a TTL
  after each turn, no gate.
* ``upstream``: the upstream ThunderAgent proxy's rules, expressed as our scheduler with the
  parameter values its rules amount to, and its pause rule, the one that differs (see
  :class:`~dynamo_thunderagent.pressure.UpstreamPauseRule`).
* ``dynamo-python``: Dynamo's Python port's own rules, live's ``dynamo-python`` arm (see
  :mod:`~dynamo_thunderagent.bench.sim.python_port`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamo_thunderagent.bench.sim.contract import Arm, ArmHost, kv_route
from dynamo_thunderagent.bench.sim.engine import Cluster, SimRequest
from dynamo_thunderagent.bench.sim.python_port import DynamoPythonArm
from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.catalog import Catalog, default_catalog, load_policy
from dynamo_thunderagent.config import PolicyError, parse_policy, with_host_tier
from dynamo_thunderagent.costs import TurnTiming
from dynamo_thunderagent.decisions import Decisions
from dynamo_thunderagent.parameters import ThunderAgentParameters, ThunderAgentSelectorParameters
from dynamo_thunderagent.policy_files import EXTENDED_POLICY
from dynamo_thunderagent.program import (
    Lifecycle,
    Phase,
    PrefixBlocks,
    RequestState,
    WorkerKey,
    prefix_ends,
    prefix_levels,
)
from dynamo_thunderagent.scheduler import Scheduler
from dynamo_thunderagent.selector import ThunderAgentSelector, WorkerLoad, WorkerSelector

# Arm ours runs the shipped extended policy, like the live stack; an installed package
# without the policies folder falls back to the parameter defaults.
DEFAULT_POLICY = EXTENDED_POLICY


# ---- request-level KV routing (kv_route is in the contract module) -------------------------
def potential_loads(cluster: Cluster, request: SimRequest) -> list[WorkerLoad]:
    """Each worker's load as the KV router predicts it for ``request`` (Dynamo's
    ``get_potential_loads``): the uncached prompt tokens routed there plus this request's
    own uncached ones, and the decode blocks of every unfinished request there plus its
    own."""
    size = cluster.block_size
    blocks = math.ceil(request.prompt_tokens / size)
    return [WorkerLoad(WorkerKey(w.index, 0),
                       w.prefill_tokens() + request.prompt_tokens - w.hit_tokens(request),
                       w.decode_blocks() + blocks) for w in cluster.workers]


class StockArm(Arm):
    """Stock KV routing with soft session affinity: every turn is routed at once, a session's
    first by the KV router's cost and the rest where the first went (``affinity_slack``: see
    :func:`kv_route`)."""

    name = "stock"

    def __init__(self, affinity_slack: float | None = None) -> None:
        super().__init__()
        self.affinity_slack = affinity_slack
        self._bound: dict[str, int] = {}

    def submit(self, request: SimRequest) -> None:
        worker = kv_route(self.host.cluster, request, self._bound.get(request.session_id),
                          affinity_slack=self.affinity_slack)
        self._bound[request.session_id] = worker
        self.host.dispatch(request.request_id, worker)

    def session_final(self, session_id: str) -> None:
        self._bound.pop(session_id, None)


class TtlPinningArm(StockArm):
    """Continuum-style: KV routing with affinity, and each program's cache pinned for a TTL.

    After a turn completes, the program's cached chain on that worker is not evictable for
    ``ttl_s`` seconds (Continuum sets the TTL from the tool-call time it expects); the next
    turn, if it comes in time, finds it; the session's end releases the pin. No admission
    gate: pinned memory can only delay other requests in the engine queue until pins expire.
    Not modelled: Continuum's FCFS-by-program ordering of the engine queue.
    """

    name = "ttl-pinning"

    def __init__(self, ttl_s: float, affinity_slack: float | None = None) -> None:
        super().__init__(affinity_slack)
        self.ttl_s = ttl_s

    def completed(self, request: SimRequest) -> None:
        assert request.worker is not None
        self.host.cluster[request.worker].pin(request.session_id, self.ttl_s)

    def session_final(self, session_id: str) -> None:
        worker = self._bound.pop(session_id, None)
        if worker is not None:
            self.host.cluster[worker].unpin(session_id)


# ---- program-aware arms: our scheduler core -------------------------------------------------
class ProgramArm(Arm):
    """Drives a pure :class:`Scheduler` the way the classifier shell does.

    Release decisions are routed through ``selector`` (the classifier's preferred
    worker/rank when eligible, else least loaded), then reported back with ``sent``.
    Worker ``i`` of the simulation is ``WorkerKey(i, 0)``.
    """

    def __init__(self, name: str, scheduler: Scheduler, selector: WorkerSelector) -> None:
        super().__init__()
        self.name = name
        self.scheduler = scheduler
        self.selector = selector
        self.tick_interval = scheduler.params.scheduler_interval_seconds

    def bind(self, host: ArmHost) -> None:
        super().bind(host)
        cluster = host.cluster
        cards = {WorkerKey(w.index, 0): CapacityCard(w.config.total_blocks, w.config.block_size)
                 for w in cluster.workers}
        self.scheduler.set_workers(frozenset(w.index for w in cluster.workers), cards)

    def submit(self, request: SimRequest) -> None:
        self._apply(self.scheduler.submit(request.request_id, request.session_id,
                                          request.prompt_tokens, self.host.now(),
                                          prefix=self._prefix(request)))

    def _prefix(self, request: SimRequest) -> PrefixBlocks:
        """What the router's chained block hashes would see: the system prompt's blocks
        are common to every agent, the rest are the program's own."""
        block_tokens = self.host.cluster.block_size
        params = self.scheduler.params
        if not params.shared_prefix_accounting:
            return PrefixBlocks((), block_tokens)
        ends = prefix_ends(block_tokens, params.shared_prefix_max_blocks,
                           params.shared_prefix_max_tokens)
        full = bisect.bisect_right(ends, request.prompt_tokens)
        shared = min(full, bisect.bisect_right(ends, request.system_tokens))
        return PrefixBlocks(tuple(hash(("system", i)) for i in range(shared)) + tuple(
            hash((request.session_id, i)) for i in range(shared, full)), block_tokens,
            prefix_levels(params.shared_prefix_max_tokens))

    def first_token(self, request: SimRequest) -> None:
        self._apply(self.scheduler.responding(request.request_id, self.host.now()))

    def sessionless_started(self, request: SimRequest) -> None:
        # The live router learns the serving worker from the first chunk, as here.
        assert request.worker is not None
        self._apply(self.scheduler.sessionless_started(
            request.request_id, WorkerKey(request.worker, 0), request.prompt_tokens,
            self.host.now()))

    def sessionless_ended(self, request: SimRequest) -> None:
        self._apply(self.scheduler.sessionless_ended(request.request_id, self.host.now()))

    def completed(self, request: SimRequest) -> None:
        # The engine's timings of the turn, as the router hands them over.
        if request.scheduled_at is not None and request.first_token_at is not None:
            self.scheduler.observe_turn(TurnTiming(
                request.prompt_tokens - request.cached_tokens,
                request.first_token_at - request.scheduled_at,
                self.host.now() - request.first_token_at, request.output_tokens))
        self._apply(self.scheduler.completed(request.request_id, request.context_tokens,
                                             self.host.now(), request.cached_tokens))

    def session_final(self, session_id: str) -> None:
        self._apply(self.scheduler.submit(f"{session_id}/final", session_id, 0,
                                          self.host.now(), session_final=True))

    def tick(self) -> None:
        self._apply(self.scheduler.tick(self.host.now()))

    def counters(self) -> dict[str, int]:
        c = self.scheduler.counters
        return {"pauses": c["pauses"], "resumes": c["resumes"],
                "forced_resumes": c["forced_resumes"]}

    def _apply(self, decisions: Decisions) -> None:
        host = self.host
        for reject in decisions.rejected:
            if not reject.request_id.endswith("/final"):
                host.reject(reject.request_id, reject.reason)
        for release in decisions.released:
            if release.session_final:
                continue  # answered without a worker
            cluster = host.cluster
            if not release.tracked and release.worker is not None:
                key = release.worker  # a turn alongside its session's: pinned, as live
            else:
                key = self.selector.select(
                    potential_loads(cluster, host.request(release.request_id)),
                    release.worker, cluster.block_size)
            self._apply(self.scheduler.sent(release.request_id, key, host.now()))
            host.dispatch(release.request_id, key.worker_id)

    def problems(self, drained: bool) -> list[str]:
        table = self.scheduler.table
        found = []
        for program in table.programs.values():
            if program.phase is Phase.REASONING and program.current is None:
                found.append(f"program {program.session_id} is REASONING with no turn")
            if program.current is None:
                continue
            request = table.requests[program.current]
            if request.state is RequestState.DEFERRED and program.lifecycle is not Lifecycle.PAUSED:
                found.append(f"turn {request.request_id} is deferred but its program is "
                             "ACTIVE (nothing will release it)")
            if (request.state is RequestState.RELEASED
                    and not self.host.in_flight(request.request_id)):
                found.append(f"turn {request.request_id} is released but not in flight")
        if drained and table.programs:
            found.append(f"{len(table.programs)} programs retained after every session-final: "
                         f"{sorted(table.programs)[:5]}")
        if drained and table.requests:
            found.append(f"{len(table.requests)} requests still tracked after the drain")
        if drained and (held := dict(self.scheduler.sessionless_tokens)):
            found.append(f"room still held for sessionless requests after the drain: {held}")
        return found


# Upstream (ThunderAgent-org/ThunderAgent, ThunderAgent/scheduler/router.py and
# backend/state.py) in our parameter names and with its pause rule
# (pressure.UpstreamPauseRule): it pauses when usage exceeds the whole capacity and drains
# back to it (threshold = target = 1.0), resumes into any room up to capacity (no
# hysteresis), weights ACTING tokens fully with no time decay (its default), reserves 100
# tokens per program, ticks every 5 s, force-resumes a wait after 1,800 s and never expires
# an idle program. Not modelled: its shared-token credit measured from vLLM metrics, and its
# token estimate from request characters (the simulator reports exact token counts).
UPSTREAM_PARAMETERS = ThunderAgentParameters(
    pause_threshold=1.0,
    pause_target=1.0,
    resume_hysteresis=0.0,
    resume_timeout_seconds=1800.0,
    session_retention_seconds=7 * 86_400.0,  # the longest allowed: never, in any simulation
    scheduler_interval_seconds=5.0,
    acting_token_weight=1.0,
    acting_decay_tau_seconds=1e12,  # 2^(-idle/tau) == 1 for any simulated idle time
    buffer_per_program=100,
    pause_rule="upstream",
)


def build_ours(policy: str | Path | None, clock: Callable[[], float],
               catalog: Catalog | None = None, host_blocks: int = 0) -> ProgramArm:
    """The ``ours`` arm from a router-policy file (None: the shipped default policy).

    The classifier is built through the catalog exactly as ``serve`` builds it; it must
    expose the pure scheduler as ``.scheduler`` (the simulator drives the core, not the
    asyncio gate). A cluster with a host KV tier of ``host_blocks`` per worker tells a
    policy that does not set ``host_kv_blocks`` its size, as an operator configures it
    (:func:`~dynamo_thunderagent.config.with_host_tier`). Raises PolicyError for an
    unusable file or classifier type.
    """
    catalog = catalog or default_catalog()
    if policy is None and DEFAULT_POLICY.exists():
        policy = DEFAULT_POLICY
    if policy is None:
        source = "<built-in defaults>"
        resolved = catalog.resolve(parse_policy({"request_classifier": {"type": "thunderagent"}},
                                                source), source)
    else:
        resolved = load_policy(policy, catalog)
    if resolved.classifier is None:
        raise PolicyError(f"{resolved.source}: the simulator needs a request_classifier")
    classifier = catalog.build_classifier(with_host_tier(resolved.classifier, host_blocks),
                                          clock=clock)  # fmt: skip
    scheduler = getattr(classifier, "scheduler", None)
    if not isinstance(scheduler, Scheduler):
        raise PolicyError(f"{resolved.source}: request_classifier type "
                          f"{resolved.classifier.type!r} exposes no pure scheduler "
                          "(.scheduler); the simulator cannot drive it")
    stage = resolved.stages.get("aggregated")
    selector = (catalog.build_selector(stage) if stage is not None
                else ThunderAgentSelector(ThunderAgentSelectorParameters()))
    return ProgramArm("ours", scheduler, selector)


def build_upstream() -> ProgramArm:
    """The ``upstream`` arm: our scheduler with UPSTREAM_PARAMETERS (its pause rule too)."""
    return ProgramArm("upstream", Scheduler(UPSTREAM_PARAMETERS),
                      ThunderAgentSelector(ThunderAgentSelectorParameters()))


@dataclass(frozen=True)
class ArmSettings:
    """What building a simulator arm may need: ours' policy, the TTL, the simulated clock,
    the host KV tier per worker (0: none)."""

    policy: str | Path | None
    ttl_s: float
    clock: Callable[[], float]
    host_blocks: int = 0


# The simulator's arms by name, in their default order; each entry builds a fresh arm (each
# run needs its own). Adding an arm is one entry here.
ARM_BUILDERS: dict[str, Callable[[ArmSettings], Arm]] = {
    "ours": lambda s: build_ours(s.policy, s.clock, host_blocks=s.host_blocks),
    "stock": lambda s: StockArm(),
    "ttl-pinning": lambda s: TtlPinningArm(s.ttl_s),
    "upstream": lambda s: build_upstream(),
    "dynamo-python": lambda s: DynamoPythonArm(),
}
ARM_NAMES = tuple(ARM_BUILDERS)


def build_arm(name: str, *, policy: str | Path | None, ttl_s: float,
              clock: Callable[[], float], host_blocks: int = 0) -> Arm:
    """A fresh arm by name (one of :data:`ARM_NAMES`)."""
    builder = ARM_BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown arm {name!r}; choose from {', '.join(ARM_NAMES)}")
    return builder(ArmSettings(policy, ttl_s, clock, host_blocks))


def parse_arms(text: str) -> Sequence[str]:
    """``"ours,stock"`` -> names, validated, order kept, duplicates dropped."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARM_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown arm(s) {unknown or text!r}; choose from {', '.join(ARM_NAMES)}")
    return list(dict.fromkeys(names))
