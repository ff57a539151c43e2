"""The benchmark's two timing regimes, defined once for the live harness, the simulator and
the calibration check.

A regime says what a re-prefill costs next to a decode step, which is what decides whether
letting an ACTING program's KV cache be evicted hurts throughput (docs/calibration.md):

* ``calibrated``: the GPU timing model fitted to the shipped SWE-agent trace. The mocker reads
  it as prefill and decode tables, the simulator as its pass costs; the trace is replayed
  when it is present (else the synthetic SWE-agent shape), and every turn carries the
  trace's per-call client overhead.
* ``cheap-recompute``: the mocker's built-in timing, unchanged (the simulator uses that
  timing as measured here); the toy agents of workload.md.

Each regime also says how the two harnesses size it. The live harness shrinks it to fit a
mocker (:class:`LiveScaling`: token and clock scales, the largest agent count; the KV
capacity then follows from the workload, see ``bench/live_sweep.py``); the simulator runs it
at full size on a fixed cluster (:class:`SimSizing`). ``bench live`` and ``bench sim`` flags
override these defaults one field at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynamo_thunderagent.bench.calibration.mocker import StackGeometry, calibrated_mocker_args
from dynamo_thunderagent.bench.calibration.timing import DEFAULT_TIMING, GpuTiming
from dynamo_thunderagent.bench.sim.timing import (
    TimingModel,
    calibrated_timing,
    cheap_recompute_timing,
)
from dynamo_thunderagent.bench.workload import DEFAULT_TRACE, SYNTHETIC_WORKLOADS, WorkloadSpec


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
        """Extra mocker flags of the regime; a calibrated one writes its profile to ``out_dir``."""
        if self.gpu_timing is None:
            return []
        return calibrated_mocker_args(
            out_dir, token_scale, time_scale,
            speedup_ratio=speedup_ratio, timing=self.gpu_timing, geometry=geometry,
        )  # fmt: skip


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


REGIMES: dict[str, Regime] = {r.name: r for r in (_calibrated(), _cheap_recompute())}
REGIME_NAMES: tuple[str, ...] = tuple(REGIMES)


def regime_named(name: str) -> Regime:
    """The regime called ``name``; ValueError naming the choices otherwise."""
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown regime {name!r}; choose from {REGIME_NAMES}") from None
