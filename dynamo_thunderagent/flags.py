"""Number types for the commands' flags: a flag's number is finite and of a sane size, so
that ``nan``, ``inf`` or ``1e300`` is refused by argparse with the flag's name instead of
failing deep inside a run (a NaN window that never ends, an overflowing sleep)."""

from __future__ import annotations

import argparse
import math

# The largest magnitude a float flag takes: more than any duration (about 31 years) or
# scale a run can use, and small enough for every sleep, timeout and integer conversion.
MAX_FLAG_NUMBER = 1e9


def finite_float(text: str) -> float:
    """argparse ``type``: a finite number of magnitude at most :data:`MAX_FLAG_NUMBER`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or abs(value) > MAX_FLAG_NUMBER:
        raise argparse.ArgumentTypeError(
            f"must be a finite number no larger than 1e9, got {text!r}")
    return value
