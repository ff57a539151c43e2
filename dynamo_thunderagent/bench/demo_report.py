"""``dynamo-thunderagent demo``: the figures, the timeline and the printed table (pure).

The demo runs each arm once (see :mod:`dynamo_thunderagent.bench.demo`); every figure of an
arm is one row of ``bench live`` (:func:`~dynamo_thunderagent.bench.live_report.make_row`),
so a figure here means exactly what it means in ``docs/benchmarks.md``. This module adds
what the demo shows on top: steps/min and hit rate over time, the side-by-side table and the
ratios of each arm to the first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dynamo_thunderagent.bench.metrics import RecordLike, whole_runs
from dynamo_thunderagent.quantile import percentile

SCHEMA = "dynamo-thunderagent/demo/v2"


# ============================================================================================
# Steps/min and hit rate over time
# ============================================================================================


@dataclass(frozen=True)
class TimelineBucket:
    """The successful turns that completed in ``[start_s, end_s)`` of one run."""

    start_s: float
    end_s: float
    steps: int
    steps_per_min: float
    hit_rate: float | None  # cached / prompt tokens of those turns; None without usage

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeline(
    records: Iterable[RecordLike], *, bucket_s: float, until_s: float
) -> list[TimelineBucket]:
    """Steps/min and prefix-cache hit rate of the turns completed in each ``bucket_s`` slice
    of ``[0, until_s)`` (seconds since the run started); the last slice may be shorter.

    A turn counts where it *completed*, like steps/min over the steady window, so the sum of
    the buckets' steps inside that window is the window's step count.
    """
    if bucket_s <= 0 or until_s <= 0:
        raise ValueError(f"bucket_s and until_s must be > 0, got {bucket_s}, {until_s}")
    count = math.ceil(until_s / bucket_s)
    steps = [0] * count
    prompt = [0] * count
    cached = [0] * count
    for r in records:
        if r.kind != "turn" or r.error is not None or r.cancelled or not 0 <= r.end < until_s:
            continue
        k = min(int(r.end // bucket_s), count - 1)
        steps[k] += 1
        if r.prompt_tokens is not None:
            prompt[k] += r.prompt_tokens
            cached[k] += r.cached_tokens or 0
    buckets = []
    for k in range(count):
        start, end = k * bucket_s, min((k + 1) * bucket_s, until_s)
        buckets.append(TimelineBucket(
            start_s=start, end_s=end, steps=steps[k],
            steps_per_min=steps[k] * 60.0 / (end - start),
            hit_rate=cached[k] / prompt[k] if prompt[k] else None,
        ))  # fmt: skip
    return buckets


# ============================================================================================
# Agent-run completion of the same agents in every arm
# ============================================================================================


def agent_run_times(records: Iterable[RecordLike]) -> dict[str, float]:
    """Completion time of every agent that finished inside the run, by session id: its first
    turn in the run sent to its last turn answered (:func:`~dynamo_thunderagent.bench.
    metrics.whole_runs`). The agents a run starts with join mid-program (a warm start) and
    are counted from there: :func:`paired_agent_runs` compares only agents every arm
    finished, which every arm started at the same turn with the same history."""
    return {s: end - start for s, (start, end) in whole_runs(records, joined=True).items()}


def paired_agent_runs(times: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Per arm, the completion time of the agent runs that *every* arm finished.

    Each arm's own agent-run mean covers the agents it finished, and a faster arm finishes
    more and longer programs in the same window, so those means compare different agents.
    Every arm replays the same seeded programs under the same session ids, so the runs all
    arms finished are the same programs: ``{arm: {"agent_runs_paired", "agent_run_paired_mean_s",
    "agent_run_paired_p90_s"}}`` over them (None when there is none).
    """
    common = set.intersection(*(set(t) for t in times.values())) if times else set()
    out: dict[str, dict[str, Any]] = {}
    for arm, by_session in times.items():
        values = sorted(by_session[s] for s in common)
        out[arm] = {
            "agent_runs_paired": len(values),
            "agent_run_paired_mean_s": sum(values) / len(values) if values else None,
            "agent_run_paired_p90_s": percentile(values, 0.90),
        }
    return out


# ============================================================================================
# The table
# ============================================================================================


@dataclass(frozen=True)
class Figure:
    """One figure of a demo row: its key in the row, its label, and how it prints.

    ``short`` names it in the ratio line; a figure without one has no ratio there (counts
    and waits only one arm measures).
    """

    key: str
    label: str
    spec: str
    short: str | None = None


