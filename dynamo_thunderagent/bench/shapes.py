"""More agent workload shapes: long sessions with compaction, subagent fan-out, and
coding-agent sessions with aiperf's ``agentic-code`` distributions.

All are seeded generators like ``WorkloadSpec`` (``bench/workload.py``): agent ``index``
depends only on ``(spec, seed, index)``, so a longer run extends a shorter one. Sizes are
given in tokens *before* scaling and are chosen for the calibrated regime's simulated worker
(``SHAPE_POOL_TOKENS``, 262k tokens, like one GPU of the shared trace); a harness running a
smaller pool shrinks them by :func:`shape_token_factor` so that the same number of programs
fit a worker.

Where the numbers come from
---------------------------
These generators use no public trace. The closest public source for ``long`` is TraceLab
(University of Washington, tracelab.cs.washington.edu: about 4,300 real Claude Code and
Codex sessions with per-step cached-prefix / appended tokens, tool latencies, human waits
and detected compactions). Real Claude Code conversations, subagents included, are replayed
as a trace beside them (``bench trace --from-kv-cache-tester``). The parameters here are
modelling choices, stated per field, that reproduce the shape the project measured from such
sessions (issue 11: contexts up to 200k tokens, mean prompt about 80k, so about six
programs fit a worker; compaction now and then; gaps of tool or human time capped at 60 s)
at the scale of this benchmark, and the subagent pattern of coding agents (a parent spawns a
few short-lived workers that each start from the same large system prompt and tool
definitions, runs them concurrently, and reads back one report from each).

``long``: :class:`LongSessionSpec`, interactive coding-assistant sessions. One agent per
session, 60-200 turns; a 3,000-token system prompt; each turn appends 100-2,000 tool tokens
and generates 30-400. A session compacts when its next prompt would pass its own threshold
(drawn once, 30k-56k tokens), and by hand now and then (2% of turns: ``/compact`` or a new
task); the compaction turn's prompt is the system prompt plus a 1,000-3,000-token summary,
a new prefix. Over the first 256 sessions of seed 0: 131 turns and 5.3 compactions a
session, mean peak context 43k tokens (so six peaks fit a 262k-token worker), largest 56k,
mean prompt 21k (0.49 of the mean peak, 0.38 of the largest: issue 11's "mean 80k of up to
200k" is the second reading). Gaps: 70% local tools (lognormal, median 1 s), 20% builds and
tests (median 8 s), 10% a human (Pareto from 5 s), every draw capped at 60 s (median 1.7 s,
mean 4.9 s).

``fanout``: :class:`FanoutSpec`, parents that live long (30-50 turns, +100-800 tool
tokens a turn) and, at about one turn
in eight, spawn 3-8 subagents of 2-6 turns each. Parents and subagents share one large
system prompt (6,000 tokens: the job's instructions and tool definitions); a subagent's
first prompt adds a 300-1,500-token task, its last reply is a 200-800-token report, and the
parent's next turn appends the reports. The parent's tool time at a fan-out turn is the time
its subagents take (the drivers run them concurrently and wait for all), not a drawn
duration: both harnesses can express that dependency, and drawing it would hide exactly the
coupling (a parent held up by its slowest subagent) this shape is for.

``agentic-code``: :class:`AgenticCodeSpec`, the coding-agent sessions of the benchmark
client a Dynamo user runs first (aiperf 0.13's ``synthesize agentic-code``, replayed live by
``bench clients --workloads agentic-code``), generated here so that the simulator and the
live driver run the same shape. The distributions are those of the dataset aiperf ships
(``bench/agentic_code.py`` lists them): a 32,000-token system prompt every session shares; a
10,000-token project context and a session start (log-normal, mean 15,000, median 5,000, at
most 50,000) in the first prompt; each turn appends a tool result (mean 6,000, median 4,000,
at most 50,000) and generates mean 1,000, median 800 (at most 10,000); gaps are tool calls
(70%, mean 5 s, median 2 s) or a person (30%, mean 30 s, median 15 s). Ours, not aiperf's
code: the log-normals are fitted from mean and median and capped; a session resets (ends,
and the next starts afresh) after a turn with probability 5% x (1 + 1.5 x prompt / limit),
our reading of aiperf's reset settings; it retires when its next prompt would pass 75% of
the worker (196,608 tokens; aiperf's limit is 200,000), as ``bench clients`` retires it.
aiperf shares the project context within groups of sessions; here it is each session's own
(sessions running at once rarely share a group of 100), which understates what is shared.
Over the first 400 sessions of seed 0: 10.5 turns a session, first prompt 52k, mean prompt
98k, mean peak 117k (so about 2.2 peaks, and more with the system prompt counted once, fit a
262k-token worker), 1,006 generated tokens a turn: decode, not prefill, is most of a turn.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from dynamo_thunderagent.bench.agentic_code import (
    AGENTIC_FRACTION,
    REAL_AGENTIC_DELAY_MS,
    REAL_GENERATION_TOKENS,
    REAL_GROUP_TOKENS,
    REAL_HUMAN_DELAY_MS,
    REAL_NEW_TOKENS_PER_TURN,
    REAL_SESSION_TOKENS,
    REAL_SHARED_TOKENS,
    RESET,
    retire_at_tokens,
)
from dynamo_thunderagent.bench.workload import (
    SYNTHETIC_WORKLOADS,
    AgentPlan,
    ToolTimeComponent,
    TurnPlan,
    WorkloadSpec,
    check_common_fields,
    check_ranges,
    draw_tool_seconds,
    scale_tokens,
)

# The worker the shapes are sized for: the calibrated regime's simulated GPU (2 x 16,384
# blocks x 16 tokens is its cluster). See shape_token_factor.
SHAPE_POOL_TOKENS = 16384 * 16

Range = tuple[int, int]


def shape_token_factor(pool_tokens: int) -> float:
    """Token scale that keeps the shapes' programs-per-worker on a pool of ``pool_tokens``."""
    if pool_tokens <= 0:
        raise ValueError(f"pool_tokens must be > 0, got {pool_tokens}")
    return pool_tokens / SHAPE_POOL_TOKENS


