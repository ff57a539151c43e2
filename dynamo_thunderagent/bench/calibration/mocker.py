"""The GPU timing model as the Dynamo 1.6.1 mocker sees it: tables, profile, flags.

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

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from dynamo_thunderagent.bench.calibration.npz import write_npz
from dynamo_thunderagent.bench.calibration.timing import (
    DEFAULT_TIMING,
    REAL_MAX_NUM_BATCHED_TOKENS,
    GpuTiming,
)

# Profiles shipped with the package (regenerate with ``write_reference_profiles``). Tables in
# real milliseconds (time_scale * speedup_ratio = 1): run the mocker with --speedup-ratio S and
# the clock runs at time_scale = 1 / S.
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
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


# --------------------------------------------------------------------------------------------
# Profile tables
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
