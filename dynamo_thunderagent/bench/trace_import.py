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

How a conversation maps (pure functions; reading the files is the caller's):

* a call's ``tool_seconds`` is the next call's ``think_time``, capped at
  ``max_gap_seconds`` (people pause for hours between tasks; the replay keeps the agent's
  pace, not the person's). Where subagents run between the two, it is what the wait
  lasted beyond the longest of them (``duration_ms``);
* a call starts a new history (the row's ``compaction``) when its prompt keeps less than
  ``COMPACTION_SHRINK`` of the previous prompt's blocks (``hash_ids``' common prefix): a
  compaction, or an edit early in the history that no prefix cache survives (in the
  published traces about half of them shrink the prompt, half do not; a few are a switch
  between two models that one conversation interleaves, replayed here as one session).
  Without ``hash_ids`` the row leaves it to the reader's rule;
* ``system_tokens`` is the conversation's system prompt and tool definitions, the part
  every session of the same agent shares;
* a conversation is cut before its first prompt above ``max_context_tokens`` (more than
  the engines being replayed on hold); one whose first prompt is already above is left out,
  as are subagents that start before the parent's first call or after its last kept one
  (the parent then waits only for the subagents that run; for one cut at the limit, its
  whole recorded run). :class:`ImportNotes` counts what was cut and left out. Session ids
  must not repeat (a subagent's is ``<conversation id>/<agent_id>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from dynamo_thunderagent.bench.trace import COMPACTION_SHRINK, is_session_id, nonnegative

# The longest wait between two calls that a replay keeps (issue 11's long sessions: tool
# or human time, capped at 60 s).
DEFAULT_MAX_GAP_SECONDS = 60.0
# Prompts above this are more than the Claude models of the traces took at the time.
DEFAULT_MAX_CONTEXT_TOKENS = 200_000


@dataclass(frozen=True)
class ImportNotes:
    """What an import kept, cut and left out (``+`` adds two imports' notes)."""

    sessions: int = 0
    subagents: int = 0
    rows: int = 0
    restarts: int = 0  # calls that do not extend the previous prompt
    shrank: int = 0  # of those, calls whose prompt is shorter (compactions, mostly)
    capped_gaps: int = 0
    cut_sessions: int = 0
    too_long: int = 0  # sessions left out: the first prompt is above the context limit
    empty: int = 0  # sessions left out: no call at all
    orphans: int = 0  # subagents left out: no kept parent call before them, or after

    def __add__(self, other: ImportNotes) -> ImportNotes:
        return ImportNotes(*(getattr(self, f.name) + getattr(other, f.name)
                             for f in fields(self)))

    def describe(self) -> str:
        return (f"{self.sessions} conversations and {self.subagents} "
                f"subagents; {self.restarts} calls start a new history ({self.shrank} of "
                f"them shorter than the call before); {self.capped_gaps} waits capped; "
                f"{self.cut_sessions} sessions cut at the context limit; left out: "
                f"{self.too_long} sessions starting above it, {self.empty} without a call, "
                f"{self.orphans} subagents with no parent call to follow")


def kv_cache_tester_rows(
    doc: Mapping[str, Any],
    *,
    max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
) -> tuple[list[dict[str, Any]], ImportNotes]:
    """Trace rows of one kv-cache-tester conversation (its subagents' after its own), and
    what was kept, cut and left out.

    Raises ValueError saying which field of which conversation is missing or wrong.
    """
    session_id = _field(doc, "id", "the conversation")
    if not is_session_id(session_id):
        raise ValueError(f"the conversation's id must be a non-empty string, got {session_id!r}")
    limits = _Limits(max_gap_seconds, max_context_tokens)
    return _session(doc, str(session_id), None, limits)


@dataclass(frozen=True)
class _Limits:
    max_gap: float
    max_context: int


def _session(doc: Mapping[str, Any], session_id: str, parent: tuple[str, int] | None,
             limits: _Limits) -> tuple[list[dict[str, Any]], ImportNotes]:
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
    prompts = _kept_prompts(calls, session_id, limits.max_context)
    kept = calls[:len(prompts)]
    if not kept:
        # Neither this session nor anything it started runs.
        left = ImportNotes(empty=1) if not calls else ImportNotes(too_long=1)
        return [], left + ImportNotes(orphans=len(spawned))
    notes = ImportNotes(sessions=int(parent is None), subagents=int(parent is not None),
                        rows=len(kept), cut_sessions=int(len(kept) < len(calls)))
    # The subagents that run, converted first: the parent waits only for those.
    children: list[dict[str, Any]] = []
    longest: dict[int, float] = {}  # call index -> its longest subagent that runs, seconds
    for n, (after, entry) in enumerate(spawned):
        if not 0 <= after < len(kept) - 1:
            notes += ImportNotes(orphans=1)
            continue
        agent = entry.get("agent_id") or f"agent_{n + 1}"
        rows, child = _session(entry, f"{session_id}/{agent}", (session_id, after + 1), limits)
        notes += child
        if rows:
            children.extend(rows)
            seconds = _number(entry, "duration_ms", session_id, default=0.0) / 1000.0
            longest[after] = max(longest.get(after, 0.0), seconds)
    system = (_number(doc, "system_tokens", session_id, default=0.0)
              + _number(doc, "tool_tokens", session_id, default=0.0))
    own: list[dict[str, Any]] = []
    for k, call in enumerate(kept):
        wait, capped = _gap(kept, k, longest.get(k, 0.0), session_id, limits.max_gap)
        row: dict[str, Any] = {
            "session_id": session_id,
            "step": k + 1,
            "input_tokens": prompts[k],
            "output_tokens": _whole(call, "out", session_id),
            "tool_seconds": wait,
        }
        notes += ImportNotes(capped_gaps=int(capped))
        if call.get("api_time") is not None:
            row["llm_seconds"] = _number(call, "api_time", session_id)
        if k == 0:
            row["system_tokens"] = int(min(system, row["input_tokens"]))
            if parent is not None:
                row["parent_session_id"], row["parent_step"] = parent
        else:
            restart = _restarts(kept[k - 1], call)
            if restart is not None:
                row["compaction"] = restart
                shrank = restart and row["input_tokens"] < own[-1]["input_tokens"]
                notes += ImportNotes(restarts=int(restart), shrank=int(shrank))
        own.append(row)
    return own + children, notes


def _kept_prompts(calls: Sequence[Mapping[str, Any]], session_id: str,
                  max_context: int) -> list[int]:
    """The prompt tokens of the calls kept: those before the first prompt above
    ``max_context`` (read up to it, so a call after the cut is not checked)."""
    prompts: list[int] = []
    for call in calls:
        tokens = _whole(call, "in", session_id)
        if tokens > max_context:
            break
        prompts.append(tokens)
    return prompts


def _gap(calls: Sequence[Mapping[str, Any]], k: int, subagents: float, session_id: str,
         max_gap: float) -> tuple[float, bool]:
    """The wait after call ``k`` (the next call's think_time, else the clock's gap less the
    call's own time) less its subagents' run, capped; and whether the cap cut it."""
    if k + 1 >= len(calls):
        return 0.0, False
    after = calls[k + 1]
    if after.get("think_time") is not None:
        wait = _number(after, "think_time", session_id)
    else:
        wait = (_number(after, "t", session_id, default=0.0)
                - _number(calls[k], "t", session_id, default=0.0)
                - _number(calls[k], "api_time", session_id, default=0.0))
    wait = max(0.0, wait - subagents)
    return (max_gap, True) if wait > max_gap else (wait, False)


def _restarts(prev: Mapping[str, Any], call: Mapping[str, Any]) -> bool | None:
    """Whether ``call``'s prompt keeps less than ``COMPACTION_SHRINK`` of the previous
    prompt's blocks (a compaction, or an edit early in the history that no prefix cache
    survives); None without block hashes."""
    before, now = prev.get("hash_ids"), call.get("hash_ids")
    if not isinstance(before, list) or not isinstance(now, list) or not before:
        return None
    return _common_prefix(before, now) < COMPACTION_SHRINK * len(before)


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


def _number(doc: Mapping[str, Any], name: str, where: str, default: float | None = None,
            what: str = "a number", *, whole: bool = False) -> float:
    value = doc.get(name)
    if value is None:  # absent, or null
        if default is None:
            raise ValueError(f"{where}: missing field {name!r}")
        return default
    return nonnegative(value, f"{where}: {name}", what, whole=whole)


def _whole(doc: Mapping[str, Any], name: str, where: str) -> int:
    return int(_number(doc, name, where, what="a whole number of tokens", whole=True))


def import_rows(
    docs: Iterable[tuple[str, Any]],
    *,
    max_gap_seconds: float = DEFAULT_MAX_GAP_SECONDS,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
) -> tuple[list[dict[str, Any]], ImportNotes]:
    """Rows of every (source name, conversation) in turn, and the notes of them all.
    Raises ValueError naming the source of a conversation that is not one, lacks a field, or
    repeats an earlier id."""
    seen: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    notes = ImportNotes()
    for source, doc in docs:
        try:
            if not isinstance(doc, Mapping):
                raise ValueError(f"a conversation must be a JSON object, got {type(doc).__name__}")
            some, more = kv_cache_tester_rows(doc, max_gap_seconds=max_gap_seconds,
                                              max_context_tokens=max_context_tokens)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
        conversation = str(doc["id"])
        if conversation in seen:
            raise ValueError(f"{source}: conversation id {conversation!r} is also "
                             f"{seen[conversation]}'s")
        seen[conversation] = source
        for session in (row["session_id"] for row in some if row["step"] == 1):
            if session in seen and session != conversation:
                raise ValueError(f"{source}: session id {session!r} repeats one of "
                                 f"{seen[session]} (two subagents with one agent_id?)")
            seen[session] = source
        rows.extend(some)
        notes += more
    return rows, notes
