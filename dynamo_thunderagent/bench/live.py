"""``dynamo-thunderagent bench live``: interleaved, repeated A/B runs of every arm on local stacks.

What it does
------------
For each timing regime (``--regime calibrated|cheap-recompute|all``, see
``docs/calibration.md``), for each repeat, for each agent count N, it runs every arm once, in
an order rotated from one (repeat, N) group to the next, each on a fresh local stack (mocker
workers, Dynamo frontend and, per arm, a router). One run drives N closed-loop agents (a
finished agent is replaced) for ``--window`` seconds and records the figures of
``docs/../shared/docs/workload.md``: steps/min, prefix-cache hit rate, recomputed tokens, turn
latency, admission wait, pauses, resumes, worker moves, errors. Arms:

* ``stock``: Dynamo's KV router with soft session affinity;
* ``builtin``: Dynamo 1.6.1's Rust ThunderAgent (frontend ``--router-policy-config``), with
  ``--builtin-policy`` (default ``policies/thunderagent.yaml``, the parity file);
* ``dynamo-python``: ``python -m dynamo.thunderagent_router``;
* ``ours``: ``dynamo-thunderagent serve`` with ``--policy`` (default
  ``policies/thunderagent-extended.yaml``);
* ablations ``ours:<label>=<policy.yaml>`` (or ``--arm-policy label=path``): our router with
  another policy file (``builtin:<label>=<path>`` works the same way for the builtin arm).

Capacity and the sweep
----------------------
The KV capacity is fixed for a regime (the same for every N and arm): it is chosen so that
``--max-agents`` agents' mean *peak* contexts add up to ``max(--factors)`` x capacity, never
so small that the largest program in the workload could not fit one worker. The agent counts
are ``N_i = round(f_i / max(f) x max_agents)``, so with the default factors ``0.5, 1, 2, 3``
and 24 agents: N = 4, 8, 16, 24 at 0.5x, 1x, 2x and 3x capacity (``pressure`` in the output
is the exact ratio).

Workloads
---------
* ``calibrated`` (default workload ``trace``): the shared SWE-agent trace replayed (agent
  contexts of tens of thousands of tokens, 77 generated tokens a step at the median, a
  1,000-token shared system prompt assumed), tokens scaled by ``token_scale`` (0.1) and every
  duration by ``time_scale`` (0.25: the run's clock is 4x the GPU's); the mocker's prefill and
  decode tables come from :mod:`~dynamo_thunderagent.bench.calibration` at the same scales.
  The traced deployment's per-call client overhead (0.72 s, not engine time) is added to every
  tool gap, as the simulator does.
* ``cheap-recompute`` (default workload ``toy``): the agents of workload.md's "measured here"
  runs (10-20 turns, 500-token shared system prompt, 100-300 tool tokens and 32-64 generated
  tokens a turn, tool time lognormal with a 0.5 s median) on the mocker's built-in timing.
* ``swe``: the synthetic SWE-agent shape (``WorkloadSpec()``), scaled like the trace.

Warm start: a short window would otherwise see only young agents (every agent starts at turn
0 at once, so contexts never reach their steady-state sizes). The first N agents of a run
therefore start at a seeded, uniformly drawn turn of their program, whose whole history is
their first prompt (a cold prefill, dropped with the warm-up); agents that replace finished
ones start at turn 0. Every arm and repeat sees the same agents (same ``--seed``), so the
spread across repeats is machine noise.

Definitions of the figures (per run; see ``bench/metrics.py``)
---------------------------------------------------------------
* ``steps_per_min``: successful turns that completed inside the steady window
  ``[warmup, window)``, per minute.
* ``hit_rate``: cached / prompt tokens of the successful turns that completed inside the steady
  window (``hit_rate_all``: every turn, warm-up included).
* ``latency_p50_s`` / ``latency_p99_s``: turn latency (admission wait included) of the turns
  that started in the steady window, nearest rank; a turn still waiting when the drain ended
  counts with its time so far (a lower bound; ``latency_censored`` counts them).
* ``recomputed_tokens``: tokens a program had cached on its previous turn and prefilled again
  (whole KV blocks), over the whole run.
* ``pauses`` / ``resumes`` / ``moves`` / ``forced_resumes``: ours from ``/state`` counters;
  dynamo-python from its router log (pauses and resumes; moves None); builtin and stock None
  (not exposed).
* ``paused_mean`` / ``paused_max``: programs paused, time-weighted over the steady window:
  ours by polling ``/state`` every second, dynamo-python from the paused count in its log
  lines, builtin from its scheduler's state-change debug lines (``DYN_LOG`` is raised to
  debug for the ``thunderagent`` target in that arm). None for stock.
* ``admission_wait_*``: ours only (its router measures the wait); None elsewhere.

Output (``--out DIR``, default ``bench-results/<UTC timestamp>/``)
-----------------------------------------------------------------
* ``results.json``: the report (see :func:`build_report`), rewritten after every run so an
  interrupted sweep keeps what it measured;
* ``results.md``: the markdown tables (:func:`render_markdown`);
* ``steps_per_min_<regime>.png``, ``hit_rate_<regime>.png``, ``latency_cdf_<regime>.png``.

``--json`` prints the report on stdout (without the per-run latency samples) as ONE object:
``report["arms"][arm]`` holds the figures of the first regime at its largest N
(``steps_per_min``, ``hit_rate``, ... as means over the repeats, plus ``spread`` and
``by_n`` with every N); ``report["regimes"][regime]["arms"]`` the same per regime. Progress
goes to stderr. Exit status: 0 when every run finished with zero errors, 1 otherwise, 2 for
bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dynamo_thunderagent.bench.metrics import percentile
from dynamo_thunderagent.bench.runner import (
    ArmResult,
    RunSpec,
    get_json,
    run_stack,
    scheduler_figures,
)
from dynamo_thunderagent.bench.workload import (
    DEFAULT_TRACE,
    AgentPlan,
    ToolTimeComponent,
    WorkloadSpec,
    agent_stream,
    load_trace,
    replay_stream,
)
from dynamo_thunderagent.policy_files import EXTENDED_POLICY, PARITY_POLICY

if TYPE_CHECKING:
    from dynamo_thunderagent.bench.driver import RunResult
    from dynamo_thunderagent.stack.launcher import LocalStack

SCHEMA = "dynamo-thunderagent/bench-live/v1"
ARM_BASES: tuple[str, ...] = ("stock", "builtin", "dynamo-python", "ours")
DEFAULT_ARMS: tuple[str, ...] = ARM_BASES
QUICK_ARMS: tuple[str, ...] = ("stock", "ours")
REGIME_NAMES: tuple[str, ...] = ("calibrated", "cheap-recompute")
WORKLOADS: tuple[str, ...] = ("trace", "swe", "toy")
DEFAULT_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
QUICK_FACTORS: tuple[float, ...] = (1.0, 3.0)
TRACE_SYSTEM_TOKENS = 1000  # shared system prompt assumed when replaying the trace
SAMPLE_AGENTS = 256  # synthetic plans sampled to size the capacity
BUILTIN_LOG_FILTER = "info,thunderagent=debug"  # the builtin's state-change lines are debug

# The "measured here" agents of workload.md (and the simulator's cheap-recompute preset).
TOY_SPEC = WorkloadSpec(
    turns=(10, 20),
    system_prompt_tokens=500,
    first_turn_tokens=(200, 800),
    tool_output_tokens=(100, 300),
    output_tokens=(32, 64),
    tool_time=(
        ToolTimeComponent(weight=1.0, kind="lognormal", scale=0.5, shape=0.8, cap_seconds=60.0),
    ),
    session_prefix="toy",
)
SWE_SPEC = WorkloadSpec(session_prefix="swe")


# ============================================================================================
# Arms
# ============================================================================================


@dataclass(frozen=True)
class ArmSpec:
    """An arm of the comparison: a LocalStack arm, a display label, a policy file."""

    label: str
    base: str
    policy: Path | None = None

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "base": self.base, "policy": _rel(self.policy)}


def parse_arm(
    text: str, *, ours_policy: Path | None = None, builtin_policy: Path | None = None
) -> ArmSpec:
    """``stock`` | ``builtin`` | ``dynamo-python`` | ``ours`` | ``<base>:<label>=<policy>``.

    A labelled arm (base ``ours`` or ``builtin``) runs with its own policy file and is named
    ``<base>:<label>``. Raises ValueError naming what is wrong.
    """
    text = text.strip()
    if ":" in text:
        base, _, rest = text.partition(":")
        label, eq, path = rest.partition("=")
        if base not in ("ours", "builtin") or not eq or not label.strip() or not path.strip():
            raise ValueError(
                f"arm {text!r}: an ablation arm is ours:<label>=<policy.yaml> "
                "(or builtin:<label>=<policy.yaml>)"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", label.strip()):
            raise ValueError(f"arm {text!r}: label may use letters, digits and _.+- only")
        return ArmSpec(f"{base}:{label.strip()}", base, Path(path.strip()))
    if text not in ARM_BASES:
        raise ValueError(f"unknown arm {text!r}; choose from {', '.join(ARM_BASES)}")
    if text == "ours":
        return ArmSpec("ours", "ours", ours_policy or EXTENDED_POLICY)
    if text == "builtin":
        return ArmSpec("builtin", "builtin", builtin_policy or PARITY_POLICY)
    return ArmSpec(text, text)


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
        data["trace"] = _rel(self.trace)
        return data


def default_setup(regime: str) -> RegimeSetup:
    """The defaults of a regime (see the module docstring)."""
    if regime == "calibrated":
        from dynamo_thunderagent.bench.calibration import DEFAULT_TIMING

        return RegimeSetup(
            regime="calibrated",
            workload="trace" if DEFAULT_TRACE.is_file() else "swe",
            token_scale=0.1,
            time_scale=0.25,
            speedup_ratio=1.0,
            client_overhead_s=DEFAULT_TIMING.request_overhead_s,
            max_agents=24,
            trace=DEFAULT_TRACE,
        )
    if regime == "cheap-recompute":
        return RegimeSetup(
            regime="cheap-recompute",
            workload="toy",
            token_scale=1.0,
            time_scale=1.0,
            speedup_ratio=1.0,
            client_overhead_s=0.0,
            max_agents=30,
            trace=DEFAULT_TRACE,
        )
    raise ValueError(f"unknown regime {regime!r}; choose from {REGIME_NAMES}")


def _scaled(spec: WorkloadSpec, setup: RegimeSetup) -> WorkloadSpec:
    return dataclasses.replace(spec, token_scale=setup.token_scale, time_scale=setup.time_scale)


def base_plans(setup: RegimeSetup, seed: int) -> Iterator[AgentPlan]:
    """The regime's endless agent stream (scaled; client overhead not yet added)."""
    if setup.workload == "trace":
        assert setup.trace is not None
        plans = _trace_plans(setup.trace, setup.token_scale, setup.time_scale,
                             setup.system_prompt_tokens)  # fmt: skip
        return replay_stream(plans, seed)
    spec = TOY_SPEC if setup.workload == "toy" else SWE_SPEC
    return agent_stream(_scaled(spec, setup), seed)