def long_session_gaps() -> tuple[ToolTimeComponent, ...]:
    """Tool or human time between the requests of an interactive session, capped at 60 s."""
    return (
        ToolTimeComponent(weight=0.70, kind="lognormal", scale=1.0, shape=1.0, cap_seconds=60.0),
        ToolTimeComponent(weight=0.20, kind="lognormal", scale=8.0, shape=0.8, cap_seconds=60.0),
        ToolTimeComponent(weight=0.10, kind="pareto", scale=5.0, shape=1.1, cap_seconds=60.0),
    )


def subagent_tool_time() -> tuple[ToolTimeComponent, ...]:
    """A subagent's tools: searches and file reads, median 1.5 s, capped at 60 s."""
    return (
        ToolTimeComponent(weight=1.0, kind="lognormal", scale=1.5, shape=0.8, cap_seconds=60.0),
    )


@dataclass(frozen=True)
class LongSessionSpec:
    """Interactive coding-assistant sessions with compaction (module docstring: ``long``).

    Ranges are inclusive ``(lo, hi)``, tokens before scaling. A session draws its compaction
    threshold once from ``compaction_at_tokens``; a turn whose prompt would pass it, or one
    drawn with ``manual_compaction_probability``, is a compaction: its prompt is the system
    prompt plus ``summary_tokens``.
    """

    turns: Range = (60, 200)
    system_prompt_tokens: int = 3000
    first_turn_tokens: Range = (500, 3000)
    tool_output_tokens: Range = (100, 2000)
    output_tokens: Range = (30, 400)
    compaction_at_tokens: Range = (30_000, 56_000)
    summary_tokens: Range = (1000, 3000)
    manual_compaction_probability: float = 0.02
    tool_time: tuple[ToolTimeComponent, ...] = field(default_factory=long_session_gaps)
    token_scale: float = 1.0
    time_scale: float = 1.0
    session_prefix: str = "long"

    def validate(self) -> None:
        """Raise ValueError naming the field that is out of range."""
        check_ranges(self, ("turns", "first_turn_tokens", "tool_output_tokens",
                             "output_tokens", "compaction_at_tokens", "summary_tokens"))
        check_common_fields(self)
        if not 0 <= self.manual_compaction_probability <= 1:
            raise ValueError("manual_compaction_probability must be in [0, 1]")
        if self.compaction_at_tokens[0] <= self.system_prompt_tokens + self.summary_tokens[1]:
            raise ValueError("compaction_at_tokens must start above system prompt + summary")

    def agent(self, index: int, seed: int) -> AgentPlan:
        """Session ``index`` of the stream for ``seed``."""
        self.validate()
        rng = random.Random(f"long:{seed}:{index}")
        count = rng.randint(*self.turns)
        threshold = rng.randint(*self.compaction_at_tokens)
        scale = self.token_scale
        context = self.system_prompt_tokens  # unscaled, to compare with the threshold
        turns: list[TurnPlan] = []
        for k in range(count):
            compaction = False
            if k == 0:
                new = rng.randint(*self.first_turn_tokens)
            else:
                new = rng.randint(*self.tool_output_tokens)
                manual = rng.random() < self.manual_compaction_probability
                if manual or context + new > threshold:
                    compaction = True
                    new = rng.randint(*self.summary_tokens)
                    context = self.system_prompt_tokens
            out = rng.randint(*self.output_tokens)
            context += new + out
            gap = draw_tool_seconds(self.tool_time, rng)
            turns.append(TurnPlan(
                new_tokens=scale_tokens(new, scale),
                output_tokens=scale_tokens(out, scale, minimum=1),
                tool_seconds=0.0 if k == count - 1 else gap * self.time_scale,
                compaction=compaction,
            ))  # fmt: skip
        return AgentPlan(f"{self.session_prefix}-{seed}-{index}",
                         scale_tokens(self.system_prompt_tokens, scale), tuple(turns))

    def describe(self) -> str:
        return (f"long sessions, {self.turns[0]}-{self.turns[1]} turns, system prompt "
                f"{self.system_prompt_tokens} tokens, +{self.tool_output_tokens[0]}-"
                f"{self.tool_output_tokens[1]} tool and {self.output_tokens[0]}-"
                f"{self.output_tokens[1]} generated tokens a turn, compaction past "
                f"{self.compaction_at_tokens[0]}-{self.compaction_at_tokens[1]} tokens (and "
                f"{self.manual_compaction_probability:.0%} of turns) to a "
                f"{self.summary_tokens[0]}-{self.summary_tokens[1]}-token summary, gaps capped "
                f"at {max(c.cap_seconds for c in self.tool_time):g} s "
                f"(token x{self.token_scale:g}, time x{self.time_scale:g})")


