"""Calibrated mocker profiles: deterministic, well-formed, and scaled as documented.

No mocker process is started. Where Dynamo's native core is importable, its config normaliser
loads the NPZ with the same Rust reader the mocker uses.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.calibration import fit as trace_fit
from dynamo_thunderagent.bench.calibration import mocker as cal
from dynamo_thunderagent.bench.calibration import npz
from dynamo_thunderagent.bench.calibration.mocker import (
    NPZ_KEYS,
    REFERENCE_PROFILES,
    ScaledTiming,
    StackGeometry,
)
from dynamo_thunderagent.bench.calibration.timing import DEFAULT_TIMING, GpuTiming
from dynamo_thunderagent.bench.regimes import REGIMES
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE


def _strictly_increasing(values: list[float]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def test_profile_bytes_are_deterministic(tmp_path: Path) -> None:
    a = cal.write_profile(tmp_path / "a", 0.1, 0.25, speedup_ratio=4.0)
    b = cal.write_profile(tmp_path / "b", 0.1, 0.25, speedup_ratio=4.0)
    assert a.npz.read_bytes() == b.npz.read_bytes()
    assert a.description.read_text() == b.description.read_text()
    assert a.sha256 == b.sha256
    assert json.loads(a.description.read_text())["npz_sha256"] == a.sha256
    # Any parameter change changes the tables.
    c = cal.write_profile(tmp_path / "c", 0.2, 0.25, speedup_ratio=4.0)
    assert c.sha256 != a.sha256


def test_profile_is_well_formed(tmp_path: Path) -> None:
    files = cal.write_profile(tmp_path, 0.1, 1.0)
    data = npz.read_npz(files.npz)
    assert set(data) == set(NPZ_KEYS)
    (n_isl,), isl = data["prefill_isl"]
    (n_ttft,), ttft = data["prefill_ttft_ms"]
    (n_kv,), kv = data["decode_active_kv_tokens"]
    (n_ctx,), ctx = data["decode_context_length"]
    shape, itl = data["decode_itl"]
    assert n_isl == n_ttft >= 2 and shape == (n_kv, n_ctx) and n_kv >= 2 and n_ctx >= 2
    for axis in (isl, kv, ctx):
        assert _strictly_increasing(axis)
    assert isl[0] == 0.0 and ttft[0] == 0.0 and kv[0] == 0.0 and ctx[0] >= 1.0
    assert all(math.isfinite(v) and v >= 0 for v in ttft + itl)
    assert _strictly_increasing(ttft)
    assert min(itl) >= cal.MOCKER_DECODE_FLOOR_MS
    # Decode never gets cheaper as the batch (kv / ctx) grows at a fixed context.
    for j in range(n_ctx):
        column = [itl[i * n_ctx + j] for i in range(n_kv)]
        assert all(x <= y + 1e-9 for x, y in itertools.pairwise(column))
    # The tables cover far more than a mocker's KV capacity and prefill budget.
    assert isl[-1] >= 1 << 20 and kv[-1] >= 1 << 22


def test_npy_header_layout(tmp_path: Path) -> None:
    raw = npz._npy_bytes([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert raw[:8] == b"\x93NUMPY\x01\x00"
    header_len = int.from_bytes(raw[8:10], "little")
    assert (10 + header_len) % 64 == 0
    header = raw[10 : 10 + header_len].decode("latin1")
    assert header.endswith("\n") and "'shape': (2, 3)" in header
    assert len(raw) == 10 + header_len + 6 * 8
    with pytest.raises(ValueError):
        npz._npy_bytes([[1.0, 2.0], [3.0]])


def test_numpy_reads_the_npz_when_available(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    files = cal.write_profile(tmp_path, 0.1, 1.0)
    ours = npz.read_npz(files.npz)
    with np.load(files.npz) as data:
        assert set(data.files) == set(NPZ_KEYS)
        for key in NPZ_KEYS:
            assert data[key].dtype == np.float64
            assert tuple(data[key].shape) == ours[key][0]
            assert data[key].ravel().tolist() == ours[key][1]


def test_dynamo_loads_the_npz(tmp_path: Path) -> None:
    core = pytest.importorskip("dynamo._core")
    files = cal.write_profile(tmp_path, 0.1, 1.0)
    config = cal.engine_config(files.npz, StackGeometry(1408, 16, 10.0), 819)
    normalized = core._normalize_mocker_config(config)  # loads the NPZ in Rust
    engine = normalized["engine"]
    assert engine["timing_model"]["provider"] == "dynamo_profile"
    assert engine["num_gpu_blocks"] == 1408 and engine["block_size"] == 16
    assert engine["speedup_ratio"] == 10.0 and engine["max_num_batched_tokens"] == 819
    assert normalized["dynamo"]["enable_local_indexer"] is True


def test_reference_profiles_match_regeneration(tmp_path: Path) -> None:
    for name, params in REFERENCE_PROFILES.items():
        shipped = cal.PROFILES_DIR / name
        fresh = cal.write_profile(tmp_path / name, **params)
        assert (shipped / cal.PROFILE_NPZ).read_bytes() == fresh.npz.read_bytes(), name
        assert (shipped / cal.PROFILE_JSON).read_text() == fresh.description.read_text(), name
    size = sum(p.stat().st_size for p in cal.PROFILES_DIR.rglob("*") if p.is_file())
    assert size < 200_000


def test_scaling_preserves_real_costs() -> None:
    token_scale, time_scale, speedup = 0.1, 0.2, 5.0
    s = ScaledTiming(DEFAULT_TIMING, token_scale, time_scale, speedup)
    # A pass prefilling x mocker tokens lasts the real prefill of x / token_scale tokens,
    # times time_scale, after the mocker divides by its speedup ratio.
    real_ms = DEFAULT_TIMING.prefill_ms(4000 / token_scale)
    assert s.prefill_table_ms(4000) / speedup == pytest.approx(real_ms * time_scale)
    # A turn's decode (output tokens scaled like the prompt) lasts as long as the real one.
    for batch in (1, 4, 16):
        real_turn = 77 * DEFAULT_TIMING.decode_step_ms(batch)
        mocker_turn = 77 * token_scale * s.decode_wall_s(batch) * 1000.0
        assert mocker_turn == pytest.approx(real_turn * time_scale)
    # Chunk budget mirrors vLLM's 8192 real tokens.
    assert s.max_num_batched_tokens() == 819
    # So a full re-prefill relative to a turn's decode is the same as on the GPU.
    ctx = 40_000
    real_ratio = DEFAULT_TIMING.full_prefill_s(ctx) / (77 * DEFAULT_TIMING.decode_step_ms(8) / 1e3)
    mock_ratio = s.prefill_wall_s(round(ctx * token_scale)) / (
        77 * token_scale * s.decode_wall_s(8)
    )
    assert mock_ratio == pytest.approx(real_ratio, rel=1e-6)


def test_gpu_timing_shape() -> None:
    t = DEFAULT_TIMING
    assert t.experts_touched(1) == pytest.approx(t.active_experts)
    assert t.experts_touched(10_000) == pytest.approx(t.n_experts)
    steps = [t.decode_step_ms(b) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert _strictly_increasing(steps)
    # On the GPU a 40k-token re-prefill is worth dozens of decode steps even at batch 32.
    assert t.full_prefill_s(40_000) * 1000 / t.decode_step_ms(32) > 20
    assert t.prefill_ms(0) == 0.0
    with pytest.raises(ValueError):
        GpuTiming(active_experts=0).validate()


def test_invalid_scales_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        cal.write_profile(tmp_path, 0.0, 1.0)
    with pytest.raises(ValueError):
        cal.write_profile(tmp_path, 0.1, -1.0)
    with pytest.raises(ValueError, match="1 ms floor"):
        cal.write_profile(tmp_path, 1.0, 1e-3)


def test_mocker_args_per_transport(tmp_path: Path) -> None:
    args = cal.calibrated_mocker_args(tmp_path / "p", 0.1, 1.0, transport="profile")
    assert args[0] == "--planner-profile-data" and Path(args[1]).is_file()
    assert args[2:] == ["--max-num-batched-tokens", "819"]

    geometry = StackGeometry(num_gpu_blocks=1408, block_size=16, speedup_ratio=10.0)
    args = cal.calibrated_mocker_args(
        tmp_path / "j", 0.1, 0.1, speedup_ratio=10.0, geometry=geometry, transport="engine-json"
    )
    assert args[0] == "--extra-engine-args"
    config = json.loads(Path(args[1]).read_text())
    engine = config["engine"]
    assert engine["num_gpu_blocks"] == 1408 and engine["speedup_ratio"] == 10.0
    assert Path(engine["timing_model"]["config"]["path"]).is_file()

    with pytest.raises(ValueError, match="geometry"):
        cal.calibrated_mocker_args(tmp_path / "x", 0.1, 1.0, transport="engine-json")
    with pytest.raises(ValueError, match="disagree"):
        cal.calibrated_mocker_args(tmp_path / "y", 0.1, 1.0, speedup_ratio=2.0, geometry=geometry)


def test_auto_transport_follows_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    geometry = StackGeometry(1408, 16, 1.0)
    monkeypatch.setattr(cal, "mocker_has_numpy", lambda python=None: False)
    assert cal.calibrated_mocker_args(tmp_path, 0.1, 1.0, geometry=geometry)[0] == (
        "--extra-engine-args"
    )
    with pytest.raises(ValueError, match="numpy"):
        cal.calibrated_mocker_args(tmp_path, 0.1, 1.0)
    monkeypatch.setattr(cal, "mocker_has_numpy", lambda python=None: True)
    assert cal.calibrated_mocker_args(tmp_path, 0.1, 1.0)[0] == "--planner-profile-data"


def test_regimes(tmp_path: Path) -> None:
    assert set(REGIMES) == {"calibrated", "cheap-recompute", "tiered"}
    assert REGIMES["cheap-recompute"].mocker_args(tmp_path, 0.1, 0.1) == []
    assert not REGIMES["cheap-recompute"].calibrated
    geometry = StackGeometry(256, 16, 10.0)
    args = REGIMES["calibrated"].mocker_args(
        tmp_path, 0.1, 0.1, speedup_ratio=10.0, geometry=geometry
    )
    assert args and REGIMES["calibrated"].calibrated
    assert "--num-host-blocks" not in args


def test_the_tiered_regime_adds_a_host_tier_scaled_like_the_rest(tmp_path: Path) -> None:
    tiered = REGIMES["tiered"]
    assert tiered.calibrated and tiered.host_tier is not None
    args = tiered.mocker_args(tmp_path, 0.1, 0.25, geometry=StackGeometry(256, 16, 1.0))
    flag = dict(itertools.pairwise(args))  # each flag maps to its value
    assert flag["--num-host-blocks"] == str(round(256 * tiered.host_tier.blocks_per_gpu_block))
    # One mocker token stands for ten real ones; the clock runs at a quarter of real time.
    assert flag["--kv-bytes-per-token"] == str(tiered.host_tier.kv_bytes_per_token * 10)
    assert float(flag["--host-offload-h2d-bandwidth-gbps"]) == tiered.host_tier.bandwidth_gbps * 4
    # So a copy of n mocker tokens takes the real copy time of 10n tokens, times 0.25.
    wall = 100 * int(flag["--kv-bytes-per-token"]) / (
        float(flag["--host-offload-h2d-bandwidth-gbps"]) * 1e9)
    assert wall == pytest.approx(1000 * tiered.host_tier.copy_s_per_token * 0.25)
    with pytest.raises(ValueError, match="geometry"):
        tiered.mocker_args(tmp_path, 0.1, 0.25)


def test_quantile_regression_recovers_a_line() -> None:
    rng = random.Random(7)
    rows, y = [], []
    for _ in range(400):
        x = rng.uniform(0, 10)
        noise = rng.expovariate(1.0) if rng.random() < 0.2 else rng.gauss(0, 0.05)
        rows.append([1.0, x])
        y.append(2.0 + 0.5 * x + noise)  # a heavy right tail, like the trace
    a, b = trace_fit.quantile_regression(rows, y)
    assert a == pytest.approx(2.0, abs=0.1) and b == pytest.approx(0.5, abs=0.02)


@pytest.mark.skipif(not DEFAULT_TRACE.exists(), reason="shared trace not present")
def test_default_timing_is_the_trace_fit() -> None:
    fit = trace_fit.fit_trace()
    assert fit.rows == {"bs1": 205, "bs4": 2831, "bs32": 2752}
    assert fit.timing() == DEFAULT_TIMING
    # Larger batches make every generated token slower.
    d = fit.decode_ms_per_token
    assert d["bs1"] < d["bs4"] < d["bs32"]
    # The decode model, fitted on bs1/bs4, lands within 15% of bs32 net of interference.
    net = d["bs32"] - fit.bs32_interference_ms
    assert DEFAULT_TIMING.decode_step_ms(32) == pytest.approx(net, rel=0.15)