_TRACE_CACHE: dict[tuple[str, float, float, int], list[AgentPlan]] = {}


def _trace_plans(path: Path, token_scale: float, time_scale: float, system: int) -> list[AgentPlan]:
    key = (str(path), token_scale, time_scale, system)
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = load_trace(path, token_scale, time_scale, system_prompt_tokens=system)
    return _TRACE_CACHE[key]


def with_overhead(plan: AgentPlan, seconds: float) -> AgentPlan:
    """``plan`` with ``seconds`` added to every tool gap (not after the last turn)."""
    if seconds <= 0:
        return plan
    last = len(plan.turns) - 1
    turns = tuple(
        dataclasses.replace(t, tool_seconds=t.tool_seconds + seconds) if k < last else t
        for k, t in enumerate(plan.turns)
    )
    return dataclasses.replace(plan, turns=turns)


def start_at(plan: AgentPlan, turn: int) -> AgentPlan:
    """``plan`` joined at ``turn``: its first prompt is the whole history up to ``turn``.

    The prompt sizes of the remaining turns are unchanged; the session id gets ``@<turn>``.
    """
    if not 0 <= turn < len(plan.turns):
        raise ValueError(f"turn {turn} out of range for a plan of {len(plan.turns)} turns")
    if turn == 0:
        return plan
    first = dataclasses.replace(
        plan.turns[turn], new_tokens=plan.prompt_tokens(turn) - plan.system_tokens
    )
    return AgentPlan(f"{plan.session_id}@{turn}", plan.system_tokens,
                     (first, *plan.turns[turn + 1 :]))  # fmt: skip