#: Every figure the demo reports, in the order it prints them. ``None`` in a row means the
#: arm cannot measure it (stock has no admission control and no pauses) or nothing happened
#: that defines it (no agent ran whole inside the run).
FIGURES: tuple[Figure, ...] = (
    Figure("steps_per_min", "steps/min (steady window)", ".0f", "steps/min"),
    Figure("hit_rate", "prefix-cache hit rate (steady)", ".3f", "hit rate"),
    # The share, not the count, is what compares: an arm that ran more turns has more
    # tokens it could have reused.
    Figure("recomputed_fraction", "recomputed share of reusable tokens", ".3f",
           "recomputed share"),
    Figure("recomputed_tokens", "  recomputed tokens", ",.0f"),
    Figure("agent_run_paired_mean_s", "agent-run completion mean (s)", ".1f",
           "agent-run mean"),
    Figure("agent_run_paired_p90_s", "agent-run completion p90 (s)", ".1f", "agent-run p90"),
    Figure("agent_runs_paired", "  same agents, finished in every arm", ".0f"),
    Figure("agent_run_mean_s", "  mean over whole runs the arm finished (s)", ".1f"),
    Figure("agent_runs", "  whole runs (from turn 0) the arm finished", ".0f"),
    Figure("latency_p50_s", "turn latency p50 (s)", ".2f", "turn p50"),
    Figure("latency_p99_s", "turn latency p99 (s)", ".2f", "turn p99"),
    Figure("latency_max_s", "  longest turn, unfinished ones so far (s)", ".2f"),
    Figure("latency_censored", "  turns unfinished or timed out (in p99)", ".0f"),
    Figure("admission_wait_p50_s", "admission wait p50 (s)", ".2f"),
    Figure("admission_wait_p99_s", "admission wait p99 (s)", ".2f"),
    Figure("admission_wait_max_s", "admission wait max (s)", ".2f"),
    Figure("admission_wait_censored_max_s", "  longest wait not admitted (s)", ".2f"),
    Figure("paused_mean", "programs paused (mean, steady)", ".1f"),
    Figure("pauses", "pauses", ".0f"),
    Figure("resumes", "resumes", ".0f"),
    Figure("moves", "moves to another worker", ".0f"),
    Figure("turns_ok", "turns completed", ".0f"),
    Figure("errors", "errors", ".0f"),
)


def _cell(row: Mapping[str, Any], figure: Figure) -> str:
    value = row.get(figure.key)
    if value is None:
        # An arm that measures admission waits and had no wait cut off at the end.
        waits = figure.key == "admission_wait_censored_max_s"
        return "none" if waits and row.get("admission_wait_max_s") is not None else "-"
    if figure.spec.endswith("f") and isinstance(value, (int, float)):
        return format(float(value), figure.spec)
    return format(value, figure.spec)


def ratio(row: Mapping[str, Any], base: Mapping[str, Any], key: str) -> float | None:
    """``row[key] / base[key]``; None when either is missing or the base is 0."""
    value, reference = row.get(key), base.get(key)
    if value is None or reference is None or reference == 0:
        return None
    return float(value) / float(reference)


def ratios(row: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float | None]:
    """Every ratio figure of ``row`` relative to ``base``."""
    return {f.key: ratio(row, base, f.key) for f in FIGURES if f.short is not None}


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Arms as columns, one figure a line, then one ratio line per arm after the first.

    Each row is a ``bench live`` row (``make_row``): its ``arm`` names the column.
    """
    if not rows:
        return "(no arm ran)"
    label_w = max(len(f.label) for f in FIGURES)
    col_w = max(10, *(len(str(r["arm"])) for r in rows))
    lines = [f"{'':<{label_w}}  " + "  ".join(f"{r['arm']:>{col_w}}" for r in rows)]
    for f in FIGURES:
        cells = [_cell(r, f) for r in rows]
        lines.append(f"{f.label:<{label_w}}  " + "  ".join(f"{c:>{col_w}}" for c in cells))
    base = rows[0]
    for row in rows[1:]:
        parts = []
        for f in FIGURES:
            if f.short is not None:
                value = ratio(row, base, f.key)
                parts.append(f"{f.short} {'-' if value is None else f'{value:.2f}x'}")
        lines.append(f"{row['arm']} / {base['arm']}: " + ", ".join(parts))
    for row in rows:
        if row.get("error"):
            lines.append(f"{row['arm']}: run failed: {row['error']}")
    return "\n".join(lines)

