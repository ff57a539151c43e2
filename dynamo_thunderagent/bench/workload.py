"""Agent programs for closed-loop benchmarks: the plan model and synthetic (seeded) workloads.

An agent program is a list of turns. Before turn ``k`` the agent appends ``new_tokens`` to
its history (turn 0: the task / first-turn context; later turns: the output of the tool call
that followed turn ``k-1``), the model generates ``output_tokens``, and then the agent spends
``tool_seconds`` in a tool before the next turn (0 after the last turn). Every agent of one
job also shares a system prompt of ``system_tokens`` that precedes the history.

So the prompt of turn ``k`` is ``system_tokens + sum(new_tokens[0..k]) +
sum(output_tokens[0..k-1])`` tokens, and it extends the prompt of turn ``k-1``: that is the
reuse a prefix cache can exploit, and what a scheduler destroys if it lets the cache of an
ACTING program be evicted.

Two things break that chain, and a turn says so itself. A *compaction* turn
(``TurnPlan.compaction``) starts a new history: its prompt is the system prompt plus its own
``new_tokens`` (a summary of what came before), so only the shared system prompt is reusable
and the old history's cache is garbage; the sums above then start at the last compaction. A
*fan-out* turn (``TurnPlan.subagents``) spawns subagents, programs of their own with their own
session ids, that run concurrently while the parent waits: the parent's tool time for that
turn is the time its subagents take, plus ``tool_seconds``. The shapes that use them live in
``bench/shapes.py``.

Everything here is pure and deterministic: the same spec and seed give the same plans, and
agent ``i`` of a stream depends only on ``(seed, i)``, so a longer run extends a shorter one
instead of reshuffling it. Plans replayed from a recorded trace come from
:mod:`~dynamo_thunderagent.bench.trace`.

Sizes scale to the engine under test. ``token_scale`` multiplies every token count (to fit
the mocker's small KV capacity) and ``time_scale`` multiplies every tool time (pass
``1 / speedup_ratio`` when the mocker runs its clock faster), so the ratios that matter
(context per agent vs capacity, tool time vs turn time) survive the scaling.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

ToolTimeKind = Literal["lognormal", "pareto"]

@dataclass(frozen=True)
class ToolTimeComponent:
    """One component of a tool-time mixture.

    ``lognormal``: median ``scale`` seconds, log-space standard deviation ``shape``.
    ``pareto``: minimum ``scale`` seconds, tail index ``shape`` (smaller = heavier tail).
    Every draw is capped at ``cap_seconds`` (a tool timeout).
    """

    weight: float
    kind: ToolTimeKind
    scale: float
    shape: float
    cap_seconds: float = 600.0

    def draw(self, rng: random.Random) -> float:
        if self.kind == "lognormal":
            value = self.scale * math.exp(self.shape * rng.gauss(0.0, 1.0))
        else:
            value = self.scale * rng.paretovariate(self.shape)
        return min(value, self.cap_seconds)


def default_tool_time() -> tuple[ToolTimeComponent, ...]:
    """The mix of workload.md: 70% short shell tools, 25% slower tools, 5% heavy tail.

    Lognormal sigmas and the Pareto minimum / index are our choices: they give a p95 near a
    minute and a tail that reaches the 600 s cap, like remote-API and science-agent tools.
    """
    return (
        ToolTimeComponent(weight=0.70, kind="lognormal", scale=2.0, shape=0.8),
        ToolTimeComponent(weight=0.25, kind="lognormal", scale=15.0, shape=0.8),
        ToolTimeComponent(weight=0.05, kind="pareto", scale=30.0, shape=1.2, cap_seconds=600.0),
    )


class _CommonFields(Protocol):
    """What every agent-shape spec has (WorkloadSpec and the shapes of bench/shapes.py)."""

    @property
    def turns(self) -> tuple[int, int]: ...
    @property
    def output_tokens(self) -> tuple[int, int]: ...
    @property
    def system_prompt_tokens(self) -> int: ...
    @property
    def token_scale(self) -> float: ...
    @property
    def time_scale(self) -> float: ...
    @property
    def tool_time(self) -> tuple[ToolTimeComponent, ...]: ...


def check_ranges(spec: object, names: tuple[str, ...]) -> None:
    """Each of ``names`` is an inclusive ``(lo, hi)`` range with ``0 <= lo <= hi``."""
    for name in names:
        lo, hi = getattr(spec, name)
        if lo < 0 or hi < lo:
            raise ValueError(f"{name} must be a range 0 <= lo <= hi, got ({lo}, {hi})")


def check_common_fields(spec: _CommonFields) -> None:
    """The checks every agent-shape spec shares; ValueError names the bad field."""
    if spec.turns[0] < 1:
        raise ValueError(f"turns must be >= 1, got {spec.turns}")
    if spec.output_tokens[0] < 1:
        raise ValueError(f"output_tokens must be >= 1, got {spec.output_tokens}")
    if spec.system_prompt_tokens < 0:
        raise ValueError(f"system_prompt_tokens must be >= 0, got {spec.system_prompt_tokens}")
    if not (spec.token_scale > 0 and spec.time_scale >= 0):
        raise ValueError("token_scale must be > 0 and time_scale >= 0")
    if not spec.tool_time or any(c.weight <= 0 or c.scale <= 0 for c in spec.tool_time):
        raise ValueError("tool_time needs components with weight > 0 and scale > 0")


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of synthetic agent programs, before scaling. Ranges are inclusive ``(lo, hi)``.

    Defaults follow the SWE-agent shape in workload.md: tens of turns, a shared system prompt,
    a first-turn context of about a thousand tokens, +0.3-0.7k tool tokens and 100-300
    generated tokens per turn.
    """

    turns: tuple[int, int] = (20, 60)
    system_prompt_tokens: int = 1000
    first_turn_tokens: tuple[int, int] = (400, 1200)
    tool_output_tokens: tuple[int, int] = (300, 700)
    output_tokens: tuple[int, int] = (100, 300)
    tool_time: tuple[ToolTimeComponent, ...] = field(default_factory=default_tool_time)
    token_scale: float = 1.0
    time_scale: float = 1.0
    session_prefix: str = "agent"

    def validate(self) -> None:
        """Raise ValueError naming the field that is out of range."""
        check_ranges(self, ("turns", "first_turn_tokens", "tool_output_tokens", "output_tokens"))
        check_common_fields(self)

    def scaled_system_tokens(self) -> int:
        return scale_tokens(self.system_prompt_tokens, self.token_scale)

    def agent(self, index: int, seed: int) -> AgentPlan:
        return make_agent(self, index, seed)