@dataclass(frozen=True)
class FanoutSpec:
    """Long-lived parents that spawn short subagents (module docstring: ``fanout``).

    Ranges are inclusive ``(lo, hi)``, tokens before scaling. Each parent turn but the last
    fans out with ``fanout_probability``; its subagents share the parent's system prompt.
    """

    turns: Range = (30, 50)
    system_prompt_tokens: int = 6000
    first_turn_tokens: Range = (1000, 3000)
    tool_output_tokens: Range = (100, 800)
    output_tokens: Range = (50, 400)
    fanout_probability: float = 0.12
    subagents: Range = (3, 8)
    subagent_turns: Range = (2, 6)
    subagent_task_tokens: Range = (300, 1500)
    subagent_tool_output_tokens: Range = (300, 2000)
    subagent_output_tokens: Range = (50, 300)
    subagent_report_tokens: Range = (200, 800)
    tool_time: tuple[ToolTimeComponent, ...] = field(default_factory=long_session_gaps)
    subagent_tool_time: tuple[ToolTimeComponent, ...] = field(default_factory=subagent_tool_time)
    token_scale: float = 1.0
    time_scale: float = 1.0
    session_prefix: str = "fanout"

    def validate(self) -> None:
        """Raise ValueError naming the field that is out of range."""
        check_ranges(self, ("turns", "first_turn_tokens", "tool_output_tokens",
                             "output_tokens", "subagents", "subagent_turns",
                             "subagent_task_tokens", "subagent_tool_output_tokens",
                             "subagent_output_tokens", "subagent_report_tokens"))
        check_common_fields(self)
        if not 0 <= self.fanout_probability <= 1:
            raise ValueError("fanout_probability must be in [0, 1]")
        if self.subagents[0] < 1 or self.subagent_turns[0] < 1:
            raise ValueError("subagents and subagent_turns must be ranges starting at >= 1")
        if self.subagent_output_tokens[0] < 1 or self.subagent_report_tokens[0] < 1:
            raise ValueError("subagent output and report tokens must be >= 1")
        if not self.subagent_tool_time or any(
            c.weight <= 0 or c.scale <= 0 for c in self.subagent_tool_time
        ):
            raise ValueError("subagent_tool_time needs components with weight > 0, scale > 0")

    def agent(self, index: int, seed: int) -> AgentPlan:
        """Parent ``index`` of the stream for ``seed``, its subagents inside its turns."""
        self.validate()
        rng = random.Random(f"fanout:{seed}:{index}")
        session_id = f"{self.session_prefix}-{seed}-{index}"
        scale = self.token_scale
        count = rng.randint(*self.turns)
        turns: list[TurnPlan] = []
        reports = 0  # scaled report tokens the next parent turn appends
        for k in range(count):
            last = k == count - 1
            raw = rng.randint(*(self.first_turn_tokens if k == 0 else self.tool_output_tokens))
            new = reports if reports else scale_tokens(raw, scale)
            out = scale_tokens(rng.randint(*self.output_tokens), scale, minimum=1)
            gap = draw_tool_seconds(self.tool_time, rng)
            subagents: tuple[AgentPlan, ...] = ()
            if not last and rng.random() < self.fanout_probability:
                width = rng.randint(*self.subagents)
                subagents = tuple(self._subagent(f"{session_id}-sub{k}.{j}", rng)
                                  for j in range(width))  # fmt: skip
                gap = 0.0  # the parent waits for its subagents, not for a tool
            reports = sum(s.turns[-1].output_tokens for s in subagents)
            turns.append(TurnPlan(
                new_tokens=new,
                output_tokens=out,
                tool_seconds=0.0 if last else gap * self.time_scale,
                subagents=subagents,
            ))  # fmt: skip
        return AgentPlan(session_id, scale_tokens(self.system_prompt_tokens, scale),
                         tuple(turns))

    def _subagent(self, session_id: str, rng: random.Random) -> AgentPlan:
        scale = self.token_scale
        count = rng.randint(*self.subagent_turns)
        turns: list[TurnPlan] = []
        for k in range(count):
            last = k == count - 1
            new = rng.randint(*(self.subagent_task_tokens if k == 0
                                else self.subagent_tool_output_tokens))
            out = rng.randint(*(self.subagent_report_tokens if last
                                else self.subagent_output_tokens))
            gap = draw_tool_seconds(self.subagent_tool_time, rng)
            turns.append(TurnPlan(
                new_tokens=scale_tokens(new, scale),
                output_tokens=scale_tokens(out, scale, minimum=1),
                tool_seconds=0.0 if last else gap * self.time_scale,
            ))  # fmt: skip
        return AgentPlan(session_id, scale_tokens(self.system_prompt_tokens, scale),
                         tuple(turns))

    def describe(self) -> str:
        return (f"fan-out, parents of {self.turns[0]}-{self.turns[1]} turns spawning "
                f"{self.subagents[0]}-{self.subagents[1]} subagents of "
                f"{self.subagent_turns[0]}-{self.subagent_turns[1]} turns at "
                f"{self.fanout_probability:.0%} of turns, shared system prompt "
                f"{self.system_prompt_tokens} tokens, parent +{self.tool_output_tokens[0]}-"
                f"{self.tool_output_tokens[1]} tool tokens a turn, subagent reports "
                f"{self.subagent_report_tokens[0]}-{self.subagent_report_tokens[1]} tokens "
                f"(token x{self.token_scale:g}, time x{self.time_scale:g})")