def warm_start(plans: Iterator[AgentPlan], count: int, seed: int) -> Iterator[AgentPlan]:
    """The first ``count`` plans joined at a seeded uniform turn; the rest unchanged."""
    rng = random.Random(f"{seed}:warm-start")
    for index, plan in enumerate(plans):
        yield start_at(plan, rng.randrange(len(plan.turns))) if index < count else plan


def run_plans(setup: RegimeSetup, seed: int, agents: int) -> Iterator[AgentPlan]:
    """The stream one run replays: base plans, client overhead, warm start of the first N."""
    overhead = setup.client_overhead_s * setup.time_scale
    stream = (with_overhead(p, overhead) for p in base_plans(setup, seed))
    return warm_start(stream, agents, seed)


@dataclass(frozen=True)
class WorkloadShape:
    """Peak contexts of the workload (mocker tokens), for sizing."""

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
    peaks = [p.peak_context_tokens for p in plans]
    return WorkloadShape(sum(peaks) / len(peaks), max(peaks), len(peaks))


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


# ============================================================================================
# Observers: scheduler figures per arm
# ============================================================================================

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
_PY_EVENT = re.compile(r"thunderagent\.program (paused|resumed) .*\bpaused=(\d+)")
_BUILTIN_STATE = re.compile(r"ThunderAgent scheduler state changed .*\bpaused_programs=(\d+)")
_BUILTIN_FORCED = re.compile(r"forced program resumes .*\bforced_resumes=(\d+)")


def _log_time(line: str) -> float | None:
    match = _TS.match(line)
    if match is None:
        return None
    stamp = dt.datetime.fromisoformat(match.group(1)).replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def time_weighted(samples: Sequence[tuple[float, float]], start: float, stop: float,
                  initial: float = 0.0) -> tuple[float | None, float | None]:  # fmt: skip
    """(mean, max) of a step function over ``[start, stop)``.

    ``samples``: ``(time, value)`` changes in time order; the value before the first sample
    is ``initial``. None, None for an empty interval.
    """
    if stop <= start:
        return None, None
    value = initial
    for t, v in samples:
        if t > start:
            break
        value = v
    area = 0.0
    peak = value
    cursor = start
    for t, v in samples:
        if t <= start:
            continue
        if t >= stop:
            break
        area += value * (t - cursor)
        cursor, value = t, v
        peak = max(peak, value)
    area += value * (stop - cursor)
    return area / (stop - start), peak


def parse_python_router_log(text: str) -> dict[str, Any]:
    """Pauses, resumes and the paused-count samples of ``dynamo.thunderagent_router``'s log."""
    pauses = resumes = 0
    samples: list[tuple[float, float]] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _PY_EVENT.search(line)
        if match is None:
            continue
        if match.group(1) == "paused":
            pauses += 1
        else:
            resumes += 1
        when = _log_time(line)
        if when is not None:
            samples.append((when, float(match.group(2))))
    return {"pauses": pauses, "resumes": resumes, "samples": samples}


def parse_builtin_log(text: str) -> dict[str, Any]:
    """Paused-count samples and forced resumes of Dynamo's builtin ThunderAgent (debug log)."""
    samples: list[tuple[float, float]] = []
    forced = 0
    seen = False
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _BUILTIN_STATE.search(line)
        if match is not None:
            seen = True
            when = _log_time(line)
            if when is not None:
                samples.append((when, float(match.group(1))))
            continue
        forced_match = _BUILTIN_FORCED.search(line)
        if forced_match is not None:
            forced = max(forced, int(forced_match.group(1)))
    return {"samples": samples, "forced_resumes": forced, "seen": seen}


EMPTY_FIGURES: dict[str, Any] = {
    "pauses": None,
    "resumes": None,
    "moves": None,
    "forced_resumes": None,
    "paused_mean": None,
    "paused_max": None,
    "admission_wait_p50_s": None,
    "admission_wait_p99_s": None,
    "admission_wait_max_s": None,
}


