"""The benchmark's two timing regimes, defined once for the live harness, the simulator and
the calibration check.

A regime says what a re-prefill costs next to a decode step, which is what decides whether
letting an ACTING program's KV cache be evicted hurts throughput (docs/calibration.md):

* ``calibrated``: the GPU timing model fitted to the shared SWE-agent trace. The mocker reads
  it as prefill and decode tables, the simulator as its pass costs; the trace is replayed
  when it is present (else the synthetic SWE-agent shape), and every turn carries the
  trace's per-call client overhead.
* ``cheap-recompute``: the mocker's built-in timing, unchanged (the simulator uses that
  timing as measured here); the toy agents of workload.md.
* ``tiered``: the calibrated regime with a host-memory KV tier behind each worker
  (:class:`HostTier`): KV evicted from the GPU is copied to host memory, and a prompt found
  there is copied back over PCIe instead of re-prefilled, about six times cheaper.

Each regime also says how the two harnesses size it. The live harness shrinks it to fit a
mocker (:class:`LiveScaling`: token and clock scales, the largest agent count; the KV
capacity then follows from the workload, see ``bench/live_sweep.py``); the simulator runs it
at full size on a fixed cluster (:class:`SimSizing`). ``bench live`` and ``bench sim`` flags
override these defaults one field at a time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dynamo_thunderagent.bench.calibration.mocker import StackGeometry, calibrated_mocker_args
from dynamo_thunderagent.bench.calibration.timing import DEFAULT_TIMING, GpuTiming
from dynamo_thunderagent.bench.sim.timing import (
    TimingModel,
    calibrated_timing,
    cheap_recompute_timing,
)
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE
from dynamo_thunderagent.bench.workload import SYNTHETIC_WORKLOADS, WorkloadSpec


@dataclass(frozen=True)
class LiveScaling:
    """How ``bench live`` runs the regime on mocker workers.

    ``token_scale`` multiplies every token count (to fit the mocker's KV pool);
    ``time_scale`` is wall seconds per real second (tool sleeps and, when calibrated, the
    mocker's tables); ``max_agents`` is N at the sweep's largest pressure factor.
    """

    token_scale: float
    time_scale: float
    speedup_ratio: float
    max_agents: int


@dataclass(frozen=True)
class SimSizing:
    """The cluster ``bench sim`` simulates for the regime, and its measurement window."""

    workers: int
    blocks: int
    block_size: int
    warmup_s: float
    window_s: float

    @property
    def pool_tokens(self) -> int:
        """KV tokens of one worker."""
        return self.blocks * self.block_size


@dataclass(frozen=True)
class HostTier:
    """A host-memory KV tier behind each worker's GPU pool, in real units.

    What the 1.6.1 mocker models of vLLM's native offload (``--num-host-blocks`` and the
    copy bandwidths; measured here): blocks the GPU pool evicts are copied to the host (the
    request whose allocation evicted them waits for the copy), and a prompt whose blocks are
    on the host gets them copied back (that request waits; the engine runs on). The mocker
    does not divide copy times by ``--speedup-ratio``.

    Defaults: GLM-4.5's KV (92 layers x 8 KV heads x 128 dims x K and V x 2 bytes =
    376,832 bytes a token), one PCIe Gen5 x16 link at an effective 50 GB/s each way, and a
    host tier four times the GPU pool: a copy costs 7.5 us a token against a 45.6 us
    prefill.
    """

    blocks_per_gpu_block: float = 4.0
    kv_bytes_per_token: int = 376_832
    bandwidth_gbps: float = 50.0

    @property
    def copy_s_per_token(self) -> float:
        """Real seconds to copy one token's KV between host and GPU."""
        return self.kv_bytes_per_token / (self.bandwidth_gbps * 1e9)

    def host_blocks(self, gpu_blocks: int) -> int:
        return max(1, round(gpu_blocks * self.blocks_per_gpu_block))

    def mocker_args(self, gpu_blocks: int, token_scale: float, time_scale: float) -> list[str]:
        """Mocker flags for a pool of ``gpu_blocks`` run at the harness's scales.

        One mocker token stands for ``1 / token_scale`` real tokens (so its KV is that many
        times larger) and the clock runs at ``time_scale``: the bandwidth is divided by it,
        so that a copy lasts ``real time * time_scale`` like everything else.
        """
        bytes_per_token = max(1, round(self.kv_bytes_per_token / token_scale))
        gbps = f"{self.bandwidth_gbps / time_scale:g}"
        return [
            "--num-host-blocks", str(self.host_blocks(gpu_blocks)),
            "--kv-bytes-per-token", str(bytes_per_token),
            "--host-offload-d2h-bandwidth-gbps", gbps,
            "--host-offload-h2d-bandwidth-gbps", gbps,
        ]  # fmt: skip


