"""One percentile rule for every figure the project reports (router and benchmarks)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]) of ``values``; None if empty.

    The value of rank ``ceil(q x n)`` (at least 1) in ascending order: always one of the
    samples, never interpolated. The router's admission waits and every percentile the
    benchmarks report (live, simulator, overhead, reliability) come from here, so their p50
    and p99 mean the same thing.
    """
    if not values:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]