# The synthetic workloads the benchmarks run, by name. ``swe``: the SWE-agent shape above.
# ``toy``: the "measured here" agents of workload.md, sized for the mocker's default KV pool
# (10-20 turns, 500-token shared system prompt, 100-300 tool tokens and 32-64 generated tokens
# a turn, tool time lognormal with a 0.5 s median). Session ids start with ``session_prefix``
# ("agent"); a harness that wants the workload's name in them replaces it.
SWE_WORKLOAD = WorkloadSpec()
TOY_WORKLOAD = WorkloadSpec(
    turns=(10, 20),
    system_prompt_tokens=500,
    first_turn_tokens=(200, 800),
    tool_output_tokens=(100, 300),
    output_tokens=(32, 64),
    tool_time=(
        ToolTimeComponent(weight=1.0, kind="lognormal", scale=0.5, shape=0.8, cap_seconds=60.0),
    ),
)
SYNTHETIC_WORKLOADS: dict[str, WorkloadSpec] = {"swe": SWE_WORKLOAD, "toy": TOY_WORKLOAD}


@dataclass(frozen=True)
class TurnPlan:
    """One turn: tokens appended before it, tokens generated, tool seconds after it.

    ``compaction``: the turn starts a new history (system prompt + ``new_tokens``) instead of
    extending the previous prompt; ignored on turn 0, which always starts one.
    ``subagents``: programs this turn's reply spawns; the tool that follows the turn waits
    until all of them have ended, then takes ``tool_seconds`` more.
    """

    new_tokens: int
    output_tokens: int
    tool_seconds: float
    # The trace's own LLM time for this step (scaled), for reference only; None if synthetic.
    llm_seconds: float | None = None
    compaction: bool = False
    subagents: tuple[AgentPlan, ...] = ()


