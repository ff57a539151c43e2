"""Fitting the SWE-agent trace's recorded GPU timings (pure Python).

Median regression (iteratively reweighted least squares) of each step's LLM time on its
uncached prompt tokens and generated tokens; see docs/calibration.md for the assumptions.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.calibration.timing import GpuTiming
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE

# --------------------------------------------------------------------------------------------
# Fitting the trace (pure Python: median regression by iteratively reweighted least squares)
# --------------------------------------------------------------------------------------------


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Solve a small dense linear system by Gaussian elimination with partial pivoting."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            raise ValueError("singular system in regression")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def quantile_regression(
    rows: Sequence[Sequence[float]], y: Sequence[float], q: float = 0.5, iterations: int = 200
) -> list[float]:
    """Coefficients minimising the pinball loss at quantile ``q`` (IRLS, deterministic).

    The median (``q = 0.5``) ignores the trace's heavy right tail (calls that took 5-10x
    longer than their token counts explain: retries, stalls) that would drag a least-squares
    fit around.
    """
    k = len(rows[0])
    w = [1.0] * len(y)
    coef = [0.0] * k
    for _ in range(iterations):
        xtx = [[0.0] * k for _ in range(k)]
        xty = [0.0] * k
        for x, t, wi in zip(rows, y, w, strict=True):
            for i in range(k):
                xi = wi * x[i]
                xty[i] += xi * t
                for j in range(k):
                    xtx[i][j] += xi * x[j]
        new = _solve(xtx, xty)
        converged = all(
            abs(a - b) <= 1e-10 * max(1.0, abs(b)) for a, b in zip(new, coef, strict=True)
        )
        coef = new
        if converged:
            break
        w = []
        for x, t in zip(rows, y, strict=True):
            r = t - sum(c * v for c, v in zip(coef, x, strict=True))
            w.append((q if r >= 0 else 1.0 - q) / max(abs(r), 1e-4))
    return coef


@dataclass(frozen=True)
class StepRow:
    """One trace step: the uncached prompt tokens it most likely prefilled, and its cost."""

    batch: str
    context: int
    new_tokens: int
    output_tokens: int
    llm_seconds: float


def trace_steps(path: Path = DEFAULT_TRACE) -> list[StepRow]:
    """Trace rows with the uncached-token estimate of each step.

    Assumption: vLLM's prefix cache holds the previous call's prompt *and* its generated
    tokens (same session, nothing evicted at these batch sizes), so step ``k`` prefills
    ``input[k] - input[k-1] - output[k-1]`` tokens: the tool output and the next
    instruction. In the trace this is never below 60 tokens, consistent with the history
    being appended verbatim. The first step of a session prefills its whole prompt.
    """
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                sessions[row["session_id"]].append(row)
    out: list[StepRow] = []
    for sid in sorted(sessions):
        prev: dict[str, Any] | None = None
        for row in sorted(sessions[sid], key=lambda r: r["step"]):
            cached = 0 if prev is None else prev["input_tokens"] + prev["output_tokens"]
            out.append(
                StepRow(
                    batch=row.get("batch", sid.split("/", 1)[0]),
                    context=int(row["input_tokens"]),
                    new_tokens=max(0, int(row["input_tokens"]) - cached),
                    output_tokens=int(row["output_tokens"]),
                    llm_seconds=float(row["llm_seconds"]),
                )
            )
            prev = row
    return out


@dataclass(frozen=True)
class TraceFit:
    """Median-regression fit ``llm_seconds ~ overhead[g] + prefill * new + decode[g] * out``.

    ``g`` is the batch group (bs1, bs4, bs32). The prefill slope is shared by bs1 and bs4,
    where the GPU is not saturated; bs32's decode slope is fitted with that prefill slope
    held fixed (at 32 agents others' prefills interleave with every decode step, which makes
    the per-token prefill slope unidentifiable there).
    """

    prefill_us_per_token: float
    overhead_s: dict[str, float]
    decode_ms_per_token: dict[str, float]
    median_context: dict[str, float]
    rows: dict[str, int]
    bs32_interference_ms: float = 0.0

    def timing(self) -> GpuTiming:
        """The :class:`GpuTiming` these fits imply (decode shape from the bs1 and bs4 points)."""
        base = GpuTiming()
        e1, e4 = base.experts_touched(1), base.experts_touched(4)
        d1, d4 = self.decode_ms_per_token["bs1"], self.decode_ms_per_token["bs4"]
        per_expert = (d4 - d1) / (e4 - e1)
        return GpuTiming(
            prefill_us_per_token=round(self.prefill_us_per_token, 1),
            decode_base_ms=round(d1 - per_expert * e1, 1),
            decode_ms_per_expert=round(per_expert, 3),
            request_overhead_s=round(
                (
                    self.overhead_s["bs1"] * self.rows["bs1"]
                    + self.overhead_s["bs4"] * self.rows["bs4"]
                )
                / (self.rows["bs1"] + self.rows["bs4"]),
                2,
            ),
        )


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def fit_trace(path: Path = DEFAULT_TRACE) -> TraceFit:
    """Fit the reference deployment's prefill and decode costs from the trace."""
    steps = trace_steps(path)
    groups = ("bs1", "bs4")
    sel = [s for s in steps if s.batch in groups]
    # Columns: overhead per group, prefill per 1k new tokens, decode per token per group.
    xs: list[list[float]] = []
    for s in sel:
        xs.append(
            [
                *(1.0 if s.batch == g else 0.0 for g in groups),
                s.new_tokens / 1000.0,
                *(s.output_tokens if s.batch == g else 0.0 for g in groups),
            ]
        )
    coef = quantile_regression(xs, [s.llm_seconds for s in sel])
    prefill_s_per_1k = coef[2]
    overhead = {g: coef[i] for i, g in enumerate(groups)}
    decode = {g: 1000.0 * coef[3 + i] for i, g in enumerate(groups)}

    b32 = [s for s in steps if s.batch == "bs32"]
    if b32:
        y = [s.llm_seconds - prefill_s_per_1k * s.new_tokens / 1000.0 for s in b32]
        c32 = quantile_regression([[1.0, float(s.output_tokens)] for s in b32], y)
        overhead["bs32"] = c32[0]
        decode["bs32"] = 1000.0 * c32[1]
    rows = {g: sum(1 for s in steps if s.batch == g) for g in ("bs1", "bs4", "bs32")}
    ctx = {g: _median([s.context for s in steps if s.batch == g]) for g in rows if rows[g]}
    # Others' prefills interleaved with each decode step at 32 agents: their prefill work
    # per generated token, times 32 agents sharing the steps.
    interference = 0.0
    if b32:
        new = sum(s.new_tokens for s in b32)
        out = sum(s.output_tokens for s in b32)
        interference = 32.0 * prefill_s_per_1k * new / out  # ms per step
    return TraceFit(
        prefill_us_per_token=prefill_s_per_1k * 1000.0,
        overhead_s=overhead,
        decode_ms_per_token=decode,
        median_context=ctx,
        rows=rows,
        bs32_interference_ms=interference,
    )


