"""Timing regimes for the Dynamo 1.6.1 mocker: GPU-calibrated and cheap-recompute.

Why this exists
---------------
With its built-in timing model the mocker prefills a few thousand tokens in tens of
milliseconds, so an agent whose KV cache was evicted during a tool call pays almost nothing to
rebuild it: thrash lowers the prefix-cache hit rate but not throughput. On a real deployment an
agent context of 20-60k tokens takes seconds to prefill, a large multiple of a decode step, and
thrash halves throughput. The benchmark therefore runs two regimes:

* ``calibrated``: the mocker reads prefill and decode tables (``--planner-profile-data``)
  generated here from a model fitted to the shipped SWE-agent trace (GLM-4.5-FP8 on vLLM), so a
  full re-prefill costs what it costs on that deployment, relative to decode;
* ``cheap-recompute``: the mocker's default timing model, unchanged.

How the mocker uses the tables (dynamo 1.6.1, vLLM-style scheduler)
--------------------------------------------------------------------
Each engine pass schedules up to ``--max-num-batched-tokens`` tokens: one token per running
decode plus prompt chunks. The pass lasts ``prefill + decode`` where

* ``prefill = interp1(prefill_isl -> prefill_ttft_ms, new prompt tokens in the pass)``
  (linear, extrapolated; ``new = batch * (mean isl - mean cached prefix)``, 0 if none),
  divided by ``--speedup-ratio``;
* ``decode = max(1, interp2(decode_active_kv_tokens x decode_context_length -> decode_itl,
  active KV tokens, mean context of the decoding requests))`` (bilinear, extrapolated),
  divided by ``--speedup-ratio * --decode-speedup-ratio``.

So the prefill cost depends only on how many uncached tokens a pass computes, and the decode
cost on the batch's KV footprint and mean context (their ratio is the batch size).

Scaling
-------
The harness shrinks token counts by ``token_scale`` to fit the mocker's KV capacity and runs
the clock at ``time_scale`` (mocker wall seconds per real second; tool sleeps use the same
factor). One mocker token stands for ``1 / token_scale`` real tokens, in the prompt and in the
output, so

* a pass that prefills ``x`` mocker tokens costs the real prefill of ``x / token_scale`` tokens;
* a mocker decode step stands for ``1 / output_token_scale`` real decode steps at the same
  batch size (the batch size ``active_kv / context`` is scale-free);
* ``--max-num-batched-tokens`` shrinks with ``token_scale`` so a long re-prefill is split into
  as many chunks (and interleaved with as many decode passes) as on the real engine;
* every table value is multiplied by ``time_scale * speedup_ratio``, so that after the
  mocker's own division by ``--speedup-ratio`` a pass lasts ``real time * time_scale``.

Nothing here needs numpy: the NPZ file is written with the standard library, byte-for-byte
deterministic. The mocker's *Python* loader for ``--planner-profile-data`` imports numpy, so
where the interpreter running the mocker has no numpy, :func:`calibrated_mocker_args` hands the
same tables over with ``--extra-engine-args`` (a complete engine config) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import math
import struct
import sys
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

# Where the shared trace lives in this project's checkout layout.
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / ("swe-agent-lite-glm45.jsonl")
)

# Profiles shipped with the package (regenerate with ``write_reference_profiles``). Tables in
# real milliseconds (time_scale * speedup_ratio = 1): run the mocker with --speedup-ratio S and
# the clock runs at time_scale = 1 / S.
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
REFERENCE_PROFILES: dict[str, dict[str, float]] = {
    "glm45-fp8-vllm-tok0.1": {"token_scale": 0.1, "time_scale": 1.0, "speedup_ratio": 1.0},
}

PROFILE_NPZ = "perf_data.npz"
PROFILE_JSON = "calibration.json"
ENGINE_JSON = "engine_args.json"
PROFILE_FORMAT_VERSION = 1

# Keys the mocker (dynamo_mocker::common::perf_model::PerfModel::from_npz) reads.
NPZ_KEYS = (
    "prefill_isl",
    "prefill_ttft_ms",
    "decode_active_kv_tokens",
    "decode_context_length",
    "decode_itl",
)

# The mocker clamps a decode pass to at least this many table milliseconds.
MOCKER_DECODE_FLOOR_MS = 1.0
# Median generated tokens per step in the trace.
TRACE_MEDIAN_OUTPUT_TOKENS = 77
# vLLM's usual chunked-prefill budget on the traced deployment, in real tokens.
REAL_MAX_NUM_BATCHED_TOKENS = 8192


# --------------------------------------------------------------------------------------------
# The GPU timing model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTiming:
    """Costs of one engine pass on the reference deployment, in real tokens and milliseconds.

    Prefill: ``prefill_pass_ms + prefill_us_per_token * tokens / 1000`` for a pass that
    computes ``tokens`` uncached prompt tokens (0 for none). The per-token cost is the
    marginal cost measured at the trace's contexts (median 20k tokens), so it includes
    attention to a long prefix. The mocker cannot make a token's cost depend on its position
    in the context, so one constant stands for all: a full re-prefill of a 20k context costs
    a little less per token on a GPU, one of 60k a little more.

    Decode step: ``decode_base_ms + decode_ms_per_expert * E(batch) + decode_ms_per_1k_kv *
    kv / 1000``, where ``E(batch) = n_experts * (1 - (1 - active_experts / n_experts) **
    batch)`` is the expected number of distinct MoE experts a batch touches (GLM-4.5: 160
    routed experts, 8 per token). Expert weight reads are what make a decode step slower as
    the batch grows, saturating once every expert is read. The trace does not resolve a
    KV-size term (its slope is within noise), so it defaults to 0.

    ``request_overhead_s`` is the per-call time in the trace that no token count explains
    (the intercept of the fit: API, tokenisation, scheduling). It is not GPU time and does not
    block other requests, so it is not in the engine tables; a harness may add it client-side.
    """

    prefill_us_per_token: float = 45.6
    prefill_pass_ms: float = 0.0
    decode_base_ms: float = 14.7
    decode_ms_per_expert: float = 0.505
    decode_ms_per_1k_kv: float = 0.0
    n_experts: int = 160
    active_experts: int = 8
    request_overhead_s: float = 0.72
    source: str = "fit of swe-agent-lite-glm45.jsonl (bs1+bs4 rows), see docs/calibration.md"

    def validate(self) -> None:
        if self.prefill_us_per_token <= 0 or self.prefill_pass_ms < 0:
            raise ValueError("prefill costs must be > 0 per token and >= 0 per pass")
        if (
            self.decode_base_ms <= 0
            or self.decode_ms_per_expert < 0
            or self.decode_ms_per_1k_kv < 0
        ):
            raise ValueError("decode costs must be > 0 (base) and >= 0 (per expert, per KV)")
        if not 0 < self.active_experts <= self.n_experts:
            raise ValueError("need 0 < active_experts <= n_experts")

    def experts_touched(self, batch: float) -> float:
        """Expected distinct experts a decode batch of ``batch`` sequences reads per layer."""
        batch = max(1.0, batch)
        miss = 1.0 - self.active_experts / self.n_experts
        return float(self.n_experts * (1.0 - math.pow(miss, batch)))

    def prefill_ms(self, tokens: float) -> float:
        """Real milliseconds of one pass that prefills ``tokens`` uncached tokens."""
        if tokens <= 0:
            return 0.0
        return self.prefill_pass_ms + self.prefill_us_per_token * tokens / 1000.0

    def decode_step_ms(self, batch: float, kv_tokens: float = 0.0) -> float:
        """Real milliseconds of one decode step of ``batch`` sequences holding ``kv_tokens``."""
        return (
            self.decode_base_ms
            + self.decode_ms_per_expert * self.experts_touched(batch)
            + self.decode_ms_per_1k_kv * max(0.0, kv_tokens) / 1000.0
        )

    def full_prefill_s(
        self, context_tokens: int, chunk_tokens: int = REAL_MAX_NUM_BATCHED_TOKENS
    ) -> float:
        """Real seconds to (re)prefill ``context_tokens`` in chunks of ``chunk_tokens``."""
        if context_tokens <= 0:
            return 0.0
        chunks = math.ceil(context_tokens / chunk_tokens)
        return (
            chunks * self.prefill_pass_ms + self.prefill_us_per_token * context_tokens / 1000.0
        ) / 1000.0


DEFAULT_TIMING = GpuTiming()


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


# --------------------------------------------------------------------------------------------
# Profile tables and the NPZ file
# --------------------------------------------------------------------------------------------


def _pow2_axis(start: float, stop: float, *, zero: bool) -> list[float]:
    values = [0.0] if zero else []
    v = start
    while v < stop:
        values.append(float(v))
        v *= 2
    values.append(float(stop))
    return values


@dataclass(frozen=True)
class ProfileTables:
    """The five arrays of a mocker NPZ profile (times in mocker-table milliseconds)."""

    prefill_isl: list[float]
    prefill_ttft_ms: list[float]
    decode_active_kv_tokens: list[float]
    decode_context_length: list[float]
    decode_itl: list[list[float]]

    def arrays(self) -> dict[str, list[float] | list[list[float]]]:
        return {key: getattr(self, key) for key in NPZ_KEYS}


@dataclass(frozen=True)
class ScaledTiming:
    """A :class:`GpuTiming` as the mocker sees it after token and clock scaling."""

    timing: GpuTiming = DEFAULT_TIMING
    token_scale: float = 1.0
    time_scale: float = 1.0
    speedup_ratio: float = 1.0
    output_token_scale: float | None = None  # None: same as token_scale

    def validate(self) -> None:
        self.timing.validate()
        for name in ("token_scale", "time_scale", "speedup_ratio"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.out_scale <= 0 or not math.isfinite(self.out_scale):
            raise ValueError("output_token_scale must be a finite number > 0")
        if self.decode_table_ms(1.0) < MOCKER_DECODE_FLOOR_MS:
            raise ValueError(
                "decode steps would fall under the mocker's 1 ms floor: raise time_scale * "
                "speedup_ratio or lower token_scale"
            )

    @property
    def out_scale(self) -> float:
        return self.token_scale if self.output_token_scale is None else self.output_token_scale

    @property
    def table_factor(self) -> float:
        """Table milliseconds per real millisecond (the mocker divides by speedup_ratio)."""
        return self.time_scale * self.speedup_ratio

    def prefill_table_ms(self, mocker_tokens: float) -> float:
        return self.timing.prefill_ms(mocker_tokens / self.token_scale) * self.table_factor

    def decode_table_ms(self, batch: float, mocker_kv_tokens: float = 0.0) -> float:
        real = self.timing.decode_step_ms(batch, mocker_kv_tokens / self.token_scale)
        return real / self.out_scale * self.table_factor

    # Wall-clock predictions for one mocker (seconds), for checks and the simulator.
    def prefill_wall_s(self, mocker_tokens: int, chunk: int | None = None) -> float:
        chunk = chunk or self.max_num_batched_tokens()
        full, rest = divmod(max(0, mocker_tokens), chunk)
        ms = full * self.prefill_table_ms(chunk) + self.prefill_table_ms(rest)
        return ms / self.speedup_ratio / 1000.0

    def decode_wall_s(self, batch: float = 1.0, mocker_kv_tokens: float = 0.0) -> float:
        return max(MOCKER_DECODE_FLOOR_MS, self.decode_table_ms(batch, mocker_kv_tokens)) / (
            self.speedup_ratio * 1000.0
        )

    def max_num_batched_tokens(self, block_size: int = 16) -> int:
        """The real chunked-prefill budget in mocker tokens (at least one block)."""
        return max(block_size, round(REAL_MAX_NUM_BATCHED_TOKENS * self.token_scale))

    def tables(
        self, *, max_prefill_tokens: int = 1 << 20, max_kv_tokens: int = 1 << 22
    ) -> ProfileTables:
        """Tables covering passes up to ``max_prefill_tokens`` / ``max_kv_tokens`` mocker tokens.

        Axes are powers of two (plus 0 and the end point); interpolation is linear in each,
        and the mocker extrapolates linearly past the ends.
        """
        isl = _pow2_axis(1.0, float(max_prefill_tokens), zero=True)
        kv = _pow2_axis(16.0, float(max_kv_tokens), zero=True)
        ctx = _pow2_axis(1.0, float(max_kv_tokens), zero=False)
        itl = [[_round(self.decode_table_ms(max(1.0, k / c), k)) for c in ctx] for k in kv]
        return ProfileTables(
            prefill_isl=isl,
            prefill_ttft_ms=[_round(self.prefill_table_ms(x)) for x in isl],
            decode_active_kv_tokens=kv,
            decode_context_length=ctx,
            decode_itl=itl,
        )


def _round(value: float) -> float:
    # 12 significant digits: identical bytes on every platform for the same inputs.
    return float(f"{value:.12g}")


def _npy_bytes(values: list[float] | list[list[float]]) -> bytes:
    """A ``.npy`` (format 1.0) image of a 1-D or 2-D little-endian float64 C-order array."""
    if values and isinstance(values[0], list):
        rows = [list(map(float, r)) for r in values]
        shape = f"({len(rows)}, {len(rows[0]) if rows else 0})"
        if any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("ragged 2-D array")
        flat = [v for r in rows for v in r]
    else:
        flat = [float(v) for v in values]  # type: ignore[arg-type]
        shape = f"({len(flat)},)"
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}"
    # magic(6) + version(2) + header length(2) + header, padded with spaces so that the data
    # starts on a 64-byte boundary, newline-terminated.
    pad = (-(10 + len(header) + 1)) % 64
    header_bytes = (header + " " * pad + "\n").encode("latin1")
    return (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", len(header_bytes))
        + header_bytes
        + struct.pack(f"<{len(flat)}d", *flat)
    )


def write_npz(path: Path, arrays: dict[str, list[float] | list[list[float]]]) -> None:
    """Write ``arrays`` as an uncompressed NPZ, byte-for-byte deterministic."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.create_system = 3
            zf.writestr(info, _npy_bytes(arrays[name]))
    path.write_bytes(buf.getvalue())


