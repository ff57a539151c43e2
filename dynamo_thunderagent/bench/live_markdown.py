"""``bench live``: the report of :mod:`~dynamo_thunderagent.bench.live_report` as markdown
tables, one section per regime (pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dynamo_thunderagent.stack.arms import BASELINE_ARM


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
        "Means over repeats (errors: summed; turn max, admission wait max and paused max: "
        "the max); "
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
            f"{sweep.get('mean_peak_tokens')} tokens; "
            + (f"rollout: one batch of N agents per run, run to its end (capped at "
               f"{config.get('window_s')} s), figures over the batch"
               if config.get("rollout") else
               f"window {config.get('window_s')} s (steady after {config.get('warmup_s')} s)")
            + f"; {config.get('repeats')} repeat(s), arms interleaved."
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
    if BASELINE_ARM in arms and len(arms) > 1:
        out += head("Steps/min relative to stock (ratio of means):")
        for arm in arms:
            ratios = [(by_n(arm).get(str(n)) or {}).get("steps_per_min_vs_stock") for n in counts]
            cells = ["-" if r is None else f"{r:.2f}x" for r in ratios]
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        out.append("")
    if config.get("rollout"):
        out += head("Batch makespan, s (mean over the runs whose every agent finished, min-max "
                    "in parentheses; '-': none did, the cap cut the batch or a run was lost):")
        for arm in arms:
            cells = [_makespan_cell(by_n(arm).get(str(n))) for n in counts]
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
            "| arm | steps/min | vs stock | hit rate | recomputed tokens "
            "| turn p50 / p99 / max (s) | agent run mean / p90 (s) "
            "| admission wait p50 / p99 / max (s) "
            "| paused (mean / max) | pauses / resumes / moves | errors | failed runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            c = by_n(arm).get(str(n))
            if c is None:
                out.append(f"| {arm} | not run |" + " |" * 10)  # 12 columns, as the header
                continue
            out.append(_largest_row(arm, c, rollout=bool(config.get("rollout"))))
        out.append("")
        errors = [(arm, c["errors_by_type"]) for arm in arms
                  if (c := by_n(arm).get(str(n))) and c.get("errors_by_type")]
        for arm, by_type in errors:
            kinds = ", ".join(f"{count} {label}" for label, count in sorted(by_type.items()))
            out.append(f"- errors, {arm} (summed over repeats): {kinds}")
        if errors:
            out.append("")
    for f in failures:
        out.append(
            f"- failed: {f['arm']} at N={f['agents']} (repeat {f['repeat'] + 1}): {f['error']}"
        )
    if failures:
        out.append("")
    return out


def _makespan_cell(cell: Mapping[str, Any] | None) -> str:
    """A rollout's makespan over its repeats, saying how many have none (the cap cut the
    batch, or one of its runs was lost)."""
    text = _spread_cell(cell, "makespan_s", ".0f")
    if cell is None:
        return text
    ended = len(cell.get("spread", {}).get("makespan_s", {}).get("values", []))
    missing = cell["runs"] - cell.get("failed_runs", 0) - ended
    return text + (f" [{missing}/{cell['runs']} without: cut or a run lost]" if missing else "")


def _largest_row(arm: str, c: Mapping[str, Any], *, rollout: bool = False) -> str:
    ratio = c.get("steps_per_min_vs_stock")
    runs = f"{_f(c.get('agent_run_mean_s'), '.1f')} / {_f(c.get('agent_run_p90_s'), '.1f')}"
    finished, agents = c.get("agent_runs"), c.get("agents")
    if rollout and finished is not None and agents and finished < agents:
        # A rollout's run figures cover the runs that finished: say when some did not.
        done = f"{finished:.0f}" if float(finished).is_integer() else f"{finished:.1f}"
        runs += f" ({done} of {agents} runs)"
    cells = [
        arm,
        _spread_cell(c, "steps_per_min", ".0f"),
        "-" if ratio is None else f"{ratio:.2f}x",
        _f(c.get("hit_rate"), ".3f"),
        _f(c.get("recomputed_tokens"), ",.0f"),
        " / ".join(_f(c.get(k), ".2f") for k in (
            "latency_p50_s", "latency_p99_s", "latency_max_s")),
        runs,
        " / ".join(_f(c.get(k), ".2f") for k in (
            "admission_wait_p50_s", "admission_wait_p99_s", "admission_wait_max_s")),
        f"{_f(c.get('paused_mean'), '.1f')} / {_f(c.get('paused_max'), '.0f')}",
        " / ".join(_f(c.get(k), ".0f") for k in ("pauses", "resumes", "moves")),
        _f(c.get("errors"), ".0f"),
        str(c.get("failed_runs", 0)),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