@dataclass(frozen=True)
class AgentPlan:
    """One agent program: its session id, the shared system prompt size and its turns."""

    session_id: str
    system_tokens: int
    turns: tuple[TurnPlan, ...]
    # The turn of the whole program this plan starts at (a warm start joins mid-program,
    # start_at): its run is not whole, so agent-run times leave it out.
    joined_at: int = 0

    def history_start(self, turn: int) -> int:
        """The turn where the history that ``turn`` extends began (0 or a compaction)."""
        for k in range(turn, 0, -1):
            if self.turns[k].compaction:
                return k
        return 0

    def prompt_tokens(self, turn: int) -> int:
        """Planned prompt length of ``turn``: system + the new tokens and outputs of the
        turns since the history began (turn 0 or the last compaction), ``turn``'s output
        excluded."""
        head = self.turns[self.history_start(turn) : turn + 1]
        return (
            self.system_tokens
            + sum(t.new_tokens for t in head)
            + sum(t.output_tokens for t in head[:-1])
        )

    def context_tokens(self) -> list[int]:
        """Context after each turn's generation (prompt + output), in one pass."""
        contexts: list[int] = []
        context = self.system_tokens
        for k, t in enumerate(self.turns):
            if k > 0 and t.compaction:
                context = self.system_tokens
            context += t.new_tokens + t.output_tokens
            contexts.append(context)
        return contexts

    @property
    def peak_context_tokens(self) -> int:
        """The largest context the program reaches (prompt + output of some turn): what it
        occupies at its peak. Without compaction that is the last turn's."""
        return max(self.context_tokens())

    @property
    def peak_footprint_tokens(self) -> int:
        """The most KV this program and the subagents it waits on hold at once.

        At a fan-out turn: the parent's context plus every subagent's own footprint less the
        system prompt they share with the parent (counted once). Without subagents it is
        :attr:`peak_context_tokens`; this is what the sweeps size the KV knee by.
        """
        peak = 0
        for context, t in zip(self.context_tokens(), self.turns, strict=True):
            children = sum(
                s.peak_footprint_tokens - min(s.system_tokens, self.system_tokens)
                for s in t.subagents
            )
            peak = max(peak, context + children)
        return peak

    def programs(self) -> Iterator[AgentPlan]:
        """This plan and, depth first, every subagent plan it spawns."""
        yield self
        for t in self.turns:
            for sub in t.subagents:
                yield from sub.programs()

    @property
    def tool_seconds(self) -> float:
        return sum(t.tool_seconds for t in self.turns)


class AgentSource(Protocol):
    """A seeded generator of agent programs (``WorkloadSpec`` and the shapes of
    ``bench/shapes.py``): agent ``index`` depends only on ``(spec, seed, index)``."""

    def agent(self, index: int, seed: int) -> AgentPlan:
        """Agent ``index`` of the stream for ``seed``."""
        ...


def scale_tokens(count: int, factor: float, minimum: int = 0) -> int:
    """``count * factor`` rounded half-up, never below ``minimum``."""
    return max(minimum, math.floor(count * factor + 0.5))


def draw_tool_seconds(components: Sequence[ToolTimeComponent], rng: random.Random) -> float:
    """One draw from a tool-time mixture: a component by weight, then its value."""
    total = sum(c.weight for c in components)
    pick = rng.random() * total
    for component in components:
        pick -= component.weight
        if pick < 0:
            return component.draw(rng)
    return components[-1].draw(rng)