def read_npz(path: Path) -> dict[str, tuple[tuple[int, ...], list[float]]]:
    """Read back an NPZ written by :func:`write_npz` (shape, flat values) per key."""
    out: dict[str, tuple[tuple[int, ...], list[float]]] = {}
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            raw = zf.read(name)
            if raw[:8] != b"\x93NUMPY\x01\x00":
                raise ValueError(f"{name}: not a format-1.0 .npy")
            (hlen,) = struct.unpack("<H", raw[8:10])
            header = raw[10 : 10 + hlen].decode("latin1")
            if "'<f8'" not in header or "'fortran_order': False" not in header:
                raise ValueError(f"{name}: expected little-endian float64 in C order")
            shape_text = header.split("'shape': (", 1)[1].split(")", 1)[0]
            shape = tuple(int(p) for p in shape_text.split(",") if p.strip())
            count = math.prod(shape)
            body = raw[10 + hlen :]
            if len(body) != 8 * count or (10 + hlen) % 64:
                raise ValueError(f"{name}: bad data length or alignment")
            out[name.removesuffix(".npy")] = (shape, list(struct.unpack(f"<{count}d", body)))
    return out


# --------------------------------------------------------------------------------------------
# Writing a profile directory and the mocker arguments
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileFiles:
    npz: Path
    description: Path
    sha256: str
    max_num_batched_tokens: int


