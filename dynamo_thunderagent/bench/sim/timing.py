"""What one engine pass costs in the simulator, in each timing regime.

Two models, one per regime of the benchmark (:mod:`dynamo_thunderagent.bench.regimes` picks
them): ``cheap-recompute``, the Dynamo mocker's default timing as measured here, in which
re-prefilling an evicted context costs about one loaded decode step; and ``calibrated``, the
GPU timing model fitted to the shared SWE-agent trace, in which re-prefilling an agent
context costs many decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamo_thunderagent.bench.calibration.timing import DEFAULT_TIMING, GpuTiming


@dataclass(frozen=True)
class TimingModel:
    """Seconds of one engine pass.

    ``pass = prefill + decode`` where prefill is ``prefill_pass_s + prefill_per_token_s x
    uncached prompt tokens`` (0 when the pass computes none) and decode is ``decode_base_s +
    decode_per_seq_s x n + decode_per_expert_s x E(n) + decode_per_kv_token_s x kv`` for
    ``n`` decoding requests holding ``kv`` tokens (0 when none decodes). ``E(n)`` is the
    expected number of distinct MoE experts a batch of ``n`` reads (``n_experts x (1 - (1 -
    active_experts / n_experts) ** n)``; 0 when ``n_experts`` is 0): weight reads are what
    make a decode step of a large MoE slower as the batch grows.
    """

    name: str
    prefill_pass_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_seq_s: float = 0.0
    decode_per_expert_s: float = 0.0
    n_experts: int = 0
    active_experts: int = 0
    decode_per_kv_token_s: float = 0.0
    source: str = ""

    def pass_seconds(self, prefill_tokens: int, decode_seqs: int, decode_kv_tokens: int) -> float:
        seconds = 0.0
        if prefill_tokens > 0:
            seconds += self.prefill_pass_s + self.prefill_per_token_s * prefill_tokens
        if decode_seqs > 0:
            seconds += (self.decode_base_s + self.decode_per_seq_s * decode_seqs
                        + self.decode_per_kv_token_s * decode_kv_tokens)
            if self.n_experts:
                miss = 1.0 - self.active_experts / self.n_experts
                seconds += self.decode_per_expert_s * self.n_experts * (1.0 - miss**decode_seqs)
        return seconds

    def describe(self) -> str:
        """One line for reports: what a re-prefill costs next to a decode step."""
        return (f"{self.name}: prefill {self.prefill_pass_s * 1e3:g} ms/pass + "
                f"{self.prefill_per_token_s * 1e6:g} us/token; decode step "
                f"{self.pass_seconds(0, 1, 0) * 1e3:.1f} ms at batch 1, "
                f"{self.pass_seconds(0, 32, 0) * 1e3:.1f} ms at batch 32 (plus "
                f"{self.decode_per_kv_token_s * 1e9:g} ns per KV token); "
                f"re-prefill of 30k tokens {self.pass_seconds(30_000, 0, 0):.2f} s"
                + (f" [{self.source}]" if self.source else ""))


def cheap_recompute_timing(pool_tokens: int = 1408 * 16) -> TimingModel:
    """The Dynamo mocker's default regime, as measured here (workload.md).

    Uncached prefill about 18 ms + 20 us per token; a decode step 6 ms, growing to about
    12 ms as the worker's KV pool fills (``pool_tokens``: the pool size those figures were
    measured at, 2 x 1,408 x 16-token mocker workers).
    """
    return TimingModel(
        name="cheap-recompute",
        prefill_pass_s=0.018,
        prefill_per_token_s=20e-6,
        decode_base_s=0.006,
        decode_per_kv_token_s=0.006 / pool_tokens,
        source="mocker default timing, measured on 2 x 1,408 x 16 blocks",
    )


def calibrated_timing(gpu: GpuTiming = DEFAULT_TIMING) -> TimingModel:
    """GPU-like costs: a re-prefill of an agent context costs many decode steps.

    Coefficients of ``gpu``, by default the fit of the shared SWE-agent trace
    (GLM-4.5-FP8 on vLLM, :mod:`dynamo_thunderagent.bench.calibration.timing`).
    """
    return TimingModel(
        name="calibrated",
        prefill_pass_s=gpu.prefill_pass_ms / 1e3,
        prefill_per_token_s=gpu.prefill_us_per_token / 1e6,
        decode_base_s=gpu.decode_base_ms / 1e3,
        decode_per_expert_s=gpu.decode_ms_per_expert / 1e3,
        n_experts=gpu.n_experts,
        active_experts=gpu.active_experts,
        decode_per_kv_token_s=gpu.decode_ms_per_1k_kv / 1e6,
        # The label is recorded in the simulator's golden outputs; it names the package.
        source="bench.calibration.DEFAULT_TIMING (GLM-4.5-FP8 trace fit)",
    )