def lognormal_sigma(mean: float, median: float) -> float:
    """Log-space standard deviation of the log-normal with this ``mean`` and ``median``
    (``mean > median > 0``), as aiperf fits one when only those are given."""
    return math.sqrt(2.0 * math.log(mean / median))


@dataclass(frozen=True)
class LogNormal:
    """A log-normal draw given as aiperf gives its distributions: ``mean`` and ``median``
    (so ``mean > median > 0``), every draw capped at ``cap``."""

    mean: float
    median: float
    cap: float

    @classmethod
    def of(cls, figures: dict[str, float]) -> LogNormal:
        """From a ``{"mean", "median", "max"}`` dict (``bench/agentic_code.py``'s form)."""
        return cls(figures["mean"], figures["median"], figures["max"])

    def validate(self, name: str) -> None:
        if not 0 < self.median < self.mean <= self.cap:
            raise ValueError(f"{name} must have 0 < median < mean <= cap, got {self}")

    def draw(self, rng: random.Random) -> float:
        sigma = lognormal_sigma(self.mean, self.median)
        return min(self.cap, self.median * math.exp(sigma * rng.gauss(0.0, 1.0)))


# The shipped dataset's token distributions (frozen, so one instance serves every spec).
_SESSION_START = LogNormal.of(REAL_SESSION_TOKENS)
_NEW_PER_TURN = LogNormal.of(REAL_NEW_TOKENS_PER_TURN)
_GENERATED = LogNormal.of(REAL_GENERATION_TOKENS)
_MAX_PROMPT = retire_at_tokens(1.0, SHAPE_POOL_TOKENS)


