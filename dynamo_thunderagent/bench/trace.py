"""Agent programs replayed from a recorded trace (JSONL, one row per LLM call).

A traced session becomes an :class:`~dynamo_thunderagent.bench.workload.AgentPlan` like a
synthetic one (:func:`plan_from_trace`), so every harness runs either; :func:`replay_stream`
repeats a trace's sessions, seeded, for as many agents as a run starts. Reading and writing
the trace file are the only I/O in the benchmark's workload side.

The format (docs/benchmarks.md, "Your own agents as a trace"): every row has
``session_id``, ``step``, ``input_tokens`` (the whole prompt of the call), ``output_tokens``
and, optionally, ``llm_seconds`` and ``tool_seconds`` (the tool run that follows the call).
Optional fields carry what agents do besides growing one history:

* ``compaction`` (row): the call starts a new history (the shared system prompt and a
  summary) instead of extending the previous prompt. Where a row does not say, a prompt
  shorter than ``COMPACTION_SHRINK`` of the previous one counts as a compaction; a smaller
  drop (an agent trimming part of its history) is replayed as no growth.
* ``parent_session_id`` and ``parent_step`` (session): the session is a subagent, started
  when the parent's step ``parent_step`` has replied; the tool that follows that step waits
  until every such subagent has ended, then takes the step's ``tool_seconds`` more.
* ``system_tokens`` (session): how much of the first prompt is the system prompt that the
  job's agents share (default: the harness's value for the trace).

Session fields may sit on any row of the session and must agree where repeated.
:func:`trace_rows` turns any plans (a synthetic shape's too) into rows of this format,
and :func:`load_trace` reads them back to the same plans.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan, scale_tokens

# Where the shared trace lives in this project's checkout layout.
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / ("swe-agent-lite-glm45.jsonl")
)

# The shared system prompt assumed when replaying the trace (trace tokens, before scaling):
# the trace records whole prompts, not which part every agent of the job shares.
TRACE_SYSTEM_TOKENS = 1000

# A row that does not say whether it compacts does when its prompt is shorter than this
# share of the previous prompt: a summary replaces most of a history, a trim only a part.
COMPACTION_SHRINK = 0.5

# Fields a row may carry that belong to its session, not to the call.
_SESSION_FIELDS = ("parent_session_id", "parent_step", "system_tokens")


@dataclass(frozen=True)
class TraceStep:
    """One row of a trace: the prompt of one LLM call and what followed it.

    ``compaction`` is None where the row does not say (then it is inferred from the prompt's
    length); the session fields are None where this row does not carry them.
    """

    session_id: str
    step: int
    input_tokens: int
    output_tokens: int
    llm_seconds: float | None
    tool_seconds: float
    compaction: bool | None = None
    parent_session_id: str | None = None
    parent_step: int | None = None
    system_tokens: int | None = None


@dataclass(frozen=True)
class TraceSession:
    """A session's rows, sorted by step, and the session fields they carry."""

    session_id: str
    steps: tuple[TraceStep, ...]
    parent_session_id: str | None = None
    parent_step: int | None = None
    system_tokens: int | None = None