def make_agent(spec: WorkloadSpec, index: int, seed: int) -> AgentPlan:
    """Agent ``index`` of the stream for ``(spec, seed)``; depends on nothing else."""
    spec.validate()
    # String seeds hash deterministically (unlike hash() of a tuple), across runs and hosts.
    rng = random.Random(f"{seed}:{index}")
    turn_count = rng.randint(*spec.turns)
    turns: list[TurnPlan] = []
    for k in range(turn_count):
        new_raw = rng.randint(*(spec.first_turn_tokens if k == 0 else spec.tool_output_tokens))
        out_raw = rng.randint(*spec.output_tokens)
        tool_raw = draw_tool_seconds(spec.tool_time, rng)
        last = k == turn_count - 1
        turns.append(
            TurnPlan(
                new_tokens=scale_tokens(new_raw, spec.token_scale),
                output_tokens=scale_tokens(out_raw, spec.token_scale, minimum=1),
                tool_seconds=0.0 if last else tool_raw * spec.time_scale,
            )
        )
    return AgentPlan(
        session_id=f"{spec.session_prefix}-{seed}-{index}",
        system_tokens=spec.scaled_system_tokens(),
        turns=tuple(turns),
    )


def make_agents(spec: AgentSource, count: int, seed: int) -> list[AgentPlan]:
    """The first ``count`` agents of the stream for ``(spec, seed)``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return [spec.agent(i, seed) for i in range(count)]


def agent_stream(spec: AgentSource, seed: int) -> Iterator[AgentPlan]:
    """An endless stream of agents; its first ``n`` equal ``make_agents(spec, n, seed)``."""
    index = 0
    while True:
        yield spec.agent(index, seed)
        index += 1


def start_at(plan: AgentPlan, turn: int) -> AgentPlan:
    """``plan`` joined at ``turn``: its first prompt is the whole history up to ``turn``.

    The prompt sizes of the remaining turns are unchanged (the joined turn starts the
    history, so it is not a compaction); the session id gets ``@<turn>``.
    """
    if not 0 <= turn < len(plan.turns):
        raise ValueError(f"turn {turn} out of range for a plan of {len(plan.turns)} turns")
    if turn == 0:
        return plan
    first = replace(
        plan.turns[turn], new_tokens=plan.prompt_tokens(turn) - plan.system_tokens,
        compaction=False,
    )
    return AgentPlan(f"{plan.session_id}@{turn}", plan.system_tokens,
                     (first, *plan.turns[turn + 1 :]), joined_at=turn)  # fmt: skip


def warm_start(plans: Iterator[AgentPlan], count: int, seed: int) -> Iterator[AgentPlan]:
    """The first ``count`` plans joined at a seeded uniform turn; the rest unchanged."""
    rng = random.Random(f"{seed}:warm-start")
    for index, plan in enumerate(plans):
        yield start_at(plan, rng.randrange(len(plan.turns))) if index < count else plan


@dataclass(frozen=True)
class Background:
    """Other tenants' traffic beside the agents: ``concurrency`` loops of requests without a
    session id, each of ``prompt_tokens`` unique prompt tokens and ``output_tokens`` generated,
    sent back to back (``bench live --background``, ``bench sim --background``)."""

    concurrency: int
    prompt_tokens: int = 800
    output_tokens: int = 64

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"background traffic needs concurrency, prompt tokens and output tokens >= 1, "
                f"got {self.concurrency}:{self.prompt_tokens}:{self.output_tokens}")

    @classmethod
    def parse(cls, text: str) -> Background:
        """``CONCURRENCY`` or ``CONCURRENCY:PROMPT_TOKENS:OUTPUT_TOKENS``."""
        parts = text.split(":")
        try:
            if len(parts) not in (1, 3):
                raise ValueError("one or three fields")
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"--background {text!r}: give CONCURRENCY or "
                "CONCURRENCY:PROMPT_TOKENS:OUTPUT_TOKENS, whole numbers (e.g. 8 or 8:800:64)"
            ) from None
        return cls(*values)