def agentic_code_gaps() -> tuple[ToolTimeComponent, ...]:
    """aiperf's agentic-code gaps: tool calls (70%, mean 5 s, median 2 s) or a person (30%,
    mean 30 s, median 15 s), log-normal from mean and median. aiperf caps neither; each draw
    here is capped at 600 s, ``ToolTimeComponent``'s default tool timeout (the SWE mixture's;
    the long, fan-out and toy shapes cap at 60 s)."""
    def part(weight: float, delay_ms: dict[str, float]) -> ToolTimeComponent:
        mean, median = delay_ms["mean"] / 1000.0, delay_ms["median"] / 1000.0
        return ToolTimeComponent(weight=weight, kind="lognormal", scale=median,
                                 shape=lognormal_sigma(mean, median), cap_seconds=600.0)
    return (part(AGENTIC_FRACTION, REAL_AGENTIC_DELAY_MS),
            part(1.0 - AGENTIC_FRACTION, REAL_HUMAN_DELAY_MS))


@dataclass(frozen=True)
class AgenticCodeSpec:
    """Coding-agent sessions with aiperf's ``agentic-code`` distributions (module docstring).

    Tokens before scaling. A session's first prompt is the shared system prompt, a project
    context and its own start; each later turn appends ``new_tokens`` (a tool result and the
    next instruction) to the last prompt and its reply. After each turn the session resets
    (ends; the next session starts afresh) with :meth:`reset_chance`, and it retires when its
    next prompt would pass ``max_prompt_tokens`` or after ``max_turns`` turns.
    """

    system_prompt_tokens: int = REAL_SHARED_TOKENS
    project_tokens: int = REAL_GROUP_TOKENS
    session_tokens: LogNormal = _SESSION_START
    new_tokens: LogNormal = _NEW_PER_TURN
    generated_tokens: LogNormal = _GENERATED
    # Retired where bench clients retires it, on the worker the shapes are sized for.
    max_prompt_tokens: int = _MAX_PROMPT
    reset_probability: float = RESET["base_probability"]
    reset_context_scaling: float = RESET["context_scaling"]
    max_turns: int = 200
    tool_time: tuple[ToolTimeComponent, ...] = field(default_factory=agentic_code_gaps)
    token_scale: float = 1.0
    time_scale: float = 1.0
    session_prefix: str = "agentic-code"

    @property
    def turns(self) -> Range:
        """At least one turn, at most ``max_turns`` (the other shapes' ``turns`` range)."""
        return (1, self.max_turns)

    @property
    def output_tokens(self) -> Range:
        return (1, math.ceil(self.generated_tokens.cap))

    def reset_chance(self, prompt_tokens: int) -> float:
        """Chance that a session ends after a turn whose prompt had ``prompt_tokens``
        (unscaled): ``reset_probability``, raised in proportion to how full the prompt is."""
        return self.reset_probability * (
            1.0 + self.reset_context_scaling * prompt_tokens / self.max_prompt_tokens)

    def validate(self) -> None:
        """Raise ValueError naming the field that is out of range."""
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        check_common_fields(self)
        for name in ("session_tokens", "new_tokens", "generated_tokens"):
            getattr(self, name).validate(name)
        if self.project_tokens < 0:
            raise ValueError(f"project_tokens must be >= 0, got {self.project_tokens}")
        first = self.system_prompt_tokens + self.project_tokens + self.session_tokens.cap
        if self.max_prompt_tokens < first:
            raise ValueError(
                f"max_prompt_tokens must hold the largest first prompt (system prompt + "
                f"project context + session_tokens.cap = {first:.0f}), got "
                f"{self.max_prompt_tokens}")
        if not 0 <= self.reset_probability <= 1:
            raise ValueError(
                f"reset_probability must be in [0, 1], got {self.reset_probability}")
        if self.reset_context_scaling < 0:
            raise ValueError(
                f"reset_context_scaling must be >= 0, got {self.reset_context_scaling}")

    def agent(self, index: int, seed: int) -> AgentPlan:
        """Session ``index`` of the stream for ``seed``."""
        self.validate()
        rng = random.Random(f"agentic-code:{seed}:{index}")
        scale = self.token_scale
        start = self.project_tokens + round(self.session_tokens.draw(rng))
        prompt = self.system_prompt_tokens + start  # unscaled, against the limit
        turns: list[TurnPlan] = []
        new = start
        while True:
            out = round(self.generated_tokens.draw(rng))
            gap = draw_tool_seconds(self.tool_time, rng)
            turns.append(TurnPlan(new_tokens=scale_tokens(new, scale),
                                  output_tokens=scale_tokens(out, scale, minimum=1),
                                  tool_seconds=gap * self.time_scale))
            reset = self.reset_chance(prompt)
            new = round(self.new_tokens.draw(rng))
            if (len(turns) >= self.max_turns or rng.random() < reset
                    or prompt + out + new > self.max_prompt_tokens):
                break
            prompt += out + new
        turns[-1] = replace(turns[-1], tool_seconds=0.0)
        return AgentPlan(f"{self.session_prefix}-{seed}-{index}",
                         scale_tokens(self.system_prompt_tokens, scale), tuple(turns))

    def describe(self) -> str:
        return (f"agentic-code (aiperf's distributions), shared system prompt "
                f"{self.system_prompt_tokens} tokens, project context {self.project_tokens}, "
                f"start mean {self.session_tokens.mean:g}, +{self.new_tokens.mean:g} and "
                f"{self.generated_tokens.mean:g} generated tokens a turn on average, reset "
                f"{self.reset_probability:.0%} a turn and more with context, retired at "
                f"{self.max_prompt_tokens} tokens (token x{self.token_scale:g}, time "
                f"x{self.time_scale:g})")


LONG_WORKLOAD = LongSessionSpec()
FANOUT_WORKLOAD = FanoutSpec()
AGENTIC_CODE_WORKLOAD = AgenticCodeSpec()
SHAPES: dict[str, LongSessionSpec | FanoutSpec | AgenticCodeSpec] = {
    "long": LONG_WORKLOAD, "fanout": FANOUT_WORKLOAD, "agentic-code": AGENTIC_CODE_WORKLOAD}

# Every synthetic workload by name: workload.py's (``swe``, ``toy``) and the shapes above.
SyntheticWorkload = WorkloadSpec | LongSessionSpec | FanoutSpec | AgenticCodeSpec
ALL_SYNTHETIC: dict[str, SyntheticWorkload] = {**SYNTHETIC_WORKLOADS, **SHAPES}