class Observer:
    """Collects an arm's scheduler figures (see the module docstring for what each arm has).

    ``window``: the steady window ``(warmup_s, window_s)`` relative to the run's start.
    """

    def __init__(self, base: str, window: tuple[float, float], poll_s: float = 1.0) -> None:
        self.base = base
        self.window = window
        self.poll_s = poll_s
        self.t0 = 0.0
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_offsets: dict[str, int] = {}

    def start(self, stack: LocalStack) -> None:
        self.t0 = time.time()
        for proc in stack.processes:
            with contextlib.suppress(OSError):
                self._log_offsets[proc.name] = proc.log_path.stat().st_size
        if self.base == "ours" and stack.state_url is not None:
            url = stack.state_url
            self._thread = threading.Thread(target=self._poll, args=(url,), daemon=True)
            self._thread.start()

    def _poll(self, url: str) -> None:
        while not self._stop.is_set():
            state = get_json(url, timeout=2.0)
            if state is not None:
                paused = (state.get("scheduler") or {}).get("paused")
                if isinstance(paused, int):
                    self.samples.append((time.time(), float(paused)))
            self._stop.wait(self.poll_s)

    def _log(self, stack: LocalStack, role: str) -> str:
        for proc in stack.processes:
            if proc.role == role:
                with contextlib.suppress(OSError), proc.log_path.open("rb") as fh:
                    fh.seek(self._log_offsets.get(proc.name, 0))
                    return fh.read().decode("utf-8", errors="replace")
        return ""

    def _paused(self, samples: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
        lo, hi = self.window
        return time_weighted(samples, self.t0 + lo, self.t0 + hi)

    def finish(self, stack: LocalStack, run: RunResult) -> dict[str, Any]:
        figures = dict(EMPTY_FIGURES)
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
        if self.base == "ours":
            state = get_json(stack.state_url) if stack.state_url else None
            if state is not None:
                figures.update(scheduler_figures(state))
            else:
                figures["state_error"] = "no /state"
            figures["paused_mean"], figures["paused_max"] = self._paused(self.samples)
        elif self.base == "dynamo-python":
            parsed = parse_python_router_log(self._log(stack, "router"))
            figures["pauses"], figures["resumes"] = parsed["pauses"], parsed["resumes"]
            figures["paused_mean"], figures["paused_max"] = self._paused(parsed["samples"])
        elif self.base == "builtin":
            parsed = parse_builtin_log(self._log(stack, "frontend"))
            if parsed["seen"]:
                figures["forced_resumes"] = parsed["forced_resumes"]
                figures["paused_mean"], figures["paused_max"] = self._paused(parsed["samples"])
        return figures


# ============================================================================================
# Per-run rows and aggregation (pure)
# ============================================================================================


def steady_figures(records: Iterable[Any], start: float, stop: float) -> dict[str, Any]:
    """Steady-window hit rate and turn latency of one run.

    ``hit_rate``: cached / prompt tokens of the successful turns that completed in
    ``[start, stop)``. Latency: every turn that *started* in ``[start, stop)`` and did not
    fail; a turn still waiting when the drain ended (``cancelled``) counts with its time so
    far, a lower bound, so that arms that hold turns back cannot hide their tail by never
    finishing them (``latency_censored`` counts those).
    """
    done = [
        r for r in records
        if r.kind == "turn" and r.error is None and not r.cancelled and start <= r.end < stop
    ]  # fmt: skip
    prompt = sum(r.prompt_tokens or 0 for r in done if r.prompt_tokens is not None)
    cached = sum(r.cached_tokens or 0 for r in done if r.prompt_tokens is not None)
    started = [
        r for r in records if r.kind == "turn" and r.error is None and start <= r.start < stop
    ]
    latencies = sorted(r.end - r.start for r in started)
    return {
        "hit_rate": cached / prompt if prompt else None,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "latency_censored": sum(1 for r in started if r.cancelled),
        "latencies": latencies,
    }


ROW_METRICS: tuple[str, ...] = (
    "steps_per_min", "hit_rate", "hit_rate_all", "recomputed_tokens", "recomputed_fraction",
    "latency_p50_s", "latency_p99_s", "admission_wait_p50_s", "admission_wait_p99_s",
    "admission_wait_max_s", "pauses", "resumes", "moves", "forced_resumes", "paused_mean",
    "paused_max", "errors", "cancelled", "turns_ok", "steady_turns", "agents_completed",
    "latency_censored",
)  # fmt: skip
# How a cell's headline value combines its repeats (default: mean).
SUMMED = frozenset({"errors"})
MAXED = frozenset({"admission_wait_max_s", "paused_max"})


def make_row(
    key: RunKey, result: ArmResult, *, pressure: float, warmup_s: float, window_s: float
) -> dict[str, Any]:
    """The JSON row of one run: its key, metrics (steady-window hit rate and latency),
    scheduler figures and steady-window turn latencies (ms resolution)."""
    row: dict[str, Any] = {
        "regime": key.regime, "repeat": key.repeat, "agents": key.agents, "arm": key.arm,
        "index": key.index, "position": key.position, "pressure": round(pressure, 3),
        "elapsed_s": round(result.elapsed_s, 2), "agents_started": result.agents_started,
        "error": result.error,
    }  # fmt: skip
    for name in ROW_METRICS:
        row[name] = None
    row["errors_by_type"] = {}
    row["turn_latencies_s"] = []
    if result.metrics is not None:
        m = result.metrics.to_dict()
        for name in ROW_METRICS:
            if name in m:
                row[name] = m[name]
        row["hit_rate_all"] = m["hit_rate"]
        row["errors_by_type"] = m["errors_by_type"]
    if result.run is not None:
        steady = steady_figures(result.run.records, warmup_s, window_s)
        row["hit_rate"] = steady["hit_rate"]
        row["latency_p50_s"] = steady["latency_p50_s"]
        row["latency_p99_s"] = steady["latency_p99_s"]
        row["latency_censored"] = steady["latency_censored"]
        row["turn_latencies_s"] = [round(x, 3) for x in steady["latencies"]]
    for name, value in result.scheduler.items():
        if name in ROW_METRICS and row.get(name) is None:
            row[name] = value
    row["scheduler"] = dict(result.scheduler)
    return row


def _combine(name: str, values: list[float]) -> float:
    if name in SUMMED:
        return float(sum(values))
    if name in MAXED:
        return max(values)
    return sum(values) / len(values)


def aggregate_cell(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One arm x N cell over its repeats.

    Headline values: the mean over the runs that reported the figure (``errors``: the sum;
    ``admission_wait_max_s`` and ``paused_max``: the max); None when no run did. ``spread``
    holds mean, min, max and the values per figure. Failed runs (an ``error``) count in
    ``failed_runs`` and contribute no figures.
    """
    if not rows:
        raise ValueError("aggregate_cell needs at least one row")
    ok = [r for r in rows if r.get("error") is None]
    cell: dict[str, Any] = {
        "arm": rows[0]["arm"],
        "agents": rows[0]["agents"],
        "pressure": rows[0].get("pressure"),
        "runs": len(rows),
        "failed_runs": len(rows) - len(ok),
        "run_errors": [r["error"] for r in rows if r.get("error") is not None],
    }
    spread: dict[str, dict[str, Any]] = {}
    for name in ROW_METRICS:
        values = [float(r[name]) for r in ok if r.get(name) is not None]
        if not values:
            cell[name] = None
            continue
        cell[name] = _combine(name, values)
        spread[name] = {
            "mean": sum(values) / len(values),
            "min": min(values),
            "max": max(values),
            "values": values,
        }
    cell["spread"] = spread
    return cell


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """``{regime: {arm: {N: cell}}}`` (arms and N in first-seen order); ratios to ``stock``
    (``steps_per_min_vs_stock``) where stock has a value at the same N."""
    grouped: dict[str, dict[str, dict[int, list[Mapping[str, Any]]]]] = {}
    for row in rows:
        grouped.setdefault(row["regime"], {}).setdefault(row["arm"], {}).setdefault(
            int(row["agents"]), []
        ).append(row)
    out: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for regime, arms in grouped.items():
        cells = {
            arm: {n: aggregate_cell(rs) for n, rs in sorted(by_n.items())}
            for arm, by_n in arms.items()
        }
        stock = cells.get("stock", {})
        for by_n in cells.values():
            for n, cell in by_n.items():
                base = stock.get(n, {}).get("steps_per_min")
                value = cell.get("steps_per_min")
                cell["steps_per_min_vs_stock"] = (
                    value / base if value is not None and base else None
                )
        out[regime] = cells
    return out


def build_report(
    rows: Sequence[Mapping[str, Any]],
    *,
    config: Mapping[str, Any],
    arm_order: Sequence[str],
    regime_order: Sequence[str],
    agents: Mapping[str, Sequence[int]],
    meta: Mapping[str, Any] | None = None,
    include_samples: bool = True,
) -> dict[str, Any]:
    """The report: config, per-regime aggregates, the first regime's arms at top level, runs.

    ``report["regimes"][regime]["arms"][arm]`` is the arm's cell at the regime's largest N
    plus ``by_n`` (``{str(N): cell}``); ``report["arms"]`` is the same for the first regime
    (named by ``report["regime"]``). ``include_samples=False`` drops the per-run latency
    samples from ``runs``.
    """
    cells = aggregate(rows)
    regimes: dict[str, Any] = {}
    for regime in regime_order:
        counts = list(agents.get(regime, ()))
        largest = counts[-1] if counts else None
        arms_out: dict[str, Any] = {}
        for arm in arm_order:
            by_n = cells.get(regime, {}).get(arm, {})
            if not by_n:
                continue
            top = by_n.get(largest) if largest is not None else None
            entry: dict[str, Any] = dict(top) if top is not None else {"agents": largest}
            entry["by_n"] = {str(n): c for n, c in by_n.items()}
            arms_out[arm] = entry
        regimes[regime] = {"agents": counts, "largest_agents": largest, "arms": arms_out}
    first = regime_order[0] if regime_order else None
    runs = [dict(r) for r in rows]
    if not include_samples:
        for r in runs:
            r.pop("turn_latencies_s", None)
    failures = [
        {k: r.get(k) for k in ("regime", "repeat", "agents", "arm", "error")}
        for r in rows if r.get("error") is not None
    ]  # fmt: skip
    return {
        "schema": SCHEMA,
        **(dict(meta) if meta else {}),
        "config": dict(config),
        "regime": first,
        "arms": regimes[first]["arms"] if first is not None else {},
        "regimes": regimes,
        "failures": failures,
        "total_errors": sum(int(r.get("errors") or 0) for r in rows),
        "runs": runs,
    }


# ============================================================================================
# Markdown
# ============================================================================================


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _spread_cell(cell: Mapping[str, Any] | None, name: str, spec: str) -> str:
    if cell is None:
        return "not run"
    if cell.get(name) is None:
        failed = cell.get("failed_runs")
        return f"failed ({failed}/{cell['runs']} runs)" if failed else "-"
    s = cell.get("spread", {}).get(name)
    text = format(cell[name], spec)
    if s and len(s["values"]) > 1:
        text += f" ({format(s['min'], spec)}-{format(s['max'], spec)})"
    if cell.get("failed_runs"):
        text += f" [{cell['failed_runs']}/{cell['runs']} runs failed]"
    return text


def render_markdown(report: Mapping[str, Any]) -> str:
    """Markdown tables per regime: steps/min and hit rate vs N (mean, min-max over repeats),
    steps/min relative to stock, and every figure at the largest N."""
    config = report.get("config", {})
    out: list[str] = []
    for regime, data in report.get("regimes", {}).items():
        failures = [f for f in report.get("failures", []) if f.get("regime") == regime]
        out += _regime_markdown(regime, data, config, failures)
    out.append(
        "Means over repeats (errors: summed; admission wait max and paused max: the max); "
        "counts (pauses, recomputed tokens) are per run. '-' = not measurable for that arm "
        "(stock has no admission control; builtin exposes no counters; moves and admission "
        "wait are measured by our router only)."
    )
    return "\n".join(out) + "\n"


def _regime_markdown(
    regime: str, data: Mapping[str, Any], config: Mapping[str, Any],
    failures: Sequence[Mapping[str, Any]],
) -> list[str]:  # fmt: skip
    counts: list[int] = list(data.get("agents", []))
    arms: Mapping[str, Any] = data.get("arms", {})
    rc = config.get("regimes", {}).get(regime, {})
    sweep = rc.get("sweep", {})
    setup = rc.get("setup", {})
    pressures = dict(zip(sweep.get("agents", []), sweep.get("pressures", []), strict=False))
    out = [f"### Regime `{regime}`", ""]
    if setup:
        out.append(
            f"Workload `{setup.get('workload')}` (token scale {setup.get('token_scale')}, "
            f"time scale {setup.get('time_scale')}); {config.get('workers')} mocker workers x "
            f"{sweep.get('num_gpu_blocks')} blocks x {config.get('block_size')} tokens = "
            f"{sweep.get('capacity_tokens', 0):,} KV tokens; mean peak context "
            f"{sweep.get('mean_peak_tokens')} tokens; window {config.get('window_s')} s "
            f"(steady after {config.get('warmup_s')} s); {config.get('repeats')} repeat(s), "
            "arms interleaved."
        )
        out.append("")

    def head(title: str) -> list[str]:
        cols = [f"N={n} ({pressures.get(n, 0):.1f}x)" for n in counts]
        return [title, "", "| arm | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def by_n(arm: str) -> dict[str, Any]:
        result: dict[str, Any] = arms.get(arm, {}).get("by_n", {})
        return result

    out += head("Steps/min (mean over repeats, min-max in brackets):")
    for arm in arms:
        cells = [_spread_cell(by_n(arm).get(str(n)), "steps_per_min", ".0f") for n in counts]
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    out.append("")
    if "stock" in arms and len(arms) > 1:
        out += head("Steps/min relative to stock (ratio of means):")
        for arm in arms:
            ratios = [(by_n(arm).get(str(n)) or {}).get("steps_per_min_vs_stock") for n in counts]
            cells = ["-" if r is None else f"{r:.2f}x" for r in ratios]
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        out.append("")
    out += head("Prefix-cache hit rate (steady window):")
    for arm in arms:
        cells = [_spread_cell(by_n(arm).get(str(n)), "hit_rate", ".2f") for n in counts]
        out.append(f"| {arm} | " + " | ".join(cells) + " |")
    out.append("")
    if counts:
        n = counts[-1]
        out += [
            f"At N={n} ({pressures.get(n, 0):.1f}x capacity):",
            "",
            "| arm | steps/min | vs stock | hit rate | recomputed tokens | turn p50 / p99 (s) "
            "| admission wait p50 / p99 / max (s) | paused (mean / max) "
            "| pauses / resumes / moves | errors | failed runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            c = by_n(arm).get(str(n))
            if c is None:
                out.append(f"| {arm} | not run |" + " |" * 9)
                continue
            out.append(_largest_row(arm, c))
        out.append("")
    for f in failures:
        out.append(
            f"- failed: {f['arm']} at N={f['agents']} (repeat {f['repeat'] + 1}): {f['error']}"
        )
    if failures:
        out.append("")
    return out


def _largest_row(arm: str, c: Mapping[str, Any]) -> str:
    ratio = c.get("steps_per_min_vs_stock")
    cells = [
        arm,
        _spread_cell(c, "steps_per_min", ".0f"),
        "-" if ratio is None else f"{ratio:.2f}x",
        _f(c.get("hit_rate"), ".3f"),
        _f(c.get("recomputed_tokens"), ",.0f"),
        f"{_f(c.get('latency_p50_s'), '.2f')} / {_f(c.get('latency_p99_s'), '.2f')}",
        " / ".join(_f(c.get(k), ".2f") for k in (
            "admission_wait_p50_s", "admission_wait_p99_s", "admission_wait_max_s")),
        f"{_f(c.get('paused_mean'), '.1f')} / {_f(c.get('paused_max'), '.0f')}",
        " / ".join(_f(c.get(k), ".0f") for k in ("pauses", "resumes", "moves")),
        _f(c.get("errors"), ".0f"),
        str(c.get("failed_runs", 0)),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


# ============================================================================================
# Progress
# ============================================================================================


class ProgressView:
    """A progress bar over the scheduled runs on ``stream`` (tqdm on a terminal, else lines)."""

    def __init__(self, total: int, expected_run_s: float, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.expected_run_s = expected_run_s
        self.stream = stream
        self.t0 = time.monotonic()
        self._bar: Any = None
        if stream.isatty():
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self._bar = tqdm(total=total, file=stream, unit="run", dynamic_ncols=True)

    def say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def begin(self, key: RunKey, repeats: int) -> None:
        label = f"{key.regime} rep {key.repeat + 1}/{repeats} N={key.agents} {key.arm}"
        if self._bar is not None:
            self._bar.set_description(label)
            return
        elapsed = time.monotonic() - self.t0
        per_run = elapsed / self.done if self.done else self.expected_run_s
        eta = per_run * (self.total - self.done)
        self.say(
            f"== run {self.done + 1}/{self.total} ({100 * self.done / self.total:.0f}%, "
            f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left): {label}"
        )

    def end(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# ============================================================================================
# Configuration and the run
# ============================================================================================


@dataclass
class LiveConfig:
    """Everything a sweep depends on (written into the report)."""

    regimes: tuple[str, ...] = ("calibrated",)
    arms: tuple[ArmSpec, ...] = tuple(ArmSpec(a, a) for a in DEFAULT_ARMS)
    repeats: int = 3
    factors: tuple[float, ...] = DEFAULT_FACTORS
    agents: tuple[int, ...] | None = None
    max_agents: int | None = None  # None: the regime's default
    num_gpu_blocks: int | None = None
    workers: int = 2
    block_size: int = 16
    window_s: float = 40.0
    warmup_s: float = 10.0
    drain_s: float = 5.0
    request_timeout_s: float = 300.0
    seed: int = 0
    workload: str = "auto"
    trace: Path | None = None
    token_scale: float | None = None
    time_scale: float | None = None
    out_dir: Path = field(default_factory=lambda: default_out_dir())
    plots: bool = True
    quick: bool = False

    def setup(self, regime: str) -> RegimeSetup:
        base = default_setup(regime)
        changes: dict[str, Any] = {}
        if self.workload != "auto":
            changes["workload"] = self.workload
        if self.trace is not None:
            changes["trace"] = self.trace
        if self.token_scale is not None:
            changes["token_scale"] = self.token_scale
        if self.time_scale is not None:
            changes["time_scale"] = self.time_scale
        if self.max_agents is not None:
            changes["max_agents"] = self.max_agents
        setup = dataclasses.replace(base, **changes)
        setup.validate()
        return setup

    def describe(self) -> dict[str, Any]:
        return {
            "regime_names": list(self.regimes),
            "arms": [a.describe() for a in self.arms],
            "repeats": self.repeats,
            "factors": list(self.factors),
            "agents": list(self.agents) if self.agents else None,
            "workers": self.workers,
            "block_size": self.block_size,
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "drain_s": self.drain_s,
            "request_timeout_s": self.request_timeout_s,
            "seed": self.seed,
            "quick": self.quick,
            "out_dir": str(self.out_dir),
        }


def default_out_dir() -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("bench-results") / stamp


@dataclass
class PreparedRegime:
    """A regime ready to run: its setup, sweep and mocker flags."""

    setup: RegimeSetup
    sweep: SweepPlan
    mocker_args: list[str]

    def describe(self) -> dict[str, Any]:
        return {
            "setup": self.setup.describe(),
            "sweep": self.sweep.describe(),
            "mocker_args": self.mocker_args,
            "real_capacity_tokens": round(self.sweep.capacity_tokens / self.setup.token_scale),
        }


def prepare_regime(config: LiveConfig, regime: str, work_dir: Path) -> PreparedRegime:
    """Size the regime and write its mocker profile (calibrated) under ``work_dir``."""
    from dynamo_thunderagent.bench.calibration import REGIMES, StackGeometry

    setup = config.setup(regime)
    shape = workload_shape(setup, config.seed)
    sweep = plan_sweep(
        shape, max_agents=setup.max_agents, factors=config.factors, agents=config.agents,
        num_workers=config.workers, block_size=config.block_size,
        num_gpu_blocks=config.num_gpu_blocks,
    )  # fmt: skip
    geometry = StackGeometry(sweep.num_gpu_blocks, config.block_size, setup.speedup_ratio)
    mocker_args = REGIMES[regime].mocker_args(
        work_dir / f"profile-{regime}", setup.token_scale, setup.time_scale,
        speedup_ratio=setup.speedup_ratio, geometry=geometry,
    )  # fmt: skip
    return PreparedRegime(setup, sweep, mocker_args)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        info["ai_dynamo"] = version("ai-dynamo")
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    info["code"] = code_version()
    return info


def code_version() -> str | None:
    """``DTA_CODE_VERSION`` if set (e.g. for a snapshot without git), else the checkout's
    ``git describe --always --dirty``, else None."""
    if os.environ.get("DTA_CODE_VERSION"):
        return os.environ["DTA_CODE_VERSION"]
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5, check=True,
        )  # fmt: skip
        return done.stdout.strip() or None
    return None


def run_live(config: LiveConfig, *, as_json: bool, out: TextIO = sys.stdout,
             err: TextIO = sys.stderr) -> int:  # fmt: skip
    """Run the sweep, write the outputs, print the table (or the JSON report).

    Returns 0 when every run finished with zero errors, 1 otherwise.
    """
    config.out_dir.mkdir(parents=True, exist_ok=True)
    started_at = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    prepared = {r: prepare_regime(config, r, config.out_dir) for r in config.regimes}
    arms = {a.label: a for a in config.arms}
    agents = {r: list(p.sweep.agents) for r, p in prepared.items()}
    schedule = interleave(config.regimes, agents, list(arms), config.repeats)
    per_run = config.window_s + config.drain_s / 2 + 4.0
    view = ProgressView(len(schedule), per_run, err)
    described = config.describe()
    described["regimes"] = {r: p.describe() for r, p in prepared.items()}
    meta = {"machine": machine_info(), "started_at": started_at.isoformat(timespec="seconds")}
    for regime, p in prepared.items():
        view.say(
            f"bench live: {regime}: {config.workers} workers x {p.sweep.num_gpu_blocks} blocks x "
            f"{config.block_size} = {p.sweep.capacity_tokens:,} KV tokens; workload "
            f"{p.setup.workload}, mean peak context {p.sweep.mean_peak_tokens:,.0f} tokens; "
            f"N = {', '.join(str(n) for n in p.sweep.agents)} ("
            + ", ".join(f"{x:.2f}x" for x in p.sweep.pressures) + " capacity)"
            + (f"; note: {p.sweep.note}" if p.sweep.note else "")
        )
    view.say(
        f"bench live: {len(schedule)} runs ({len(arms)} arms x {config.repeats} repeats), about "
        f"{len(schedule) * per_run / 60:.0f} min; writing {config.out_dir}"
    )
    rows: list[dict[str, Any]] = []

    def report(include_samples: bool = True) -> dict[str, Any]:
        extra = dict(meta)
        extra["elapsed_s"] = round(time.monotonic() - t0, 1)
        extra["runs_done"] = len(rows)
        extra["runs_scheduled"] = len(schedule)
        return build_report(
            rows, config=described, arm_order=list(arms), regime_order=list(config.regimes),
            agents=agents, meta=extra, include_samples=include_samples,
        )  # fmt: skip

    try:
        for key in schedule:
            view.begin(key, config.repeats)
            rows.append(_one_run(key, arms[key.arm], prepared[key.regime], config, view.say))
            view.end()
            _write_json(config.out_dir / "results.json", report())
    finally:
        view.close()
    final = report()
    final["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    _write_json(config.out_dir / "results.json", final)
    markdown = render_markdown(final)
    (config.out_dir / "results.md").write_text(markdown, encoding="utf-8")
    if config.plots:
        try:
            from dynamo_thunderagent.bench.plots import write_plots

            written = write_plots(final, config.out_dir)
            view.say("plots: " + ", ".join(str(p) for p in written))
        except ImportError as error:
            view.say(f"plots skipped ({error}); install matplotlib")
    view.say(f"bench live: done in {(time.monotonic() - t0) / 60:.1f} min; {config.out_dir}")
    if as_json:
        stdout_report = report(include_samples=False)
        stdout_report["finished_at"] = final["finished_at"]
        print(json.dumps(stdout_report, indent=1), file=out, flush=True)
    else:
        print(markdown, file=out, flush=True)
    clean = all(r["error"] is None and not r.get("errors") for r in rows)
    return 0 if clean else 1


def _one_run(
    key: RunKey, arm: ArmSpec, prepared: PreparedRegime, config: LiveConfig,
    say: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    setup, sweep = prepared.setup, prepared.sweep
    extra_env = {"DYN_LOG": BUILTIN_LOG_FILTER} if arm.base == "builtin" else {}
    spec = RunSpec(
        arm=arm.base,
        label=arm.label,
        plans=lambda: run_plans(setup, config.seed, key.agents),
        agents=key.agents,
        window_s=config.window_s,
        warmup_s=config.warmup_s,
        drain_s=config.drain_s,
        request_timeout_s=config.request_timeout_s,
        num_workers=config.workers,
        num_gpu_blocks=sweep.num_gpu_blocks,
        block_size=config.block_size,
        speedup_ratio=setup.speedup_ratio,
        policy=arm.policy,
        mocker_args=prepared.mocker_args,
        extra_env=extra_env,
        job=f"live-{setup.regime}-{config.seed}",
    )
    observer = Observer(arm.base, (config.warmup_s, config.window_s))
    result = run_stack(spec, say, observer)
    return make_row(
        key, result, pressure=sweep.pressure_of(key.agents),
        warmup_s=config.warmup_s, window_s=config.window_s,
    )  # fmt: skip


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _rel(path: Path | None) -> str | None:
    if path is None:
        return None
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    return str(path)


# ============================================================================================
# Command line
# ============================================================================================


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bench live`` (``--quick`` changes the defaults of the ones left unset)."""
    a = parser.add_argument
    a("--regime", choices=[*REGIME_NAMES, "all"], default="calibrated",
      help="timing regime (default calibrated; all = both)")
    a("--arms", default=None,
      help="comma-separated arms in order: stock, builtin, dynamo-python, ours, or "
           "ours:<label>=<policy.yaml> (default: all four; --quick: stock,ours)")
    a("--arm-policy", action="append", default=[], metavar="LABEL=PATH",
      help="add an ablation arm ours:LABEL running our router with PATH (repeatable)")
    a("--policy", type=Path, default=None,
      help="router-policy YAML of arm ours (default policies/thunderagent-extended.yaml)")
    a("--builtin-policy", type=Path, default=None,
      help="router-policy YAML of arm builtin (default policies/thunderagent.yaml)")
    a("--repeats", type=int, default=None, help="repeats of every arm x N (default 3; quick 1)")
    a("--factors", default=None,
      help="pressures to sweep, x KV capacity (default 0.5,1,2,3; quick 1,3)")
    a("--max-agents", type=int, default=None,
      help="N at the largest factor (default: calibrated 24, cheap-recompute 30)")
    a("--agents", default=None, help="explicit comma-separated N values (overrides --factors)")
    a("--blocks", type=int, default=None, help="KV blocks per worker (overrides the sizing)")
    a("--workers", type=int, default=2, help="mocker workers (default 2)")
    a("--window", type=float, default=None, help="seconds of turns per run (default 40; quick 30)")
    a("--warmup", type=float, default=None,
      help="seconds dropped from the steady window (default 10; quick 8)")
    a("--drain", type=float, default=5.0, help="most seconds for turns in flight (default 5)")
    a("--request-timeout", type=float, default=300.0, help="client timeout per request")
    a("--seed", type=int, default=0)
    a("--workload", choices=["auto", *WORKLOADS], default="auto",
      help="agents: auto (calibrated: trace, cheap-recompute: toy), trace, swe, toy")
    a("--trace", type=Path, default=None, help="trace JSONL for --workload trace")
    a("--token-scale", type=float, default=None, help="override the regime's token scale")
    a("--time-scale", type=float, default=None, help="override the regime's time scale")
    a("--out", type=Path, default=None, help="output folder (default bench-results/<UTC time>/)")
    a("--no-plots", action="store_true", help="skip the PNG plots")
    a("--dry-run", action="store_true", help="print the sizing and schedule, run nothing")
    a("--quick", action="store_true",
      help="a short check (under 5 min): calibrated, stock and ours, N at 1x and 3x, 1 repeat")
    a("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from error
    if not values:
        raise ValueError(f"{what}: empty")
    return values


def config_from_args(args: argparse.Namespace) -> LiveConfig:
    """Validate the command line; raise ValueError naming the bad option."""
    quick = bool(args.quick)
    regimes = REGIME_NAMES if args.regime == "all" else (args.regime,)
    arms_text = args.arms or ",".join(QUICK_ARMS if quick else DEFAULT_ARMS)
    arms = parse_arms(arms_text, args.arm_policy, ours_policy=args.policy,
                      builtin_policy=args.builtin_policy)  # fmt: skip
    repeats = args.repeats if args.repeats is not None else (1 if quick else 3)
    factors = _floats(args.factors, "--factors") if args.factors else (
        QUICK_FACTORS if quick else DEFAULT_FACTORS)  # fmt: skip
    agents = None
    if args.agents:
        agents = tuple(int(x) for x in _floats(args.agents, "--agents"))
    window = args.window if args.window is not None else (30.0 if quick else 40.0)
    warmup = args.warmup if args.warmup is not None else (8.0 if quick else 10.0)
    if repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if any(f <= 0 for f in factors):
        raise ValueError("--factors must be > 0")
    if agents is not None and min(agents) < 1:
        raise ValueError("--agents must be >= 1")
    if not 0 <= warmup < window:
        raise ValueError(f"--warmup must be in [0, --window), got {warmup}")
    if args.drain < 0 or args.request_timeout <= 0 or args.workers < 1:
        raise ValueError("--drain must be >= 0, --request-timeout > 0, --workers >= 1")
    if args.max_agents is not None and args.max_agents < 1:
        raise ValueError("--max-agents must be >= 1")
    config = LiveConfig(
        regimes=tuple(regimes), arms=tuple(arms), repeats=repeats, factors=factors,
        agents=agents, max_agents=args.max_agents, num_gpu_blocks=args.blocks,
        workers=args.workers, window_s=window, warmup_s=warmup, drain_s=args.drain,
        request_timeout_s=args.request_timeout, seed=args.seed, workload=args.workload,
        trace=args.trace, token_scale=args.token_scale, time_scale=args.time_scale,
        out_dir=args.out or default_out_dir(), plots=not args.no_plots, quick=quick,
    )  # fmt: skip
    for regime in config.regimes:
        config.setup(regime)  # validates the regime's setup
    return config


def dry_run(config: LiveConfig, out: TextIO = sys.stdout) -> int:
    """Print the sizing and the schedule as JSON; start nothing."""
    plans: dict[str, Any] = {}
    agents: dict[str, list[int]] = {}
    for regime in config.regimes:
        setup = config.setup(regime)
        shape = workload_shape(setup, config.seed)
        sweep = plan_sweep(
            shape, max_agents=setup.max_agents, factors=config.factors, agents=config.agents,
            num_workers=config.workers, block_size=config.block_size,
            num_gpu_blocks=config.num_gpu_blocks,
        )  # fmt: skip
        plans[regime] = {"setup": setup.describe(), "sweep": sweep.describe()}
        agents[regime] = list(sweep.agents)
    schedule = interleave(config.regimes, agents, [a.label for a in config.arms],
                          config.repeats)  # fmt: skip
    per_run = config.window_s + config.drain_s / 2 + 4.0
    print(json.dumps({
        "config": config.describe(), "regimes": plans,
        "schedule": [dataclasses.asdict(k) for k in schedule],
        "estimated_minutes": round(len(schedule) * per_run / 60, 1),
    }, indent=1), file=out)  # fmt: skip
    return 0


def run_live_cli(args: argparse.Namespace) -> int:
    """CLI entry of ``bench live``: 0 clean, 1 a run failed or saw errors, 2 bad options."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(config)
    return run_live(config, as_json=args.json)