@dataclass(frozen=True)
class Regime:
    """A named timing regime every arm is run under (see the module docstring).

    ``gpu_timing`` is the timing model the mocker is given, None for the mocker's built-in
    one. ``workload`` names the synthetic workload (``bench.workload.SYNTHETIC_WORKLOADS``)
    used when the regime does not replay the trace, or the trace is absent.
    """

    name: str
    summary: str
    gpu_timing: GpuTiming | None
    workload: str
    replays_trace: bool
    client_overhead_s: float
    live: LiveScaling
    sim: SimSizing
    sim_timing: TimingModel
    host_tier: HostTier | None = None

    @property
    def calibrated(self) -> bool:
        return self.gpu_timing is not None

    def workload_spec(self) -> WorkloadSpec:
        """The synthetic workload of the regime (unscaled)."""
        return SYNTHETIC_WORKLOADS[self.workload]

    def default_trace(self) -> Path | None:
        """The trace the regime replays by default: the shipped one, when it is present."""
        return DEFAULT_TRACE if self.replays_trace and DEFAULT_TRACE.is_file() else None

    def mocker_args(
        self,
        out_dir: Path | str,
        token_scale: float,
        time_scale: float,
        *,
        speedup_ratio: float = 1.0,
        geometry: StackGeometry | None = None,
    ) -> list[str]:
        """Extra mocker flags of the regime; a calibrated one writes its profile to ``out_dir``.

        A regime with a host tier needs ``geometry`` (the tier is sized from the GPU pool).
        """
        args: list[str] = []
        if self.gpu_timing is not None:
            args += calibrated_mocker_args(
                out_dir, token_scale, time_scale,
                speedup_ratio=speedup_ratio, timing=self.gpu_timing, geometry=geometry,
            )  # fmt: skip
        if self.host_tier is not None:
            if geometry is None:
                raise ValueError(f"regime {self.name}: sizing its host tier needs the geometry")
            args += self.host_tier.mocker_args(geometry.num_gpu_blocks, token_scale, time_scale)
        return args


def _calibrated() -> Regime:
    gpu = DEFAULT_TIMING
    return Regime(
        name="calibrated",
        summary=(
            "prefill and decode tables fitted to GLM-4.5-FP8 on vLLM (SWE-agent trace): "
            f"{gpu.prefill_us_per_token:g} us per uncached prompt token, decode step "
            f"{gpu.decode_step_ms(1):.1f} ms at batch 1 and "
            f"{gpu.decode_step_ms(32):.1f} ms at batch 32, scaled by token_scale "
            "and time_scale; a 40k-token re-prefill costs about 100 decode steps"
        ),
        gpu_timing=gpu,
        workload="swe",
        replays_trace=True,
        client_overhead_s=gpu.request_overhead_s,
        live=LiveScaling(token_scale=0.1, time_scale=0.25, speedup_ratio=1.0, max_agents=24),
        # 2 x 16,384 blocks x 16 tokens: 262k tokens a worker, like a GPU of the trace.
        sim=SimSizing(workers=2, blocks=16384, block_size=16, warmup_s=600.0, window_s=1800.0),
        sim_timing=calibrated_timing(gpu),
    )


def _cheap_recompute() -> Regime:
    # The mocker setup of workload.md ("measured here"): 2 workers x 1,408 blocks x 16.
    sim = SimSizing(workers=2, blocks=1408, block_size=16, warmup_s=60.0, window_s=300.0)
    return Regime(
        name="cheap-recompute",
        summary=(
            "the mocker's built-in timing model, unchanged: re-prefilling a few thousand "
            "tokens costs about as much as one loaded decode step, so thrash costs hit rate "
            "but hardly throughput"
        ),
        gpu_timing=None,
        workload="toy",
        replays_trace=False,
        client_overhead_s=0.0,
        live=LiveScaling(token_scale=1.0, time_scale=1.0, speedup_ratio=1.0, max_agents=30),
        sim=sim,
        sim_timing=cheap_recompute_timing(sim.pool_tokens),
    )


def _tiered() -> Regime:
    tier = HostTier()
    return dataclasses.replace(
        _calibrated(),
        name="tiered",
        summary=(
            f"the calibrated regime with a host KV tier {tier.blocks_per_gpu_block:g}x the "
            f"GPU pool behind each worker: evicted KV is copied to host memory and back at "
            f"{tier.bandwidth_gbps:g} GB/s ({tier.copy_s_per_token * 1e6:.1f} us a token of "
            f"GLM-4.5 KV against a {DEFAULT_TIMING.prefill_us_per_token:g} us prefill)"
        ),
        host_tier=tier,
    )


REGIMES: dict[str, Regime] = {r.name: r for r in (_calibrated(), _cheap_recompute(), _tiered())}
REGIME_NAMES: tuple[str, ...] = tuple(REGIMES)


def regime_named(name: str) -> Regime:
    """The regime called ``name``; ValueError naming the choices otherwise."""
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown regime {name!r}; choose from {REGIME_NAMES}") from None
