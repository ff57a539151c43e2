"""Agent programs replayed from a recorded trace (JSONL, one row per LLM call).

A traced session becomes an :class:`~dynamo_thunderagent.bench.workload.AgentPlan` like a
synthetic one (:func:`plan_from_trace`), so every harness runs either; :func:`replay_stream`
repeats a trace's sessions, seeded, for as many agents as a run starts. The only I/O in the
benchmark's workload side is reading the trace file here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan, scale_tokens

# Where the shared trace lives in this project's checkout layout.
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / ("swe-agent-lite-glm45.jsonl")
)

# The shared system prompt assumed when replaying the trace (trace tokens, before scaling):
# the trace records whole prompts, not which part every agent of the job shares.
TRACE_SYSTEM_TOKENS = 1000


@dataclass(frozen=True)
class TraceStep:
    """One row of a trace: the prompt of one LLM call and what followed it."""

    session_id: str
    step: int
    input_tokens: int
    output_tokens: int
    llm_seconds: float
    tool_seconds: float


def read_trace(path: Path | str) -> dict[str, list[TraceStep]]:
    """Rows of a JSONL trace grouped by session (file order) and sorted by step.

    Raises ValueError naming the file and line of a row that lacks a field or has a bad value.
    """
    sessions: dict[str, list[TraceStep]] = {}
    with Path(path).open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = TraceStep(
                    session_id=str(row["session_id"]),
                    step=int(row["step"]),
                    input_tokens=int(row["input_tokens"]),
                    output_tokens=int(row["output_tokens"]),
                    llm_seconds=float(row.get("llm_seconds", 0.0)),
                    tool_seconds=float(row.get("tool_seconds", 0.0)),
                )
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{line_no}: bad trace row ({error!r})") from error
            sessions.setdefault(step.session_id, []).append(step)
    for steps in sessions.values():
        steps.sort(key=lambda s: s.step)
    return sessions


def plan_from_trace(
    session_id: str,
    steps: Sequence[TraceStep],
    *,
    token_scale: float = 1.0,
    time_scale: float = 1.0,
    system_prompt_tokens: int = 0,
    max_turns: int | None = None,
) -> AgentPlan:
    """Turn one traced session into an agent program.

    Turn ``k``'s new tokens are what the history grew by beyond the previous call and its
    reply: ``input[k] - input[k-1] - output[k-1]``, clamped at 0 (agents sometimes truncate
    their history; a replay cannot shrink a prompt). Turn 0's new tokens are its whole input
    less ``system_prompt_tokens`` (the part every agent of the job shares), given in trace
    tokens before scaling. The last turn's tool time is 0.
    """
    if not steps:
        raise ValueError(f"session {session_id!r} has no steps")
    chosen = list(steps[:max_turns] if max_turns is not None else steps)
    shared_raw = min(system_prompt_tokens, chosen[0].input_tokens)
    turns: list[TurnPlan] = []
    for k, step in enumerate(chosen):
        if k == 0:
            new_raw = step.input_tokens - shared_raw
        else:
            prev = chosen[k - 1]
            new_raw = max(0, step.input_tokens - prev.input_tokens - prev.output_tokens)
        last = k == len(chosen) - 1
        turns.append(
            TurnPlan(
                new_tokens=scale_tokens(new_raw, token_scale),
                output_tokens=scale_tokens(step.output_tokens, token_scale, minimum=1),
                tool_seconds=0.0 if last else step.tool_seconds * time_scale,
                llm_seconds=step.llm_seconds * time_scale,
            )
        )
    return AgentPlan(
        session_id=session_id,
        system_tokens=scale_tokens(system_prompt_tokens, token_scale),
        turns=tuple(turns),
    )


def load_trace(
    path: Path | str = DEFAULT_TRACE,
    token_scale: float = 1.0,
    time_scale: float = 1.0,
    *,
    system_prompt_tokens: int = 0,
    max_turns: int | None = None,
    batches: Sequence[str] | None = None,
) -> list[AgentPlan]:
    """Every session of a JSONL trace as an agent program, in file order (see plan_from_trace).

    ``batches`` keeps only rows whose session id starts with ``<batch>/`` (the shared trace
    names its sessions ``bs1/...``, ``bs4/...``, ``bs32/...``).
    """
    plans = []
    for session_id, steps in read_trace(path).items():
        if batches is not None and session_id.split("/", 1)[0] not in batches:
            continue
        plans.append(
            plan_from_trace(
                session_id,
                steps,
                token_scale=token_scale,
                time_scale=time_scale,
                system_prompt_tokens=system_prompt_tokens,
                max_turns=max_turns,
            )
        )
    return plans


def replay_stream(plans: Sequence[AgentPlan], seed: int) -> Iterator[AgentPlan]:
    """Endless replay of ``plans``: each pass is a seeded shuffle, and session ids get a
    ``#<n>`` suffix so that no two agents of one run share a session id."""
    if not plans:
        raise ValueError("replay_stream needs at least one plan")
    n = 0
    rounds = 0
    while True:
        order = list(plans)
        random.Random(f"{seed}:replay:{rounds}").shuffle(order)
        for plan in order:
            yield AgentPlan(f"{plan.session_id}#{n}", plan.system_tokens, plan.turns)
            n += 1
        rounds += 1
