"""Public agent traces turned into this project's trace rows (bench/trace.py's format).

One format so far: the Claude Code conversations of kv-cache-tester's trace replayer (one
JSON file a conversation; docs/benchmarks.md, "Real Claude Code sessions"). A file holds
the conversation's ``id``, its ``system_tokens`` and ``tool_tokens`` and its ``requests``
in order. An LLM call there has ``t`` (seconds since the conversation began), ``in``,
``out``, ``api_time`` (the call's own time), ``think_time`` (the client's wait before
it: a tool, or a person) and ``hash_ids`` (one id per 64-token block of the prompt). A
subagent is an entry of ``"type": "subagent"`` with its own ``requests``; the subagents
that follow one call start together once it has replied, and the parent's next call waits
for all of them (its ``think_time`` spans their run).

How a conversation maps (a pure function; reading the files is the caller's):

* a call's ``tool_seconds`` is the next call's ``think_time``, capped at
  ``max_gap_seconds`` (people pause for hours between tasks; the replay keeps the agent's
  pace, not the person's). Where subagents run between the two, it is what the wait
  lasted beyond the longest of them (``duration_ms``);
* a call compacts when its prompt keeps less than half of the previous prompt's blocks
  (``hash_ids``' common prefix): the history was replaced, not extended. Without
  ``hash_ids`` the row leaves it to the reader's rule (trace.py's ``COMPACTION_SHRINK``);
* ``system_tokens`` is the conversation's system prompt and tool definitions, the part
  every session of the same agent shares;
* a conversation is cut before its first prompt above ``max_context_tokens`` (more than
  the engines being replayed on hold); one whose first prompt is already above is left out,
  as are subagents that start before the parent's first call or after its last kept one.
  :class:`ImportNotes` counts what was cut and left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The longest wait between two calls that a replay keeps (issue 11's long sessions: tool
# or human time, capped at 60 s).
DEFAULT_MAX_GAP_SECONDS = 60.0
# Prompts above this are more than the Claude models of the traces took at the time.
DEFAULT_MAX_CONTEXT_TOKENS = 200_000


@dataclass
class ImportNotes:
    """What an import kept, cut and left out."""

    sessions: int = 0
    subagents: int = 0
    rows: int = 0
    compactions: int = 0
    capped_gaps: int = 0
    cut_sessions: int = 0
    skipped_sessions: int = 0
    skipped_subagents: int = 0

    def describe(self) -> str:
        return (f"{self.rows} rows: {self.sessions} conversations and {self.subagents} "
                f"subagents, {self.compactions} compactions; {self.capped_gaps} waits "
                f"capped; {self.cut_sessions} sessions cut at the context limit, "
                f"{self.skipped_sessions} left out (first prompt above it), "
                f"{self.skipped_subagents} subagents left out (no parent call to follow)")


def kv_cache_tester_rows(
    doc: Mapping[str, Any],
    notes: ImportNotes,
    *,
    max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
) -> list[dict[str, Any]]:
    """Trace rows of one kv-cache-tester conversation (its subagents' after its own).

    Raises ValueError saying which field of which conversation is missing or wrong.
    """
    session_id = str(_field(doc, "id", "the conversation"))
    if not session_id:
        raise ValueError("the conversation's id is empty")
    rows: list[dict[str, Any]] = []
    _session(doc, session_id, None, notes, rows, max_gap_seconds, max_context_tokens)
    return rows


def _session(doc: Mapping[str, Any], session_id: str, parent: tuple[str, int] | None,
             notes: ImportNotes, out: list[dict[str, Any]], max_gap: float,
             max_context: int) -> bool:
    entries = _field(doc, "requests", session_id)
    if not isinstance(entries, list):
        raise ValueError(f"{session_id}: requests must be a list")
    calls: list[Mapping[str, Any]] = []
    spawned: list[tuple[int, Mapping[str, Any]]] = []  # (index of the call before, entry)
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise ValueError(f"{session_id}: every request must be an object")
        if entry.get("type") == "subagent":
            spawned.append((len(calls) - 1, entry))
        else:
            calls.append(entry)
    kept = _kept_calls(calls, session_id, max_context)
    if not kept:
        notes.skipped_sessions += 1
        notes.skipped_subagents += len(spawned)
        return False
    if len(kept) < len(calls):
        notes.cut_sessions += 1
    notes.subagents += parent is not None
    notes.sessions += parent is None
    longest: dict[int, float] = {}  # call index -> its longest subagent, seconds
    children: list[tuple[int, Mapping[str, Any]]] = []
    for after, entry in spawned:
        if 0 <= after < len(kept) - 1:
            children.append((after, entry))
            seconds = _number(entry, "duration_ms", session_id, default=0.0) / 1000.0
            longest[after] = max(longest.get(after, 0.0), seconds)
        else:
            notes.skipped_subagents += 1
    system = (_number(doc, "system_tokens", session_id, default=0.0)
              + _number(doc, "tool_tokens", session_id, default=0.0))
    for k, call in enumerate(kept):
        row: dict[str, Any] = {
            "session_id": session_id,
            "step": k + 1,
            "input_tokens": int(_number(call, "in", session_id)),
            "output_tokens": int(_number(call, "out", session_id)),
            "tool_seconds": _gap(kept, k, longest.get(k, 0.0), session_id, max_gap, notes),
        }
        if "api_time" in call:
            row["llm_seconds"] = _number(call, "api_time", session_id)
        if k == 0:
            row["system_tokens"] = int(min(system, row["input_tokens"]))
            if parent is not None:
                row["parent_session_id"], row["parent_step"] = parent
        else:
            compaction = _compacts(kept[k - 1], call)
            if compaction is not None:
                row["compaction"] = compaction
                notes.compactions += compaction
        out.append(row)
    notes.rows += len(kept)
    for n, (after, entry) in enumerate(children):
        agent = entry.get("agent_id") or f"agent_{n + 1}"
        _session(entry, f"{session_id}/{agent}", (session_id, after + 1), notes, out,
                 max_gap, max_context)
    return True


def _kept_calls(calls: Sequence[Mapping[str, Any]], session_id: str,
                max_context: int) -> list[Mapping[str, Any]]:
    for k, call in enumerate(calls):
        if _number(call, "in", session_id) > max_context:
            return list(calls[:k])
    return list(calls)


def _gap(calls: Sequence[Mapping[str, Any]], k: int, subagents: float, session_id: str,
         max_gap: float, notes: ImportNotes) -> float:
    """The wait after call ``k``: the next call's think_time (else the clock's gap less the
    call's own time), less its subagents' run, capped."""
    if k + 1 >= len(calls):
        return 0.0
    after = calls[k + 1]
    if "think_time" in after:
        wait = _number(after, "think_time", session_id)
    else:
        wait = (_number(after, "t", session_id, default=0.0)
                - _number(calls[k], "t", session_id, default=0.0)
                - _number(calls[k], "api_time", session_id, default=0.0))
    wait = max(0.0, wait - subagents)
    if wait > max_gap:
        notes.capped_gaps += 1
        return max_gap
    return wait


def _compacts(prev: Mapping[str, Any], call: Mapping[str, Any]) -> bool | None:
    before, now = prev.get("hash_ids"), call.get("hash_ids")
    if not isinstance(before, list) or not isinstance(now, list) or not before:
        return None
    return 2 * _common_prefix(before, now) < len(before)


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _field(doc: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in doc:
        raise ValueError(f"{where}: missing field {name!r}")
    return doc[name]


def _number(doc: Mapping[str, Any], name: str, where: str,
            default: float | None = None) -> float:
    value = doc.get(name)
    if value is None:  # absent, or null
        if default is None:
            raise ValueError(f"{where}: missing field {name!r}")
        return default
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"{where}: {name} must be a number >= 0, got {value!r}")
    return float(value)


def import_rows(
    docs: Iterable[tuple[str, Any]],
    notes: ImportNotes,
    *,
    max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
) -> Iterator[dict[str, Any]]:
    """Rows of every (source name, conversation) in turn. Raises ValueError naming the
    source of a conversation that is not one, lacks a field, or repeats an earlier id."""
    seen: dict[str, str] = {}
    for source, doc in docs:
        try:
            if not isinstance(doc, Mapping):
                raise ValueError(f"a conversation must be a JSON object, got {type(doc).__name__}")
            rows = kv_cache_tester_rows(doc, notes, max_gap_seconds=max_gap_seconds,
                                        max_context_tokens=max_context_tokens)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        if rows:
            first = rows[0]["session_id"]
            if first in seen:
                raise ValueError(f"{source}: conversation id {first!r} is also {seen[first]}'s")
            seen[first] = source
        yield from rows