def write_profile(
    out_dir: Path | str,
    token_scale: float,
    time_scale: float,
    *,
    speedup_ratio: float = 1.0,
    timing: GpuTiming = DEFAULT_TIMING,
    output_token_scale: float | None = None,
    block_size: int = 16,
) -> ProfileFiles:
    """Write ``perf_data.npz`` (mocker tables) and ``calibration.json`` into ``out_dir``.

    The same inputs always give the same bytes.
    """
    scaled = ScaledTiming(timing, token_scale, time_scale, speedup_ratio, output_token_scale)
    scaled.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = scaled.tables()
    npz = out / PROFILE_NPZ
    write_npz(npz, tables.arrays())
    digest = hashlib.sha256(npz.read_bytes()).hexdigest()
    chunk = scaled.max_num_batched_tokens(block_size)
    description = {
        "format_version": PROFILE_FORMAT_VERSION,
        "regime": "calibrated",
        "timing": asdict(timing),
        "token_scale": token_scale,
        "output_token_scale": scaled.out_scale,
        "time_scale": time_scale,
        "speedup_ratio": speedup_ratio,
        "table_ms_per_real_ms": scaled.table_factor,
        "max_num_batched_tokens": chunk,
        "npz": PROFILE_NPZ,
        "npz_sha256": digest,
        "examples_wall_s": {
            "prefill_1k_mocker_tokens": scaled.prefill_wall_s(1000, chunk),
            "decode_step_batch_1": scaled.decode_wall_s(1.0),
            "decode_step_batch_8": scaled.decode_wall_s(8.0),
        },
    }
    desc = out / PROFILE_JSON
    desc.write_text(json.dumps(description, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ProfileFiles(npz=npz, description=desc, sha256=digest, max_num_batched_tokens=chunk)


def write_reference_profiles(root: Path | str = PROFILES_DIR) -> list[ProfileFiles]:
    """(Re)write the shipped profiles under ``root``."""
    return [
        write_profile(
            Path(root) / name,
            p["token_scale"],
            p["time_scale"],
            speedup_ratio=p["speedup_ratio"],
        )
        for name, p in REFERENCE_PROFILES.items()
    ]


def mocker_has_numpy(python: str | None = None) -> bool:
    """Whether the mocker's ``--planner-profile-data`` loader can run (it imports numpy).

    Checks the current interpreter, or ``python`` (a path) when given.
    """
    if python is None or Path(python).resolve() == Path(sys.executable).resolve():
        return importlib.util.find_spec("numpy") is not None
    import subprocess

    probe = subprocess.run(
        [python, "-c", "import numpy"], capture_output=True, timeout=60, check=False
    )
    return probe.returncode == 0


@dataclass(frozen=True)
class StackGeometry:
    """What ``LocalStack`` passes the mocker itself; needed only for the engine-JSON route."""

    num_gpu_blocks: int
    block_size: int
    speedup_ratio: float
    max_num_seqs: int | None = None


Transport = Literal["auto", "profile", "engine-json"]


def engine_config(
    npz: Path, geometry: StackGeometry, max_num_batched_tokens: int
) -> dict[str, Any]:
    """A complete mocker engine config that uses ``npz`` for timing.

    Built like the mocker builds it from its own flags (``--num-gpu-blocks-override``,
    ``--block-size``, ``--speedup-ratio``, ``--max-num-batched-tokens``,
    ``--planner-profile-data``), because ``--extra-engine-args`` replaces those flags.
    """
    engine: dict[str, Any] = {
        "num_gpu_blocks": geometry.num_gpu_blocks,
        "block_size": geometry.block_size,
        "speedup_ratio": geometry.speedup_ratio,
        "max_num_batched_tokens": max_num_batched_tokens,
        "backend": "vllm",
        "worker_type": "aggregated",
        "timing_model": {
            "type": "external",
            "provider": "dynamo_profile",
            "config": {"path": str(npz)},
        },
    }
    if geometry.max_num_seqs is not None:
        engine["max_num_seqs"] = geometry.max_num_seqs
    return {"engine": engine, "dynamo": {"enable_local_indexer": True}}


def calibrated_mocker_args(
    out_dir: Path | str,
    token_scale: float,
    time_scale: float,
    *,
    speedup_ratio: float = 1.0,
    timing: GpuTiming = DEFAULT_TIMING,
    output_token_scale: float | None = None,
    geometry: StackGeometry | None = None,
    transport: Transport = "auto",
    python: str | None = None,
) -> list[str]:
    """Write the calibrated profile into ``out_dir`` and return the extra mocker flags.

    ``speedup_ratio`` must be the ``--speedup-ratio`` the stack starts the mocker with (the
    tables absorb it, so mocker wall time = real GPU time x ``time_scale`` either way).

    Transport: ``profile`` gives ``--planner-profile-data perf_data.npz
    --max-num-batched-tokens N`` (the mocker's Python side needs numpy for that flag);
    ``engine-json`` gives ``--extra-engine-args engine_args.json`` holding the whole engine
    config, which replaces the stack's own mocker flags, so ``geometry`` must repeat them;
    ``auto`` picks ``profile`` when the mocker's interpreter has numpy, else ``engine-json``.
    """
    block = geometry.block_size if geometry else 16
    if geometry is not None and geometry.speedup_ratio != speedup_ratio:
        raise ValueError("geometry.speedup_ratio and speedup_ratio disagree")
    files = write_profile(
        out_dir,
        token_scale,
        time_scale,
        speedup_ratio=speedup_ratio,
        timing=timing,
        output_token_scale=output_token_scale,
        block_size=block,
    )
    route = transport
    if route == "auto":
        route = "profile" if mocker_has_numpy(python) else "engine-json"
    if route == "profile":
        return [
            "--planner-profile-data", str(files.npz.resolve()),
            "--max-num-batched-tokens", str(files.max_num_batched_tokens),
        ]  # fmt: skip
    if route != "engine-json":
        raise ValueError(f"unknown transport {transport!r}")
    if geometry is None:
        raise ValueError(
            "the mocker's interpreter has no numpy, so the profile goes through "
            "--extra-engine-args, which replaces the stack's mocker flags: pass geometry="
            "StackGeometry(num_gpu_blocks, block_size, speedup_ratio) (or install numpy)"
        )
    config = engine_config(files.npz.resolve(), geometry, files.max_num_batched_tokens)
    path = Path(out_dir) / ENGINE_JSON
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ["--extra-engine-args", str(path.resolve())]


# --------------------------------------------------------------------------------------------
# Regimes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """A named mocker timing setting the benchmark runs every arm under."""

    name: str
    summary: str
    calibrated: bool
    # (out_dir, token_scale, time_scale, speedup_ratio, geometry) -> extra mocker flags
    build: Callable[[Path, float, float, float, StackGeometry | None], list[str]] = field(
        repr=False, compare=False
    )

    def mocker_args(
        self,
        out_dir: Path | str,
        token_scale: float,
        time_scale: float,
        *,
        speedup_ratio: float = 1.0,
        geometry: StackGeometry | None = None,
    ) -> list[str]:
        return self.build(Path(out_dir), token_scale, time_scale, speedup_ratio, geometry)


def _calibrated(
    out_dir: Path, token_scale: float, time_scale: float, speedup: float, geo: StackGeometry | None
) -> list[str]:
    return calibrated_mocker_args(
        out_dir, token_scale, time_scale, speedup_ratio=speedup, geometry=geo
    )


def _cheap(
    out_dir: Path, token_scale: float, time_scale: float, speedup: float, geo: StackGeometry | None
) -> list[str]:
    return []


REGIMES: dict[str, Regime] = {
    "calibrated": Regime(
        name="calibrated",
        summary=(
            "prefill and decode tables fitted to GLM-4.5-FP8 on vLLM (SWE-agent trace): "
            f"{DEFAULT_TIMING.prefill_us_per_token:g} us per uncached prompt token, decode step "
            f"{DEFAULT_TIMING.decode_step_ms(1):.1f} ms at batch 1 and "
            f"{DEFAULT_TIMING.decode_step_ms(32):.1f} ms at batch 32, scaled by token_scale "
            "and time_scale; a 40k-token re-prefill costs about 100 decode steps"
        ),
        calibrated=True,
        build=_calibrated,
    ),
    "cheap-recompute": Regime(
        name="cheap-recompute",
        summary=(
            "the mocker's built-in timing model, unchanged: re-prefilling a few thousand "
            "tokens costs about as much as one loaded decode step, so thrash costs hit rate "
            "but hardly throughput"
        ),
        calibrated=False,
        build=_cheap,
    ),
}


# --------------------------------------------------------------------------------------------
# Command line: write a profile, show the fit, or measure both regimes on a live mocker
# --------------------------------------------------------------------------------------------


def _cmd_write(ns: argparse.Namespace) -> int:
    geometry = None
    if ns.num_gpu_blocks is not None:
        geometry = StackGeometry(ns.num_gpu_blocks, ns.block_size, ns.speedup_ratio)
    args = calibrated_mocker_args(
        ns.out_dir,
        ns.token_scale,
        ns.time_scale,
        speedup_ratio=ns.speedup_ratio,
        geometry=geometry,
        transport=ns.transport,
    )
    print(" ".join(args))
    return 0


def _cmd_fit(ns: argparse.Namespace) -> int:
    fit = fit_trace(Path(ns.trace))
    print(json.dumps({"fit": asdict(fit), "timing": asdict(fit.timing())}, indent=2))
    return 0


def _text_of_tokens(tag: str, words: int) -> str:
    # Distinct, hash-like words so that two prompts share no prefix beyond what we intend.
    return " ".join(hashlib.sha256(f"{tag}:{i}".encode()).hexdigest()[:6] for i in range(words))


def _chat(url: str, model: str, text: str, max_tokens: int) -> tuple[float, dict[str, Any]]:
    import time
    import urllib.error
    import urllib.request

    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": False,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"chat request failed: {exc.code} {exc.read()[:500]!r}") from exc
    return time.perf_counter() - t0, payload


def _measure(url: str, model: str, words: int, decode_tokens: int, repeats: int) -> dict[str, Any]:
    """Cold prefill, cached re-send and decode cost on an idle worker (medians of repeats)."""
    cold, warm, decode, prompt_tokens, cached = [], [], [], [], []
    for r in range(repeats):
        text = _text_of_tokens(f"calib-{r}", words)
        t_cold, p_cold = _chat(url, model, text, 1)
        t_warm, p_warm = _chat(url, model, text, 1)
        t_dec, _ = _chat(url, model, text, 1 + decode_tokens)
        cold.append(t_cold)
        warm.append(t_warm)
        decode.append((t_dec - t_warm) / decode_tokens)
        prompt_tokens.append(p_cold["usage"]["prompt_tokens"])
        details = p_warm["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens") or 0)
    return {
        "prompt_tokens": _median(prompt_tokens),
        "cached_tokens_on_resend": _median(cached),
        "uncached_request_s": _median(cold),
        "cached_request_s": _median(warm),
        "decode_s_per_token": _median(decode),
        "full_reprefill_s": _median(cold) - _median(warm),
    }


def _measure_batch_decode(
    url: str, model: str, batch: int, decode_tokens: int, words: int
) -> float:
    """Seconds per decode step with ``batch`` concurrent decoders (prompts cached first)."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [_text_of_tokens(f"batch-{batch}-{i}", words) for i in range(batch)]
    for t in texts:
        _chat(url, model, t, 1)
    with ThreadPoolExecutor(batch) as pool:
        base = list(pool.map(lambda t: _chat(url, model, t, 1)[0], texts))
        full = list(pool.map(lambda t: _chat(url, model, t, 1 + decode_tokens)[0], texts))
    return (_median(full) - _median(base)) / decode_tokens


def _ratios(m: dict[str, Any], turn_out: int) -> dict[str, Any]:
    """Re-prefill cost relative to decode: per decode step, and per agent's share of a turn.

    An agent's share of the GPU for the decode of one turn at batch ``b`` is ``turn_out *
    step(b) / b``; a re-prefill is not shared, so ``reprefill / share`` is how many turns'
    worth of GPU a thrashed agent burns.
    """
    steps = m["decode_step_s_batch"]
    return {
        "reprefill_over_decode_step": {
            b: m["full_reprefill_s"] / step for b, step in steps.items()
        },
        "reprefill_over_turn_decode_share": {
            b: m["full_reprefill_s"] / (turn_out * step / int(b)) for b, step in steps.items()
        },
    }


def _cmd_verify(ns: argparse.Namespace) -> int:
    from dynamo_thunderagent.stack.launcher import LocalStack

    results: dict[str, Any] = {
        "token_scale": ns.token_scale,
        "time_scale": ns.time_scale,
        "speedup_ratio": ns.speedup_ratio,
        "num_gpu_blocks": ns.num_gpu_blocks,
        "block_size": ns.block_size,
        "prompt_words": ns.words,
        "decode_tokens": ns.decode_tokens,
        "regimes": {},
    }
    scaled = ScaledTiming(DEFAULT_TIMING, ns.token_scale, ns.time_scale, ns.speedup_ratio)
    # Output tokens of a median trace turn, at the harness's token scale.
    turn_out = ns.turn_output_tokens or max(
        1, math.floor(TRACE_MEDIAN_OUTPUT_TOKENS * ns.token_scale + 0.5)
    )
    results["turn_output_tokens"] = turn_out
    work = Path(ns.work_dir)
    for name in ns.regimes:
        regime = REGIMES[name]
        geometry = StackGeometry(ns.num_gpu_blocks, ns.block_size, ns.speedup_ratio)
        extra = regime.mocker_args(
            work / name, ns.token_scale, ns.time_scale,
            speedup_ratio=ns.speedup_ratio, geometry=geometry,
        )  # fmt: skip
        with LocalStack(
            arm="stock",
            num_workers=1,
            num_gpu_blocks=ns.num_gpu_blocks,
            block_size=ns.block_size,
            speedup_ratio=ns.speedup_ratio,
            mocker_args=extra,
            run_dir=work / f"stack-{name}",
        ) as stack:
            model = stack.config.model_name
            _chat(stack.url, model, "warm up", 2)
            m = _measure(stack.url, model, ns.words, ns.decode_tokens, ns.repeats)
            m["decode_step_s_batch"] = {
                str(b): _measure_batch_decode(stack.url, model, b, ns.decode_tokens, ns.batch_words)
                for b in ns.batches
            }
        m["mocker_args"] = extra
        m.update(_ratios(m, turn_out))
        if regime.calibrated:
            m["predicted"] = {
                "full_reprefill_s": scaled.prefill_wall_s(int(m["prompt_tokens"])),
                "decode_s_per_token": scaled.decode_wall_s(1.0),
                "decode_step_s_batch": {str(b): scaled.decode_wall_s(b) for b in ns.batches},
            }
        results["regimes"][name] = m
        print(json.dumps({name: m}, indent=2), flush=True)
    # The deployment the calibrated tables stand for, at the same (unscaled) sizes.
    ctx_real = round(
        _median([float(r["prompt_tokens"]) for r in results["regimes"].values()] or [0.0])
        / ns.token_scale
    )
    gpu = {
        "context_tokens": ctx_real,
        "full_reprefill_s": DEFAULT_TIMING.full_prefill_s(ctx_real),
        "decode_s_per_token": DEFAULT_TIMING.decode_step_ms(1) / 1000.0,
        "decode_step_s_batch": {
            str(b): DEFAULT_TIMING.decode_step_ms(b) / 1000.0 for b in ns.batches
        },
    }
    gpu.update(_ratios(gpu, TRACE_MEDIAN_OUTPUT_TOKENS))
    results["reference_gpu"] = gpu
    print(json.dumps({"reference_gpu": gpu}, indent=2), flush=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_thunderagent.bench.calibration", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    w = sub.add_parser("write", help="write a calibrated profile and print the mocker flags")
    w.add_argument("out_dir")
    w.add_argument("--token-scale", type=float, default=0.1)
    w.add_argument("--time-scale", type=float, default=1.0)
    w.add_argument("--speedup-ratio", type=float, default=1.0)
    w.add_argument("--num-gpu-blocks", type=int, default=None)
    w.add_argument("--block-size", type=int, default=16)
    w.add_argument("--transport", choices=["auto", "profile", "engine-json"], default="auto")
    w.set_defaults(func=_cmd_write)

    f = sub.add_parser("fit", help="fit the timing model to the trace and print it")
    f.add_argument("--trace", default=str(DEFAULT_TRACE))
    f.set_defaults(func=_cmd_fit)

    v = sub.add_parser("verify", help="measure prefill/decode on a live mocker in each regime")
    v.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=sorted(REGIMES))
    v.add_argument("--token-scale", type=float, default=0.1)
    v.add_argument("--time-scale", type=float, default=0.1)
    v.add_argument("--speedup-ratio", type=float, default=1.0)
    v.add_argument("--num-gpu-blocks", type=int, default=1408)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--words", type=int, default=1200, help="prompt size (about 3 tokens a word)")
    v.add_argument("--decode-tokens", type=int, default=16)
    v.add_argument("--batches", type=int, nargs="*", default=[1, 4])
    v.add_argument("--batch-words", type=int, default=400, help="prompt size of each decoder")
    v.add_argument("--repeats", type=int, default=3)
    v.add_argument(
        "--turn-output-tokens",
        type=int,
        default=None,
        help="output tokens of one agent turn (default: the trace median x token scale)",
    )
    v.add_argument("--work-dir", default="/tmp/dta-calibration")
    v.add_argument("--json", default=None, help="also write the results here")
    v.set_defaults(func=_cmd_verify)

    ns = parser.parse_args(list(argv) if argv is not None else None)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
