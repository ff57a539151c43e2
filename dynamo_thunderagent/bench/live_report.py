"""``bench live``: scheduler figures per arm, per-run rows and aggregation over repeats (pure).

See :mod:`dynamo_thunderagent.bench.live` for the definitions of the figures, and
:mod:`dynamo_thunderagent.bench.live_markdown` for the report as markdown tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dynamo_thunderagent.bench.live_sweep import RunKey
from dynamo_thunderagent.bench.metrics import paired_ratio
from dynamo_thunderagent.bench.runner import ArmResult
from dynamo_thunderagent.quantile import percentile
from dynamo_thunderagent.stack.arms import BASELINE_ARM

SCHEMA = "dynamo-thunderagent/bench-live/v1"


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
    "admission_wait_censored_max_s": None,
}


# ============================================================================================
# Per-run rows and aggregation (pure)
# ============================================================================================


def steady_figures(records: Iterable[Any], start: float, stop: float) -> dict[str, Any]:
    """Steady-window hit rate and turn latency of one run.

    ``hit_rate``: cached / prompt tokens of the successful turns that completed in
    ``[start, stop)``. Latency: every turn that *started* in ``[start, stop)`` and did not
    fail; a turn still waiting when the drain ended (``cancelled``) or that the client gave
    up on (its request timed out) counts with its time until then, a lower bound of what an
    answer would have taken, so that arms that hold turns back cannot hide their tail by
    never finishing them or by outlasting the client (``latency_censored`` counts those).
    Other failures stay out: a turn refused at once says nothing about how long one runs.
    ``latency_max_s``, the longest of those turn latencies (its wait included), is the one
    figure in which every arm shows how long it held a turn back: a router that does not
    report its waits (the ports) shows them here, as a lower bound where the turn was cut
    off.
    """
    done = [
        r for r in records
        if r.kind == "turn" and r.error is None and not r.cancelled and start <= r.end < stop
    ]  # fmt: skip
    prompt = sum(r.prompt_tokens or 0 for r in done if r.prompt_tokens is not None)
    cached = sum(r.cached_tokens or 0 for r in done if r.prompt_tokens is not None)
    started = [r for r in records if r.kind == "turn" and start <= r.start < stop
               and (r.error is None or _timed_out(r))]
    latencies = sorted(r.end - r.start for r in started)
    return {
        "hit_rate": cached / prompt if prompt else None,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "latency_max_s": latencies[-1] if latencies else None,
        "latency_censored": sum(1 for r in started if r.cancelled or r.error is not None),
        "latencies": latencies,
    }


def _timed_out(record: Any) -> bool:
    """The client gave up on the request (its timeout: the OpenAI client's
    ``APITimeoutError``, an ``asyncio`` or ``httpx`` timeout)."""
    return "Timeout" in (record.error_type or "")


ROW_METRICS: tuple[str, ...] = (
    "steps_per_min", "hit_rate", "hit_rate_all", "recomputed_tokens", "recomputed_fraction",
    "latency_p50_s", "latency_p99_s", "latency_max_s", "admission_wait_p50_s",
    "admission_wait_p99_s", "admission_wait_max_s", "pauses", "resumes", "moves",
    "forced_resumes", "paused_mean", "paused_max", "errors", "cancelled", "turns_ok",
    "steady_turns", "agents_completed", "latency_censored", "admission_wait_censored_max_s",
    "agent_runs", "agent_run_mean_s", "agent_run_p90_s", "makespan_s",
)  # fmt: skip
# How a cell's headline value combines its repeats (default: mean).
SUMMED = frozenset({"errors"})
MAXED = frozenset({
    "latency_max_s", "admission_wait_max_s", "admission_wait_censored_max_s", "paused_max"})


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
        if row["makespan_s"] is not None:  # a rollout's batch that ended: its window (every
            window_s = row["makespan_s"]  # turn ends before its agent's session-final)
        steady = steady_figures(result.run.records, warmup_s, window_s)
        row["hit_rate"] = steady["hit_rate"]
        row["latency_p50_s"] = steady["latency_p50_s"]
        row["latency_p99_s"] = steady["latency_p99_s"]
        row["latency_max_s"] = steady["latency_max_s"]
        row["latency_censored"] = steady["latency_censored"]
        row["turn_latencies_s"] = [round(x, 3) for x in steady["latencies"]]
        if result.run.background:  # sessionless requests sent beside the agents
            row["background"] = dict(result.run.background)
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
    ``latency_max_s``, ``admission_wait_max_s``, ``admission_wait_censored_max_s`` and
    ``paused_max``: the max); None when no run did. ``spread`` holds mean, min, max and the
    values per figure. Failed runs (an ``error``) count in ``failed_runs`` and contribute no
    figures.
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
    by_type: Counter[str] = Counter()  # over the runs ``errors`` sums
    for r in ok:
        by_type.update(r.get("errors_by_type") or {})
    cell["errors_by_type"] = dict(by_type)
    return cell


def _steps_by_repeat(rows: Sequence[Mapping[str, Any]]) -> dict[Any, float]:
    """Steps/min of each repeat that ran and reported them."""
    return {r.get("repeat"): float(r["steps_per_min"]) for r in rows
            if r.get("error") is None and r.get("steps_per_min") is not None}


def vs_stock(arm_rows: Sequence[Mapping[str, Any]],
             stock_rows: Sequence[Mapping[str, Any]]) -> float | None:
    """An arm's steps/min over stock's, over the repeats *both* ran (:func:`paired_ratio`)."""
    return paired_ratio(_steps_by_repeat(arm_rows), _steps_by_repeat(stock_rows))


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """``{regime: {arm: {N: cell}}}`` (arms and N in first-seen order); ratios to ``stock``
    (``steps_per_min_vs_stock``) where stock has a value at the same N, over the repeats
    both ran."""
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
        stock = arms.get(BASELINE_ARM, {})
        for arm, by_n in cells.items():
            for n, cell in by_n.items():
                cell["steps_per_min_vs_stock"] = vs_stock(arms[arm][n], stock.get(n, []))
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
