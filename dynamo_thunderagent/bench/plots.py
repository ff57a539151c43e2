"""PNG plots of a ``bench live`` report and of the demo (matplotlib, Agg backend: no display).

``bench live``, per regime: steps/min vs N per arm (mean, bars from min to max over
repeats), prefix-cache hit rate vs N, and the turn-latency CDF at the largest N (every
repeat's steady-window turns pooled per arm). The demo: steps/min and hit rate over one
run's time per arm (:func:`write_timeline`). Importing this module raises ImportError
without matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _series(arm: Mapping[str, Any], counts: Sequence[int], name: str) -> tuple[
    list[int], list[float], list[float], list[float]
]:  # fmt: skip
    xs: list[int] = []
    ys: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for n in counts:
        cell = arm.get("by_n", {}).get(str(n))
        if not cell or cell.get(name) is None:
            continue
        spread = cell.get("spread", {}).get(name, {})
        mean = float(cell[name])
        xs.append(n)
        ys.append(mean)
        lo.append(mean - float(spread.get("min", mean)))
        hi.append(float(spread.get("max", mean)) - mean)
    return xs, ys, lo, hi


def _vs_n(regime: str, data: Mapping[str, Any], pressures: Mapping[int, float], name: str,
          ylabel: str, path: Path) -> Path:  # fmt: skip
    counts = list(data.get("agents", []))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, arm in data.get("arms", {}).items():
        xs, ys, lo, hi = _series(arm, counts, name)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label=label)
    ax.set_xticks(counts)
    ax.set_xticklabels([f"{n}\n{pressures.get(n, 0):.1f}x" for n in counts])
    ax.set_xlabel("agents N (total peak context / KV capacity)")
    ax.set_ylabel(ylabel)
    if name == "hit_rate":
        ax.set_ylim(0, 1.02)
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(f"{ylabel} vs N, regime {regime} (mean, bars: min-max over repeats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(regime: str, report: Mapping[str, Any], n: int, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    pooled: dict[str, list[float]] = {}
    for row in report.get("runs", []):
        if row.get("regime") == regime and row.get("agents") == n:
            pooled.setdefault(row["arm"], []).extend(row.get("turn_latencies_s") or [])
    for label in report.get("regimes", {}).get(regime, {}).get("arms", {}):
        values = sorted(v for v in pooled.get(label, []) if v > 0)
        if not values:
            continue
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", label=f"{label} ({len(values)} turns)")
    ax.set_xscale("log")
    ax.set_xlabel("turn latency (s, log scale)")
    ax.set_ylabel("fraction of turns")
    ax.set_ylim(0, 1.0)
    ax.set_title(f"Turn latency CDF at N={n}, regime {regime} (steady window, repeats pooled)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the three plots of every regime in ``report`` into ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    regime_configs = report.get("config", {}).get("regimes", {})
    for regime, data in report.get("regimes", {}).items():
        sweep = regime_configs.get(regime, {}).get("sweep", {})
        pressures = dict(zip(sweep.get("agents", []), sweep.get("pressures", []), strict=False))
        written.append(_vs_n(regime, data, pressures, "steps_per_min", "steps/min",
                             out_dir / f"steps_per_min_{regime}.png"))  # fmt: skip
        written.append(_vs_n(regime, data, pressures, "hit_rate", "prefix-cache hit rate",
                             out_dir / f"hit_rate_{regime}.png"))  # fmt: skip
        if data.get("largest_agents") is not None:
            written.append(_cdf(regime, report, int(data["largest_agents"]),
                                out_dir / f"latency_cdf_{regime}.png"))  # fmt: skip
    return written


def write_timeline(
    timelines: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, *, title: str,
    warmup_s: float = 0.0,
) -> Path:  # fmt: skip
    """Steps/min (top) and prefix-cache hit rate (bottom) over one run's time, one line per
    arm, from the demo's timeline buckets (``start_s``, ``end_s``, ``steps_per_min``,
    ``hit_rate``); the warm-up before ``warmup_s`` is shaded. Writes ``path``, returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.0, 6.5), sharex=True)
    for label, buckets in timelines.items():
        mids = [(float(b["start_s"]) + float(b["end_s"])) / 2 for b in buckets]
        top.plot(mids, [float(b["steps_per_min"]) for b in buckets], marker="o", label=label)
        hit = [(m, float(b["hit_rate"])) for m, b in zip(mids, buckets, strict=True)
               if b.get("hit_rate") is not None]  # fmt: skip
        bottom.plot([m for m, _ in hit], [h for _, h in hit], marker="o", label=label)
    for ax in (top, bottom):
        if warmup_s > 0:
            ax.axvspan(0, warmup_s, color="grey", alpha=0.15, lw=0)
        ax.grid(alpha=0.3)
    top.legend(loc="lower right")
    top.set_ylabel("steps/min")
    top.set_ylim(bottom=0)
    top.set_title(title + (f" (shaded: warm-up, {warmup_s:g} s)" if warmup_s > 0 else ""))
    bottom.set_ylabel("prefix-cache hit rate")
    bottom.set_ylim(0, 1.02)
    bottom.set_xlabel("seconds since the run started (turns binned by completion time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
