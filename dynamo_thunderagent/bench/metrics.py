"""What a closed-loop run measured: the figures workload.md asks for, from turn records alone.

Pure functions over :class:`~dynamo_thunderagent.bench.records.TurnRecord`-like objects (any
object with the same attributes), so they can be tested without a server.

Definitions (one place, so every report means the same thing):

* **steps/min**: successful LLM turns that *completed* inside the steady window
  ``[warmup_s, window_s - tail_s)`` (seconds since the run started), per minute of that window.
  A step is one turn plus the tool call after it; in a closed loop the tool call is the
  agent's own time, so counting turns counts steps.
* **prefix-cache hit rate**: cached prompt tokens / prompt tokens over all successful turns
  that reported usage (warm-up included: every program's first turn is cold by nature).
* **recomputed tokens**: for each successful turn ``k`` of a program whose previous
  successful turn ``j`` is known, the tokens that turn ``j`` left cached and that turn ``k``
  could reuse, ``expected = min(prompt_k, prompt_j [+ completion_j])``, rounded down to whole
  KV blocks, minus what turn ``k`` found cached; never negative. Whether ``completion_j``
  counts depends on whether the client sends the reply back verbatim (``reuse_completion``):
  the driver replaces replies by synthetic text, so it does not. A turn that starts a new
  history (a compaction) counts nothing as reusable, like a first turn.
* **turn latency**: end - start of successful turns (admission wait, queueing, prefill and
  decode), nearest-rank p50 / p99.
* **errors**: every failed request, turns and session-finals (or releases) alike;
  ``errors_by_type`` keys a turn's by its error's type (``APITimeoutError``) and the others
  with what they were (``APITimeoutError (session-final)``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from dynamo_thunderagent.quantile import percentile

KIND_NAMES = {"final": "session-final"}  # any other kind (``release``) by its own name


class RecordLike(Protocol):
    """The fields of a turn record the metrics read."""

    @property
    def kind(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def turn(self) -> int: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def cached_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def cancelled(self) -> bool: ...
    @property
    def parent_session_id(self) -> str | None: ...
    @property
    def compaction(self) -> bool: ...
    @property
    def joined(self) -> bool: ...


@dataclass
class ArmMetrics:
    """Figures of one run (one arm). Latencies in seconds; None where nothing was measured."""

    steps_per_min: float
    steady_turns: int
    steady_window_s: float
    turns_ok: int
    hit_rate: float | None
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    reusable_tokens: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    errors: int
    errors_by_type: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    agents_completed: int = 0
    # Agent-run completion time (first turn sent to last turn answered) of the agents that
    # ran whole inside the run; a warm-started agent (it began mid-program) is left out.
    agent_runs: int = 0
    agent_run_mean_s: float | None = None
    agent_run_p90_s: float | None = None
    # A rollout (one batch run to its end): when its last agent run ended (its last turn
    # answered), from the run's start; None when any run of the batch did not finish its
    # turns, and outside rollouts.
    makespan_s: float | None = None

    @property
    def recomputed_fraction(self) -> float | None:
        """Recomputed / reusable tokens: 0 when every reusable prefix was found cached."""
        return self.recomputed_tokens / self.reusable_tokens if self.reusable_tokens else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["recomputed_fraction"] = self.recomputed_fraction
        return data


def paired_ratio(arm: Mapping[Any, float], base: Mapping[Any, float]) -> float | None:
    """``arm``'s mean over ``base``'s, both over the repeats (keys) *both* have: a repeat one
    side lost would otherwise put its mean over other runs than the other's. None when they
    share no repeat or the base sums to zero."""
    both = [k for k in arm if k in base]
    denominator = sum(base[k] for k in both)
    return sum(arm[k] for k in both) / denominator if both and denominator else None


def _is_ok_turn(record: RecordLike) -> bool:
    return record.kind == "turn" and record.error is None and not record.cancelled


def steps_per_min(
    records: Iterable[RecordLike], *, warmup_s: float, window_s: float, tail_s: float = 0.0,
    closed: bool = False,
) -> tuple[float, int, float]:
    """``(steps/min, turns counted, steady window length)`` over ``[warmup_s, window_s-tail_s)``
    (``closed``: up to and including its end, as a rollout's window ends with its last turn).

    Raises ValueError if the steady window is empty.
    """
    start, stop = warmup_s, window_s - tail_s
    if stop <= start:
        raise ValueError(
            f"empty steady window: warmup {warmup_s}s, tail {tail_s}s, window {window_s}s"
        )
    count = sum(1 for r in records if _is_ok_turn(r) and start <= r.end
                and (r.end < stop or (closed and r.end == stop)))
    return count / ((stop - start) / 60.0), count, stop - start


def recomputed_tokens(
    records: Iterable[RecordLike], *, block_size: int = 1, reuse_completion: bool = True
) -> tuple[int, int]:
    """``(recomputed, reusable)`` tokens summed over programs (see the module docstring)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    by_session: dict[str, list[RecordLike]] = {}
    for record in records:
        if _is_ok_turn(record) and record.prompt_tokens is not None:
            by_session.setdefault(record.session_id, []).append(record)
    recomputed = reusable = 0
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        for prev, cur in itertools.pairwise(turns):
            assert prev.prompt_tokens is not None and cur.prompt_tokens is not None
            if cur.compaction:
                continue  # a new history: like a first turn, nothing of the last is reusable
            left = prev.prompt_tokens
            if reuse_completion:
                left += prev.completion_tokens or 0
            expected = min(cur.prompt_tokens, left) // block_size * block_size
            reusable += expected
            recomputed += max(0, expected - (cur.cached_tokens or 0))
    return recomputed, reusable


def cache_figures(records: Iterable[RecordLike]) -> tuple[int, int, float | None]:
    """``(prompt tokens, cached tokens, hit rate)`` over the records that reported usage."""
    prompt = cached = 0
    for record in records:
        if record.prompt_tokens is not None:
            prompt += record.prompt_tokens
            cached += record.cached_tokens or 0
    return prompt, cached, (cached / prompt if prompt else None)


def latency_percentiles(records: Iterable[RecordLike]) -> tuple[float | None, float | None]:
    """Nearest-rank p50 and p99 of the records' turn latency (end - start)."""
    latencies = [r.end - r.start for r in records]
    return percentile(latencies, 0.50), percentile(latencies, 0.99)


def error_label(record: RecordLike) -> str:
    """How a failed record counts in ``errors_by_type``: its error's type, followed for
    anything but a turn by what the request was, so that a session-final the engine did not
    answer within the driver's short timeout is not read as a lost turn."""
    kind = "" if record.kind == "turn" else f" ({KIND_NAMES.get(record.kind, record.kind)})"
    return (record.error_type or "unknown") + kind


def summarize(
    records: Sequence[RecordLike],
    *,
    warmup_s: float,
    window_s: float,
    tail_s: float = 0.0,
    block_size: int = 1,
    reuse_completion: bool = True,
    batch: int | None = None,
) -> ArmMetrics:
    """All figures of one run. ``agents_completed`` counts the agents' final requests.

    ``batch``: the run was a rollout of that many agents (``bench live --rollout``): the steady
    window is the batch, up to its last record (the makespan when every run finished; a run
    that failed ends the batch without one), or ``window_s`` where that cap cut it."""
    makespan = batch_makespan(records, batch) if batch is not None else None
    if batch is not None:  # to the last turn: a session-final is bookkeeping
        last_turn = max((r.end for r in records if r.kind == "turn"), default=None)
        if last_turn is not None:
            window_s = min(window_s, last_turn)
    rate, steady, steady_len = steps_per_min(
        records, warmup_s=warmup_s, window_s=window_s, tail_s=tail_s, closed=batch is not None
    )
    ok = [r for r in records if _is_ok_turn(r)]
    prompt, cached, hit_rate = cache_figures(ok)
    recomputed, reusable = recomputed_tokens(
        records, block_size=block_size, reuse_completion=reuse_completion
    )
    latency_p50, latency_p99 = latency_percentiles(ok)
    failed = [r for r in records if r.error is not None]
    return ArmMetrics(
        steps_per_min=rate,
        steady_turns=steady,
        steady_window_s=steady_len,
        turns_ok=len(ok),
        hit_rate=hit_rate,
        prompt_tokens=prompt,
        cached_tokens=cached,
        recomputed_tokens=recomputed,
        reusable_tokens=reusable,
        latency_p50_s=latency_p50,
        latency_p99_s=latency_p99,
        errors=len(failed),
        errors_by_type=dict(Counter(error_label(r) for r in failed)),
        cancelled=sum(1 for r in records if r.cancelled),
        # A subagent's session-final ends a subagent, not an agent run.
        agents_completed=sum(1 for r in records
                             if r.kind == "final" and r.parent_session_id is None),
        **_agent_runs(records),
        makespan_s=makespan,
    )


def batch_makespan(records: Sequence[RecordLike], agents: int) -> float | None:
    """When the last of a batch of ``agents`` agent runs ended (its last turn answered), or
    None unless every one of them ran whole from its first turn and finished its turns."""
    runs = whole_runs(records)
    if agents < 1 or len(runs) != agents:
        return None
    return max(end for _, end in runs.values())


def _agent_runs(records: Sequence[RecordLike]) -> dict[str, Any]:
    """Completion times of the agent runs that started at their first turn and finished."""
    times = [end - start for start, end in whole_runs(records).values()]
    return {"agent_runs": len(times),
            "agent_run_mean_s": sum(times) / len(times) if times else None,
            "agent_run_p90_s": percentile(times, 0.90)}


def whole_runs(records: Iterable[RecordLike], *,
               joined: bool = False) -> dict[str, tuple[float, float]]:
    """``(first turn sent, last turn answered)`` of each agent run, by session id, that
    started at its first turn and finished (its session-final was sent). A warm-started run,
    which began mid-program, is left out unless ``joined`` (then it counts from the turn it
    joined at: only a comparison of the same agents across arms, which join at the same
    turn, should ask for it); a subagent's turns are part of its parent's run.
    The session-final itself is not: ours and the Python port answer it in the router, stock
    and the builtin send it to a worker, where it may queue behind the batch."""
    first: dict[str, tuple[int, float]] = {}
    last: dict[str, float] = {}
    finished: set[str] = set()
    late: set[str] = set()  # warm-started: joined mid-program
    for r in records:
        run = r.parent_session_id or r.session_id
        if r.joined:
            late.add(run)
        if r.kind == "turn":
            last[run] = max(last.get(run, r.end), r.end)
            if r.parent_session_id is None:
                turn, start = first.get(run, (r.turn, r.start))
                first[run] = min((turn, start), (r.turn, r.start))
        elif r.kind == "final" and r.parent_session_id is None:
            finished.add(run)
    return {s: (first[s][1], last[s]) for s in finished
            if s in first and first[s][0] == 0 and (joined or s not in late)}
