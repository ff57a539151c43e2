"""The GPU timing model: what one engine pass costs on the reference deployment.

Real tokens and real milliseconds, fitted to the shared SWE-agent trace (GLM-4.5-FP8 on
vLLM; :mod:`.fit` reproduces the fit). Everything else in the calibration package scales
this model for the mocker (:mod:`.mocker`); the simulator reads it as its calibrated timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Median generated tokens per step in the trace.
TRACE_MEDIAN_OUTPUT_TOKENS = 77
# vLLM's usual chunked-prefill budget on the traced deployment, in real tokens.
REAL_MAX_NUM_BATCHED_TOKENS = 8192


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
