"""``bench live``: the arms, the regimes' workloads, and the sweep plan (pure).

See :mod:`dynamo_thunderagent.bench.live` for what the harness does and how the sweep is
sized; this module holds the parts that decide *what* runs, without running anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.regimes import REGIME_NAMES, regime_named
from dynamo_thunderagent.bench.shapes import (
    ALL_SYNTHETIC,
    SHAPES,
    SyntheticWorkload,
    shape_token_factor,
)
from dynamo_thunderagent.bench.trace import (
    DEFAULT_TRACE,
    TRACE_SYSTEM_TOKENS,
    load_trace,
    replay_stream,
)
from dynamo_thunderagent.bench.workload import AgentPlan, agent_stream, warm_start
from dynamo_thunderagent.stack.arms import ARM_NAMES, ARMS, HEADLINE_ARMS, Arm, arm_named

DEFAULT_ARMS: tuple[str, ...] = ARM_NAMES
QUICK_ARMS: tuple[str, ...] = HEADLINE_ARMS
WORKLOADS: tuple[str, ...] = ("trace", *ALL_SYNTHETIC)
DEFAULT_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
QUICK_FACTORS: tuple[float, ...] = (1.0, 3.0)
DEFAULT_WINDOW_S = 40.0  # seconds of turns per run, on the wall clock
DEFAULT_WARMUP_S = 10.0  # of which the first are dropped
ROLLOUT_CAP_S = 600.0
"""``--rollout``'s cap without ``--window``, in the run's seconds; a run it cuts reports no
makespan."""
SAMPLE_AGENTS = 256  # synthetic plans sampled to size the capacity


def comma_separated(text: str, convert: type[int] | type[float], kind: str, rule: str,
                    minimum: float, maximum: float, *, strict: bool) -> list[Any]:
    """The comma-separated ``convert`` values of ``text`` (``--agents``, ``--factors`` of
    both ``bench live`` and ``bench sim``), each at least ``minimum`` (above it if
    ``strict``), at most ``maximum``, finite and given once; ValueError naming ``kind``
    and ``rule`` otherwise ("2.5" is no integer, and nan fails every comparison)."""
    items = [v.strip() for v in text.split(",")]
    if not text.strip() or "" in items:
        raise ValueError(f"expected comma-separated {kind} {rule}, got {text!r} (an empty "
                         "item)")
    try:
        values = [convert(v) for v in items]
    except ValueError:
        raise ValueError(f"expected comma-separated {kind}, got {text!r}") from None
    if not all((v > minimum if strict else v >= minimum) and v <= maximum
               and math.isfinite(v) for v in values):
        raise ValueError(f"expected {kind} {rule}, got {text!r}")
    if len(set(values)) < len(values):
        raise ValueError(f"expected {kind} {rule}, each once, got {text!r}")
    return values


def agent_counts(text: str) -> list[int]:
    """``--agents``: comma-separated whole numbers from 1 to 10,000
    (:func:`comma_separated`)."""
    return comma_separated(text, int, "integers", "from 1 to 10,000", 1, 10_000, strict=False)


def pressure_factors(text: str) -> list[float]:
    """``--factors``: comma-separated finite numbers above 0, at most 100
    (:func:`comma_separated`)."""
    return comma_separated(text, float, "numbers", "above 0, at most 100", 0.0, 100.0,
                           strict=True)


def relative_path(path: Path | None) -> str | None:
    """``path`` relative to the working directory when it is below it (for reports)."""
    if path is None:
        return None
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


# ============================================================================================
# Arms
# ============================================================================================


@dataclass(frozen=True)
class ArmSpec:
    """An arm of the comparison: a registered arm (``base``), a display label, a policy file."""

    label: str
    base: str
    policy: Path | None = None

    @property
    def arm(self) -> Arm:
        return arm_named(self.base)

    @property
    def folder(self) -> str:
        """The label as a file name: ``ours:slack`` -> ``ours-slack``. A colon is no part of
        a portable path; the rest of a label is (``parse_arm``), and as no arm's name has a
        colon, two labels never share a folder."""
        return self.label.replace(":", "-")

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "base": self.base, "policy": relative_path(self.policy)}


def parse_arm(
    text: str, *, ours_policy: Path | None = None, builtin_policy: Path | None = None
) -> ArmSpec:
    """``stock`` | ``builtin`` | ``dynamo-python`` | ``ours`` | ``<base>:<label>=<policy>``.

    A labelled arm (a base that takes a policy: ``ours`` or ``builtin``) runs with its own
    policy file and is named ``<base>:<label>``. An arm that takes a policy and is given none
    runs with its default policy. Raises ValueError naming what is wrong.
    """
    text = text.strip()
    if ":" in text:
        base, _, rest = text.partition(":")
        label, eq, path = rest.partition("=")
        takes_policy = base in ARMS and ARMS[base].takes_policy
        if not takes_policy or not eq or not label.strip() or not path.strip():
            raise ValueError(
                f"arm {text!r}: an ablation arm is ours:<label>=<policy.yaml> "
                "(or builtin:<label>=<policy.yaml>)"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label.strip()):
            raise ValueError(f"arm {text!r}: label may use letters, digits and _.+- only")
        return ArmSpec(f"{base}:{label.strip()}", base, Path(path.strip()))
    arm = arm_named(text)
    given = {"--policy": ours_policy, "--builtin-policy": builtin_policy}
    return ArmSpec(text, text, arm.chosen_policy(given) or arm.default_policy)


def parse_arms(
    arms: str,
    arm_policies: Sequence[str] = (),
    *,
    ours_policy: Path | None = None,
    builtin_policy: Path | None = None,
) -> list[ArmSpec]:
    """The arms of ``--arms`` (comma-separated) then one ``ours:<label>`` per ``--arm-policy
    label=path``; labels must be unique and policy files must exist."""
    specs = [
        parse_arm(a, ours_policy=ours_policy, builtin_policy=builtin_policy)
        for a in arms.split(",")
        if a.strip()
    ]
    for item in arm_policies:
        specs.append(parse_arm(f"ours:{item}"))
    if not specs:
        raise ValueError("--arms: no arm given")
    labels = [s.label for s in specs]
    duplicates = sorted({x for x in labels if labels.count(x) > 1})
    if duplicates:
        raise ValueError(f"arm labels must be unique, repeated: {', '.join(duplicates)}")
    for spec in specs:
        if spec.policy is not None and not spec.policy.is_file():
            raise ValueError(f"arm {spec.label}: policy file {spec.policy} not found")
    return specs


# ============================================================================================
# Regimes, workloads and the sweep
# ============================================================================================


@dataclass(frozen=True)
class RegimeSetup:
    """How one regime runs: workload, scales, the mocker clock and the sweep's top.

    ``time_scale``: wall seconds per real second (tool sleeps and, in the calibrated regime,
    the mocker's tables). ``client_overhead_s``: real seconds added to every tool gap.
    """

    regime: str
    workload: str
    token_scale: float
    time_scale: float
    speedup_ratio: float
    client_overhead_s: float
    max_agents: int
    trace: Path | None = None
    system_prompt_tokens: int = TRACE_SYSTEM_TOKENS

    def validate(self) -> None:
        if self.regime not in REGIME_NAMES:
            raise ValueError(f"unknown regime {self.regime!r}; choose from {REGIME_NAMES}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; choose from {WORKLOADS}")
        if not (self.token_scale > 0 and self.time_scale > 0 and self.speedup_ratio > 0):
            raise ValueError("token_scale, time_scale and speedup_ratio must be > 0")
        if self.client_overhead_s < 0 or self.max_agents < 1:
            raise ValueError("client_overhead_s must be >= 0 and max_agents >= 1")
        if self.workload == "trace" and (self.trace is None or not self.trace.is_file()):
            raise ValueError(f"trace file {self.trace} not found (use --workload swe)")

    def describe(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["trace"] = relative_path(self.trace)
        return data


def default_setup(name: str) -> RegimeSetup:
    """The live defaults of a regime (``bench.regimes``): its workload and scaling."""
    r = regime_named(name)
    return RegimeSetup(
        regime=r.name,
        workload="trace" if r.default_trace() is not None else r.workload,
        token_scale=r.live.token_scale,
        time_scale=r.live.time_scale,
        speedup_ratio=r.live.speedup_ratio,
        client_overhead_s=r.client_overhead_s,
        max_agents=r.live.max_agents,
        trace=DEFAULT_TRACE,
    )


def live_setup(
    regime: str,
    *,
    workload: str = "auto",
    trace: Path | None = None,
    token_scale: float | None = None,
    time_scale: float | None = None,
    max_agents: int | None = None,
) -> RegimeSetup:
    """The setup ``bench live`` runs ``regime`` with, given its flags (None: the default).

    ``workload`` "auto" keeps the regime's own; a generated shape gets the token factor
    that sizes it for the regime's simulated worker, as ``bench sim`` sizes it. A
    ``trace`` replays that file (as ``bench sim --trace``): with a generated workload it
    is an error, not a file left unread.
    """
    base = default_setup(regime)
    changes: dict[str, Any] = {}
    if workload != "auto":
        changes["workload"] = workload
    if trace is not None:
        if workload not in ("auto", "trace"):
            raise ValueError(f"--trace and --workload {workload} contradict each other: "
                             "--trace replays its file (leave --workload out)")
        changes.update(workload="trace", trace=trace)
    if token_scale is not None:
        changes["token_scale"] = token_scale
    elif workload in SHAPES:
        pool = regime_named(regime).sim.pool_tokens
        changes["token_scale"] = base.token_scale * shape_token_factor(pool)
    if time_scale is not None:
        changes["time_scale"] = time_scale
    if max_agents is not None:
        changes["max_agents"] = max_agents
    setup = dataclasses.replace(base, **changes)
    setup.validate()
    return setup


def _scaled(spec: SyntheticWorkload, setup: RegimeSetup) -> SyntheticWorkload:
    # Session ids name the workload (``toy-<seed>-<i>``, ``swe-<seed>-<i>``, ``long-...``).
    return dataclasses.replace(spec, token_scale=setup.token_scale, time_scale=setup.time_scale,
                               session_prefix=setup.workload)  # fmt: skip


def base_plans(setup: RegimeSetup, seed: int) -> Iterator[AgentPlan]:
    """The regime's endless agent stream (scaled; client overhead not yet added)."""
    if setup.workload == "trace":
        assert setup.trace is not None
        plans = _trace_plans(setup.trace, setup.token_scale, setup.time_scale,
                             setup.system_prompt_tokens)  # fmt: skip
        return replay_stream(plans, seed)
    return agent_stream(_scaled(ALL_SYNTHETIC[setup.workload], setup), seed)


_TRACE_CACHE: dict[tuple[str, float, float, int], list[AgentPlan]] = {}


def _trace_plans(path: Path, token_scale: float, time_scale: float, system: int) -> list[AgentPlan]:
    key = (str(path), token_scale, time_scale, system)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = load_trace(path, token_scale, time_scale, system_prompt_tokens=system)
    return _TRACE_CACHE[key]


def with_overhead(plan: AgentPlan, seconds: float) -> AgentPlan:
    """``plan`` with ``seconds`` added to every tool gap (not after the last turn), its
    subagents' included."""
    if seconds <= 0:
        return plan
    last = len(plan.turns) - 1
    turns = tuple(
        dataclasses.replace(
            t, tool_seconds=t.tool_seconds + seconds,
            subagents=tuple(with_overhead(s, seconds) for s in t.subagents),
        ) if k < last else t
        for k, t in enumerate(plan.turns)
    )  # fmt: skip
    return dataclasses.replace(plan, turns=turns)


def run_plans(setup: RegimeSetup, seed: int, agents: int) -> Iterator[AgentPlan]:
    """The stream one run replays: base plans, client overhead, warm start of the first N."""
    return warm_start(_with_client_overhead(setup, seed), agents, seed)


def batch_plans(setup: RegimeSetup, seed: int, agents: int) -> Iterator[AgentPlan]:
    """A rollout's batch: the stream's first ``agents`` plans from their first turn."""
    return islice(_with_client_overhead(setup, seed), agents)


def _with_client_overhead(setup: RegimeSetup, seed: int) -> Iterator[AgentPlan]:
    overhead = setup.client_overhead_s * setup.time_scale
    return (with_overhead(p, overhead) for p in base_plans(setup, seed))


@dataclass(frozen=True)
class WorkloadShape:
    """Peak contexts of the workload (mocker tokens), for sizing.

    ``mean_peak_tokens``: mean over agents of the most KV an agent holds at once, its
    subagents included (``AgentPlan.peak_footprint_tokens``); ``max_peak_tokens``: the
    largest single program (parent or subagent), which must fit one worker.
    """

    mean_peak_tokens: float
    max_peak_tokens: int
    sampled_agents: int


def workload_shape(setup: RegimeSetup, seed: int) -> WorkloadShape:
    """Mean and max peak context: every trace session, or the first synthetic agents."""
    if setup.workload == "trace":
        assert setup.trace is not None
        plans = _trace_plans(setup.trace, setup.token_scale, setup.time_scale,
                             setup.system_prompt_tokens)  # fmt: skip
    else:
        plans = list(islice(base_plans(setup, seed), SAMPLE_AGENTS))
    peaks = [p.peak_footprint_tokens for p in plans]
    largest = max(q.peak_context_tokens for p in plans for q in p.programs())
    return WorkloadShape(sum(peaks) / len(peaks), largest, len(peaks))


@dataclass(frozen=True)
class SweepPlan:
    """The fixed KV capacity of a regime and its agent counts."""

    agents: tuple[int, ...]
    pressures: tuple[float, ...]  # N x mean peak / capacity, per agent count
    num_gpu_blocks: int
    capacity_tokens: int
    mean_peak_tokens: float
    max_peak_tokens: int
    note: str | None = None

    def pressure_of(self, agents: int) -> float:
        return self.pressures[self.agents.index(agents)]

    def describe(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["agents"] = list(self.agents)
        data["pressures"] = [round(p, 3) for p in self.pressures]
        data["mean_peak_tokens"] = round(self.mean_peak_tokens, 1)
        return data


def plan_sweep(
    shape: WorkloadShape,
    *,
    max_agents: int,
    factors: Sequence[float] = DEFAULT_FACTORS,
    agents: Sequence[int] | None = None,
    num_workers: int = 2,
    block_size: int = 16,
    num_gpu_blocks: int | None = None,
) -> SweepPlan:
    """Fix the capacity once and derive the agent counts (see the module docstring).

    Capacity: ``max_agents x mean_peak / max(factors)`` tokens over ``num_workers`` workers,
    rounded up to whole blocks, at least one largest program per worker; ``num_gpu_blocks``
    overrides it. Agent counts: ``agents`` if given, else ``round(f / max(f) x max_agents)``
    (at least 1, duplicates dropped), ascending.
    """
    if not factors or any(f <= 0 for f in factors):
        raise ValueError("factors must be a non-empty list of numbers > 0")
    if max_agents < 1 or num_workers < 1 or block_size < 1:
        raise ValueError("max_agents, num_workers and block_size must be >= 1")
    top = max(factors)
    note = None
    if num_gpu_blocks is None:
        wanted = max_agents * shape.mean_peak_tokens / top
        blocks = math.ceil(wanted / (num_workers * block_size))
        floor = math.ceil(shape.max_peak_tokens / block_size)
        if floor > blocks:
            note = (
                f"capacity raised from {blocks} to {floor} blocks per worker so that the "
                f"largest program ({shape.max_peak_tokens} tokens) fits one worker; pressures "
                "are lower than the factors asked for"
            )
            blocks = floor
    else:
        if num_gpu_blocks < 1:
            raise ValueError("num_gpu_blocks must be >= 1")
        blocks = num_gpu_blocks
    if agents:
        counts = sorted({int(a) for a in agents})
        if counts[0] < 1:
            raise ValueError("agent counts must be >= 1")
    else:
        counts = sorted({max(1, round(f / top * max_agents)) for f in factors})
    capacity = blocks * block_size * num_workers
    return SweepPlan(
        agents=tuple(counts),
        pressures=tuple(n * shape.mean_peak_tokens / capacity for n in counts),
        num_gpu_blocks=blocks,
        capacity_tokens=capacity,
        mean_peak_tokens=shape.mean_peak_tokens,
        max_peak_tokens=shape.max_peak_tokens,
        note=note,
    )


@dataclass(frozen=True)
class RunKey:
    """One scheduled run: which regime, repeat, agent count and arm, and where it sits."""

    regime: str
    repeat: int
    agents: int
    arm: str
    index: int  # position in the whole schedule
    position: int  # position within its (regime, repeat, N) group


def interleave(
    regimes: Sequence[str],
    agents: Mapping[str, Sequence[int]],
    arms: Sequence[str],
    repeats: int,
) -> list[RunKey]:
    """The schedule: for each regime, repeat, N (ascending), every arm once.

    Group ``g`` (counted across the regime's repeats and Ns) runs the arms rotated left by
    ``g mod len(arms)``, so every arm takes every position equally often and no arm always
    runs right after the same other arm's stack.
    """
    if repeats < 1 or not arms:
        raise ValueError("need repeats >= 1 and at least one arm")
    keys: list[RunKey] = []
    for regime in regimes:
        group = 0
        for repeat in range(repeats):
            for n in agents[regime]:
                shift = group % len(arms)
                order = [*arms[shift:], *arms[:shift]]
                for position, arm in enumerate(order):
                    keys.append(RunKey(regime, repeat, n, arm, len(keys), position))
                group += 1
    return keys


