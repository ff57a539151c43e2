"""What recompute costs on the engine, and whether a pause pays for it (the cost seam).

"Pause only when pausing pays" needs two figures: how long the engine takes to
prefill one uncached token (its own cost: the least-delayed turns, since what a
loaded engine adds to a turn only ever adds), and how long a turn's decode takes (first token to
last: the work a turn is for). Both come from many completed requests, so one
slow request does not flip decisions. Decode time, not the whole turn, is the
yardstick: thrash lengthens whole turns, which would make recompute look cheaper
exactly when it is hurting most.

The shells (the router, the simulator) hand each completed turn's timings over as
one :class:`TurnTiming`; the scheduler's :class:`CostModel` measures and decides.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from dynamo_thunderagent.quantile import percentile


@dataclass(frozen=True)
class EngineCosts:
    prefill_seconds_per_token: float
    decode_seconds: float


@dataclass(frozen=True)
class TurnTiming:
    """One completed turn as the engine timed it (None: not reported)."""

    uncached_tokens: int | None  # prompt tokens the engine had to prefill
    prefill_seconds: float | None  # queue exit to first token
    decode_seconds: float | None  # first token to last
    output_tokens: int | None = None  # tokens generated (None: not counted)


@dataclass
class CostMeter:
    """Engine costs from completed agent turns.

    **Prefill, per token: what the engine itself takes.** An engine's reported prefill time
    also holds what a loaded engine adds to a turn (waiting for a pass or for free blocks,
    a busy CPU), and under load that dwarfs the compute: the mocker's 20 us a token read as
    120 us on average. Waiting only ever adds, so the least-delayed turns show the engine's
    own cost: the meter keeps the time per token of the last ``window`` turns that
    prefilled at least ``min_uncached_tokens`` (so that a pass's fixed cost does not
    dominate) and takes their ``quantile`` (the 10th percentile, by the project's one
    nearest-rank rule: the least of them until eleven are in).

    **Decode: the yardstick** is the least the smoothed decode time (``alpha``) has been:
    thrash slows decode too (prefill chunks share its passes), and a yardstick that grew
    with thrash would call recompute cheap when it hurts most. A turn of one generated
    token has no decode at all (its first token is its last), so it is not a sample: a
    client's one-token turns (``max_tokens: 1`` checks or classifications) would otherwise
    pull the least smoothed value towards zero, and every pause would look as if it paid.
    Short turns of two tokens or more still count, and pull it down in proportion; a
    per-token decode cost would not, but it prices a pause differently (not done).
    """

    alpha: float = 0.1
    min_uncached_tokens: int = 1024
    window: int = 64
    quantile: float = 0.1
    prefill_seconds_per_token: float | None = None
    decode_seconds: float | None = None
    _decode_ewma: float | None = None
    _per_token: deque[float] = field(default_factory=deque)

    def observe(self, timing: TurnTiming) -> EngineCosts | None:
        """Fold in one completed request; the current estimate once both are known."""
        if (timing.prefill_seconds is not None and timing.uncached_tokens is not None
                and timing.uncached_tokens >= self.min_uncached_tokens):
            self._per_token.append(timing.prefill_seconds / timing.uncached_tokens)
            if len(self._per_token) > self.window:
                self._per_token.popleft()
            self.prefill_seconds_per_token = percentile(self._per_token, self.quantile)
        if timing.decode_seconds is not None and (
                timing.output_tokens is None or timing.output_tokens > 1):
            self._decode_ewma = _ewma(self._decode_ewma, timing.decode_seconds, self.alpha)
            if self.decode_seconds is None or self._decode_ewma < self.decode_seconds:
                self.decode_seconds = self._decode_ewma
        if self.prefill_seconds_per_token is None or self.decode_seconds is None:
            return None
        return EngineCosts(self.prefill_seconds_per_token, self.decode_seconds)


def _stall(tokens: int, prefill_seconds_per_token: float | None, batch: float) -> float | None:
    if prefill_seconds_per_token is None:
        return None
    return tokens * prefill_seconds_per_token * max(1.0, batch)


def _ewma(current: float | None, sample: float, alpha: float) -> float:
    return sample if current is None else (1 - alpha) * current + alpha * sample


class CostModel(Protocol):
    """Would pausing (or holding back) a program of ``tokens`` save more than it costs,
    with ``batch`` turns running on a worker/rank?"""

    def observe(self, timing: TurnTiming) -> None:
        """Learn from one completed turn."""

    def set_costs(self, costs: EngineCosts) -> None:
        """Take these engine costs as measured (replaces the estimate)."""

    def pause_pays(self, tokens: int, batch: float) -> bool: ...

    def stall_seconds(self, tokens: int, batch: float) -> float | None:
        """What re-prefilling ``tokens`` uncached tokens holds up: its time times the
        ``batch`` of turns running beside it (at least one); None until measured."""

    def describe(self) -> dict[str, float | None]: ...


@dataclass
class PauseAlwaysPays:
    """Parity: every pause pays (the paper's rule; recompute is never weighed)."""

    meter: CostMeter = field(default_factory=CostMeter)

    def observe(self, timing: TurnTiming) -> None:
        self.meter.observe(timing)  # measured anyway, for the state endpoint

    def set_costs(self, costs: EngineCosts) -> None:
        pass

    def pause_pays(self, tokens: int, batch: float) -> bool:
        return True

    def stall_seconds(self, tokens: int, batch: float) -> float | None:
        return _stall(tokens, self.meter.prefill_seconds_per_token, batch)

    def describe(self) -> dict[str, float | None]:
        return {"prefill_seconds_per_token": self.meter.prefill_seconds_per_token,
                "decode_seconds": self.meter.decode_seconds}


@dataclass
class MeasuredRecompute:
    """A pause pays when the recompute it avoids is worth the batch slot it leaves idle.

    Re-prefilling a program's context holds up every turn running on its worker/rank
    (prefill passes are shared), so what it costs is the re-prefill time times the
    ``batch`` of running turns; what a pause costs is one turn slot, about a turn's
    decode time. A pause pays when the first is at least ``ratio`` times the second.
    Where prefill is cheap and the batch small, keeping everyone running wins, as in
    plain KV routing; where a re-prefill costs many decode steps of a full batch,
    pausing wins. Until the engine's costs are measured nothing is known to pay, so
    admission stays open like plain KV routing (a pause made on a guess costs a wait
    that stock routing never imposes)."""

    ratio: float
    meter: CostMeter = field(default_factory=CostMeter)
    costs: EngineCosts | None = None

    def observe(self, timing: TurnTiming) -> None:
        costs = self.meter.observe(timing)
        if costs is not None:
            self.costs = costs

    def set_costs(self, costs: EngineCosts) -> None:
        self.costs = costs

    def pause_pays(self, tokens: int, batch: float) -> bool:
        stalled = self.stall_seconds(tokens, batch)
        if stalled is None or self.costs is None:
            return False
        return stalled >= self.ratio * self.costs.decode_seconds

    def stall_seconds(self, tokens: int, batch: float) -> float | None:
        return _stall(tokens, None if self.costs is None
                      else self.costs.prefill_seconds_per_token, batch)

    def describe(self) -> dict[str, float | None]:
        return {"prefill_seconds_per_token": None if self.costs is None
                else self.costs.prefill_seconds_per_token,
                "decode_seconds": None if self.costs is None else self.costs.decode_seconds,
                "pause_min_recompute_ratio": self.ratio}


@dataclass
class HostTierCosts:
    """A host KV tier keeps what the GPU pools evict, up to its room (``host_kv_blocks``).

    A program whose context the tier keeps comes back by a copy that holds up only its own
    turn, so pausing it saves nothing; only the tokens beyond the tier's spare room would be
    re-prefilled, and those are what the wrapped model weighs. The spare room is the
    fleet's: the tier's capacity less what the programs hold beyond the GPU pools, set by
    the scheduler once per tick (:meth:`set_spare`). A move still pays the full stall: the
    copy stays on the tier of the worker/rank it leaves.
    """

    inner: CostModel
    spare_tokens: float = 0.0

    def set_spare(self, tier_tokens: float, gpu_tokens: float, held_tokens: float) -> None:
        """The tier holds ``tier_tokens``, the GPU pools ``gpu_tokens``, programs
        ``held_tokens`` in all: what is left of the tier for the next eviction."""
        self.spare_tokens = tier_tokens - max(0.0, held_tokens - gpu_tokens)

    def observe(self, timing: TurnTiming) -> None:
        self.inner.observe(timing)

    def set_costs(self, costs: EngineCosts) -> None:
        self.inner.set_costs(costs)

    def pause_pays(self, tokens: int, batch: float) -> bool:
        lost = tokens - max(0.0, self.spare_tokens)
        return lost > 0 and self.inner.pause_pays(math.ceil(lost), batch)

    def stall_seconds(self, tokens: int, batch: float) -> float | None:
        return self.inner.stall_seconds(tokens, batch)

    def describe(self) -> dict[str, float | None]:
        return {**self.inner.describe(), "host_tier_spare_tokens": self.spare_tokens}


def cost_model(pause_min_recompute_ratio: float | None) -> CostModel:
    """The cost seam for a policy: parity unless a recompute ratio is set."""
    if pause_min_recompute_ratio is None:
        return PauseAlwaysPays()
    return MeasuredRecompute(pause_min_recompute_ratio)


def carry_costs(old: CostModel, ratio: float | None) -> CostModel:
    """The cost model for ``ratio`` that keeps what ``old`` measured of the engine.

    The meter (its prefill samples and smoothed decode time) moves over as it is; a measured
    model also keeps the costs it was told or had measured.
    """
    inner = old.inner if isinstance(old, HostTierCosts) else old
    meter = inner.meter if isinstance(inner, (PauseAlwaysPays, MeasuredRecompute)) else None
    new = cost_model(ratio)
    if meter is not None and isinstance(new, (PauseAlwaysPays, MeasuredRecompute)):
        new.meter = meter
    if isinstance(new, MeasuredRecompute):
        if isinstance(inner, MeasuredRecompute):
            new.costs = inner.costs
        elif (meter is not None and meter.prefill_seconds_per_token is not None
              and meter.decode_seconds is not None):
            new.costs = EngineCosts(meter.prefill_seconds_per_token, meter.decode_seconds)
    return new
