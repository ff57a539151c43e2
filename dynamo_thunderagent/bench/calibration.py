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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dynamo_thunderagent.bench.workload import DEFAULT_TRACE

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
    from dynamo_thunderagent.bench.trace_fit import fit_trace  # it imports GpuTiming from here

    fit = fit_trace(Path(ns.trace))
    print(json.dumps({"fit": asdict(fit), "timing": asdict(fit.timing())}, indent=2))
    return 0


def _cmd_verify(ns: argparse.Namespace) -> int:
    from dynamo_thunderagent.bench.calibration_verify import cmd_verify

    return cmd_verify(ns)


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
    v.set_defaults(func=_cmd_verify)  # measures a live stack: calibration_verify

    ns = parser.parse_args(list(argv) if argv is not None else None)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
