"""What recompute costs on the engine, measured from its own timings.

"Pause only when pausing pays" needs two figures: how long the engine takes to
prefill one uncached token, and how long a turn's decode takes (first token to
last: the work a turn is for). Both are smoothed over completed requests, so one
slow request does not flip decisions. Decode time, not the whole turn, is the
yardstick: thrash lengthens whole turns, which would make recompute look cheaper
exactly when it is hurting most.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineCosts:
    prefill_seconds_per_token: float
    decode_seconds: float


@dataclass
class CostMeter:
    """Exponentially weighted engine costs from completed requests.

    Prefill cost per token is taken only from requests that prefilled at least
    ``min_uncached_tokens``, so that the per-pass overhead does not dominate.
    """

    alpha: float = 0.1
    min_uncached_tokens: int = 1024
    prefill_seconds_per_token: float | None = None
    decode_seconds: float | None = None
    _decode_ewma: float | None = None

    def observe(self, uncached_tokens: int | None, prefill_seconds: float | None,
                decode_seconds: float | None) -> EngineCosts | None:
        """Fold in one completed request; the current estimate once both are known."""
        if (prefill_seconds is not None and uncached_tokens is not None
                and uncached_tokens >= self.min_uncached_tokens):
            self.prefill_seconds_per_token = _ewma(
                self.prefill_seconds_per_token, prefill_seconds / uncached_tokens, self.alpha)
        if decode_seconds is not None:
            self._decode_ewma = _ewma(self._decode_ewma, decode_seconds, self.alpha)
            # The yardstick is the least the smoothed decode time has been: thrash
            # slows decode too (prefill chunks share its passes), and a yardstick
            # that grew with thrash would call recompute cheap when it hurts most.
            if self.decode_seconds is None or self._decode_ewma < self.decode_seconds:
                self.decode_seconds = self._decode_ewma
        if self.prefill_seconds_per_token is None or self.decode_seconds is None:
            return None
        return EngineCosts(self.prefill_seconds_per_token, self.decode_seconds)


def _ewma(current: float | None, sample: float, alpha: float) -> float:
    return sample if current is None else (1 - alpha) * current + alpha * sample