def nonnegative(value: Any, name: str, what: str = "a number", *, whole: bool = False) -> float:
    """``value`` if it is a number >= 0, else a ValueError saying that ``name`` must be
    ``what`` >= 0 and what it got. ``whole``: no fractional part, and an int comes back as
    it is, however large; otherwise the number must be a finite float. A bool is not a
    number here. Both trace readers (this one and trace_import's) check numbers with it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if whole and isinstance(value, int):
            if value >= 0:
                return value
        else:
            try:
                number = float(value)
            except OverflowError:  # an int too large for a float
                number = math.inf
            if math.isfinite(number) and number >= 0 and (not whole or number.is_integer()):
                return number
    raise ValueError(f"{name} must be {what} >= 0, got {value!r}")


def _count(row: Mapping[str, Any], name: str, *, optional: bool = False) -> int | None:
    value = row.get(name)
    if value is None:
        if optional:
            return None
        raise ValueError(f"missing field {name!r}")
    return int(nonnegative(value, name, "a whole number", whole=True))


def _seconds(row: Mapping[str, Any], name: str) -> float | None:
    value = row.get(name)
    return None if value is None else nonnegative(value, name, "a number of seconds")


def is_session_id(value: Any) -> bool:
    """Whether a JSON value can name a session: a non-empty string, or a number (read as its
    text); not an object, a list, a bool or null."""
    return (value is not None and not isinstance(value, dict | list | bool)
            and str(value) != "")


def _step_from_row(row: Any) -> TraceStep:
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    session_id = row.get("session_id")
    if session_id is None:
        raise ValueError("missing field 'session_id' (a non-empty string)")
    if not is_session_id(session_id):
        raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
    compaction = row.get("compaction")
    if compaction is not None and not isinstance(compaction, bool):
        raise ValueError(f"compaction must be true or false, got {compaction!r}")
    parent = row.get("parent_session_id")
    if parent is not None and not is_session_id(parent):
        raise ValueError(f"parent_session_id must be a non-empty string, got {parent!r}")
    step = _count(row, "step")
    inp = _count(row, "input_tokens")
    out = _count(row, "output_tokens")
    assert step is not None and inp is not None and out is not None  # not optional
    return TraceStep(
        session_id=str(session_id),
        step=step,
        input_tokens=inp,
        output_tokens=out,
        llm_seconds=_seconds(row, "llm_seconds"),
        tool_seconds=_seconds(row, "tool_seconds") or 0.0,
        compaction=compaction,
        parent_session_id=None if parent is None else str(parent),
        parent_step=_count(row, "parent_step", optional=True),
        system_tokens=_count(row, "system_tokens", optional=True),
    )


def read_trace(path: Path | str) -> dict[str, TraceSession]:
    """Rows of a JSONL trace grouped by session (file order) and sorted by step.

    Raises ValueError naming the file and line of a row that lacks a field or has a bad value,
    and the session whose steps repeat or whose session fields disagree.
    """
    rows: dict[str, list[TraceStep]] = {}
    line_no = 0
    try:
        with Path(path).open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    step = _step_from_row(json.loads(line))
                except ValueError as error:  # json.JSONDecodeError is one
                    raise ValueError(f"{path}:{line_no}: bad trace row ({error})") from error
                except RecursionError:
                    raise ValueError(f"{path}:{line_no}: bad trace row (nested too deeply; "
                                     "a row is one flat JSON object)") from None
                rows.setdefault(step.session_id, []).append(step)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}:{line_no + 1}: not UTF-8 text ({error.reason}); a trace "
                         "is JSON lines") from None
    if not rows:
        raise ValueError(f"{path}: no trace rows (a trace is one JSON object a line)")
    return {sid: _session(path, sid, steps) for sid, steps in rows.items()}


def _session(path: Path | str, session_id: str, steps: list[TraceStep]) -> TraceSession:
    steps.sort(key=lambda s: s.step)
    for a, b in pairwise(steps):
        if a.step == b.step:
            raise ValueError(f"{path}: session {session_id!r} has step {a.step} twice")
    fields: dict[str, Any] = {}
    for name in _SESSION_FIELDS:
        values = {getattr(s, name) for s in steps} - {None}
        if len(values) > 1:
            raise ValueError(f"{path}: session {session_id!r} gives {name} as "
                             f"{sorted(values, key=str)}; give one value")
        fields[name] = values.pop() if values else None
    if (fields["parent_session_id"] is None) != (fields["parent_step"] is None):
        raise ValueError(f"{path}: session {session_id!r} needs parent_session_id and "
                         "parent_step together (which step of which session started it)")
    if fields["system_tokens"] is not None and fields["system_tokens"] > steps[0].input_tokens:
        raise ValueError(f"{path}: session {session_id!r} gives system_tokens "
                         f"{fields['system_tokens']}, more than its first prompt "
                         f"({steps[0].input_tokens} tokens)")
    return TraceSession(session_id, tuple(steps), **fields)


def plan_from_trace(
    session_id: str,
    steps: Sequence[TraceStep],
    *,
    token_scale: float = 1.0,
    time_scale: float = 1.0,
    system_prompt_tokens: int = 0,
    max_turns: int | None = None,
    subagents: Mapping[int, tuple[AgentPlan, ...]] | None = None,
) -> AgentPlan:
    """Turn one traced session into an agent program.

    Turn ``k``'s new tokens are what the history grew by beyond the previous call and its
    reply: ``input[k] - input[k-1] - output[k-1]``, clamped at 0 (agents sometimes trim
    their history; a replay cannot shrink a prompt). A compaction turn (the row says so, or
    its prompt is below ``COMPACTION_SHRINK`` of the previous one) starts a new history, as
    turn 0 does: its new tokens are its whole input less ``system_prompt_tokens`` (the part
    every agent of the job shares), given in trace tokens before scaling. ``subagents`` maps
    a turn index to the subagents its reply starts. The last turn's tool time is 0.
    """
    if not steps:
        raise ValueError(f"session {session_id!r} has no steps")
    chosen = list(steps[:max_turns] if max_turns is not None else steps)
    shared_raw = min(system_prompt_tokens, chosen[0].input_tokens)
    turns: list[TurnPlan] = []
    for k, step in enumerate(chosen):
        compaction = k > 0 and _compacts(chosen[k - 1], step)
        if k == 0 or compaction:
            new_raw = max(0, step.input_tokens - shared_raw)
        else:
            prev = chosen[k - 1]
            new_raw = max(0, step.input_tokens - prev.input_tokens - prev.output_tokens)
        last = k == len(chosen) - 1
        turns.append(
            TurnPlan(
                new_tokens=scale_tokens(new_raw, token_scale),
                output_tokens=scale_tokens(step.output_tokens, token_scale, minimum=1),
                tool_seconds=0.0 if last else step.tool_seconds * time_scale,
                llm_seconds=None if step.llm_seconds is None else step.llm_seconds * time_scale,
                compaction=compaction,
                subagents=() if last or subagents is None else subagents.get(k, ()),
            )
        )
    return AgentPlan(
        session_id=session_id,
        system_tokens=scale_tokens(system_prompt_tokens, token_scale),
        turns=tuple(turns),
    )


def _compacts(prev: TraceStep, step: TraceStep) -> bool:
    if step.compaction is not None:
        return step.compaction
    return step.input_tokens < COMPACTION_SHRINK * prev.input_tokens


def load_trace(
    path: Path | str = DEFAULT_TRACE,
    token_scale: float = 1.0,
    time_scale: float = 1.0,
    *,
    system_prompt_tokens: int = 0,
    max_turns: int | None = None,
    batches: Sequence[str] | None = None,
) -> list[AgentPlan]:
    """Every top-level session of a JSONL trace as an agent program, in file order, with
    its subagents inside the turns that start them (see plan_from_trace).

    ``system_prompt_tokens`` applies to sessions that do not give ``system_tokens``.
    ``batches`` keeps only sessions whose id starts with ``<batch>/`` (the shared trace
    names its sessions ``bs1/...``, ``bs4/...``, ``bs32/...``), with their subagents.
    ``max_turns`` (>= 1) keeps the first turns of every session; subagents that a dropped
    turn, or the last kept one, would have started are dropped with it. Raises ValueError
    naming the session whose parent is missing, whose parent_step is not a step of its
    parent (or is its parent's last step), or which is its own ancestor. Fields the format
    does not know (the shared trace's ``batch``) are ignored.
    """
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    sessions = read_trace(path)
    children: dict[str, dict[int, list[str]]] = {}
    for session in sessions.values():
        parent = session.parent_session_id
        if parent is None:
            continue
        if parent not in sessions:
            raise ValueError(f"{path}: session {session.session_id!r} names parent "
                             f"{parent!r}, which is not in the trace")
        steps = [s.step for s in sessions[parent].steps]
        if session.parent_step is None or session.parent_step not in steps:
            raise ValueError(f"{path}: session {session.session_id!r}: parent {parent!r} "
                             f"has no step {session.parent_step} (its steps: "
                             f"{_step_list(steps)})")
        if session.parent_step == steps[-1]:
            raise ValueError(f"{path}: session {session.session_id!r} starts after its "
                             f"parent's last step ({steps[-1]}), where nobody reads its report")
        _check_ancestry(path, sessions, session)
        index = steps.index(session.parent_step)
        children.setdefault(parent, {}).setdefault(index, []).append(session.session_id)

    def plan(session_id: str) -> AgentPlan:
        session = sessions[session_id]
        spawned = {k: tuple(plan(c) for c in ids)
                   for k, ids in children.get(session_id, {}).items()}
        system = (system_prompt_tokens if session.system_tokens is None
                  else session.system_tokens)
        return plan_from_trace(session_id, session.steps, token_scale=token_scale,
                               time_scale=time_scale, system_prompt_tokens=system,
                               max_turns=max_turns, subagents=spawned)

    return [
        plan(sid) for sid, session in sessions.items()
        if session.parent_session_id is None
        and (batches is None or sid.split("/", 1)[0] in batches)
    ]


def _step_list(steps: Sequence[int]) -> str:
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}..{steps[-1]}"
    shown = ", ".join(str(n) for n in steps[:8])
    return shown + (f", ... ({len(steps)} steps)" if len(steps) > 8 else "")


def _check_ancestry(path: Path | str, sessions: Mapping[str, TraceSession],
                    session: TraceSession) -> None:
    seen = {session.session_id}
    parent = session.parent_session_id
    while parent is not None:
        if parent in seen:
            raise ValueError(f"{path}: session {session.session_id!r} is its own ancestor "
                             f"(through {parent!r})")
        seen.add(parent)
        parent = sessions[parent].parent_session_id if parent in sessions else None


def trace_rows(plans: Iterable[AgentPlan]) -> Iterator[dict[str, Any]]:
    """Rows of ``plans`` in the trace format, each session's after its parent's: what
    :func:`load_trace` reads back (at scale 1, ``system_prompt_tokens`` aside) as the same
    plans. A subagent's rows name its parent and the parent's step that started it."""
    def rows(plan: AgentPlan, parent: tuple[str, int] | None) -> Iterator[dict[str, Any]]:
        contexts = plan.context_tokens()  # one pass; a prompt is its context less the reply
        for k, turn in enumerate(plan.turns):
            row: dict[str, Any] = {
                "session_id": plan.session_id,
                "step": k + 1,
                "input_tokens": contexts[k] - turn.output_tokens,
                "output_tokens": turn.output_tokens,
                "tool_seconds": turn.tool_seconds,
            }
            if turn.llm_seconds is not None:
                row["llm_seconds"] = turn.llm_seconds
            if k > 0:
                row["compaction"] = turn.compaction
            if k == 0:
                row["system_tokens"] = plan.system_tokens
                if parent is not None:
                    row["parent_session_id"], row["parent_step"] = parent
            yield row
        for k, turn in enumerate(plan.turns):
            for sub in turn.subagents:
                yield from rows(sub, (plan.session_id, k + 1))

    for plan in plans:
        yield from rows(plan, None)


def write_trace(path: Path | str, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write ``rows`` (:func:`trace_rows`, or an import's) as a JSONL trace; returns how many.
    Raises OSError where ``path`` cannot be written."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
            count += 1
    return count


def replay_stream(plans: Sequence[AgentPlan], seed: int) -> Iterator[AgentPlan]:
    """Endless replay of ``plans``: each pass is a seeded shuffle, and session ids get a
    ``#<n>`` suffix (their subagents' too) so that no two agents of one run share one."""
    if not plans:
        raise ValueError("replay_stream needs at least one plan")
    n = 0
    rounds = 0
    while True:
        order = list(plans)
        random.Random(f"{seed}:replay:{rounds}").shuffle(order)
        for plan in order:
            yield _renamed(plan, f"#{n}")
            n += 1
        rounds += 1


def _renamed(plan: AgentPlan, suffix: str) -> AgentPlan:
    turns = tuple(
        replace(t, subagents=tuple(_renamed(s, suffix) for s in t.subagents))
        if t.subagents else t
        for t in plan.turns
    )
    return AgentPlan(f"{plan.session_id}{suffix}", plan.system_tokens, turns)
