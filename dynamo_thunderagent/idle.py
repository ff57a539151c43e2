"""How long an idle program is expected back: its *idle horizon*.

An ACTIVE program with no turn in flight or waiting (an ACTING agent whose tool
runs, or a conversation that simply ended without ``X-Dynamo-Session-Final``)
stays charged to its worker/rank so that its KV blocks survive until its next
turn. Keeping that charge has a price (it keeps other programs out) and so does
dropping it (the program re-prefills if it comes back). The scheduler cannot
tell a tool call from an abandoned session directly, but it can see how each
program has behaved so far:

* a program that has shown gaps between turns is expected back within a few
  times the longest gap it has shown;
* a program that has finished only one turn is judged by the population: by the
  gaps other programs showed, unless recent programs mostly never came back
  after their first turn (one-shot clients such as benchmark tools), in which
  case it is not expected back at all.

A program idle past its horizon is *dormant*: it stays in the program table
(and keeps its assignment, so a late return is still sticky when there is
room), but under pressure it is the first to give way. Nothing here is
time-driven; the scheduler asks when it needs an answer, with ``now`` passed in.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from dynamo_thunderagent.program import Lifecycle, Program

# How many recent gaps the population estimate keeps, and how often its quantile
# is recomputed (sorting 256 floats every 16 observations keeps admission cheap).
GAP_WINDOW = 256
_RECOMPUTE_EVERY = 16
# The quantile of recent gaps taken as "how long programs stay away".
GAP_QUANTILE = 0.9
# Decided first idles (came back, or did not within their horizon) needed before
# the return rate is trusted, and the rate below which one-turn programs are not
# expected back. The counts are halved past _EVIDENCE_CAP so they follow the
# current traffic rather than all of it.
MIN_EVIDENCE = 8
# Weight of the newest gap in a program's smoothed gap (Program.gap_ewma), which is smoothed
# in log space (a geometric mean): one long tool (a build, a test suite, a person) among
# short ones moves it by a factor, not by its size, so the short gaps that follow are still
# expected short (acting_yield_factor, acting_hold_factor).
GAP_SMOOTHING = 0.3
# Gaps shorter than this count as this much (the log of a gap of 0 is not a number).
GAP_FLOOR_SECONDS = 1e-3
MIN_RETURN_RATE = 0.2
_EVIDENCE_CAP = 256


def smoothed_gap(previous: float, gap: float) -> float:
    """A program's smoothed gap after one more ``gap`` (``previous`` 0: its first): the
    geometric mean of its gaps, the newest weighted by ``GAP_SMOOTHING``."""
    gap = max(gap, GAP_FLOOR_SECONDS)
    if previous <= 0.0:
        return gap
    return math.exp((1 - GAP_SMOOTHING) * math.log(previous) + GAP_SMOOTHING * math.log(gap))


@dataclass
class ReturnEvidence:
    """What the population's programs showed about coming back after a turn."""

    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAP_WINDOW))
    returned: float = 0.0  # first idles that ended with the program's next turn
    gone: float = 0.0  # first idles that passed their horizon with no next turn
    _typical: float | None = None
    _since_recompute: int = 0

    def observe_gap(self, gap: float) -> None:
        """A program's next turn arrived ``gap`` seconds after its previous one ended."""
        self.gaps.append(max(0.0, gap))
        self._since_recompute += 1
        if self._typical is None or self._since_recompute >= _RECOMPUTE_EVERY:
            ordered = sorted(self.gaps)
            self._typical = ordered[min(len(ordered) - 1, int(GAP_QUANTILE * len(ordered)))]
            self._since_recompute = 0

    def first_idle_ended(self, *, returned: bool) -> None:
        if returned:
            self.returned += 1
        else:
            self.gone += 1
        if self.returned + self.gone > _EVIDENCE_CAP:
            self.returned /= 2
            self.gone /= 2

    def first_idle_undone(self) -> None:
        """A program counted as gone came back after all (late)."""
        self.gone = max(0.0, self.gone - 1)
        self.first_idle_ended(returned=True)

    @property
    def typical_gap(self) -> float | None:
        """A high quantile of recent gaps between turns (None: no program came back yet)."""
        return self._typical

    @property
    def return_rate(self) -> float | None:
        """Share of recent first idles that ended in a next turn (None: too little evidence)."""
        decided = self.returned + self.gone
        return None if decided < MIN_EVIDENCE else self.returned / decided

    def as_dict(self) -> dict[str, float | None]:
        return {"typical_gap_seconds": self._typical, "return_rate": self.return_rate,
                "gaps_observed": len(self.gaps)}


def idle_horizon(program: Program, evidence: ReturnEvidence, *, factor: float,
                 minimum: float, maximum: float) -> float:
    """Seconds after which ``program``, idle now, is no longer expected back.

    ``factor`` times the longest gap the program has shown; for a program with
    no gap yet, ``factor`` times the population's typical gap, or 0 when no
    program has come back yet or most recent ones never did. Clamped to
    [``minimum``, ``maximum``].
    """
    typical, rate = evidence.typical_gap, evidence.return_rate
    if program.max_gap > 0.0:
        base = program.max_gap
    elif typical is None or (rate is not None and rate < MIN_RETURN_RATE):
        base = 0.0  # nobody came back yet, or recent programs mostly did not
    else:
        base = typical
    return min(maximum, max(minimum, factor * base))


class IdlePrograms:
    """The scheduler's index of idle programs: who went idle when, who is dormant.

    It decides nothing about capacity; the scheduler asks it for the oldest idle
    program (to evict) and for dormant ones (to pause first). Entries are not
    removed when a program becomes busy again or leaves the table; they are
    checked against the table when they surface (``programs`` is the table's
    session -> program mapping), so every operation is O(log n) amortized.
    """

    def __init__(self, programs: Mapping[str, Program], *, factor: float | None,
                 minimum: float, maximum: float) -> None:
        self.programs = programs
        self.factor = factor  # None: no horizons, nothing ever becomes dormant
        self.minimum = minimum
        self.maximum = maximum
        self.evidence = ReturnEvidence()
        # (last_active, seq, session): the eviction order.
        self._order: list[tuple[float, int, str]] = []
        # (deadline, seq, session, last_active): the horizons not reached yet.
        self._horizons: list[tuple[float, int, str, float]] = []
        # Past their horizon, in the order they got there.
        self.dormant: dict[str, Program] = {}

    def reconfigure(self, *, factor: float | None, minimum: float, maximum: float) -> None:
        """New horizon rules for programs that go idle from now on (a policy reload).

        Horizons already set keep their deadline; with ``factor`` None nothing becomes
        dormant any more, so the pending horizons and the dormant set are dropped.
        """
        self.factor, self.minimum, self.maximum = factor, minimum, maximum
        if factor is None:
            self._horizons.clear()
            self.dormant.clear()

    def _current(self, session_id: str, seq: int, last_active: float) -> Program | None:
        """The program an entry names, if it is still that idle period of that program."""
        program = self.programs.get(session_id)
        if (program is None or program.seq != seq or program.busy
                or program.last_active != last_active):
            return None
        return program

    def went_idle(self, program: Program, now: float) -> None:
        """``program`` has no turn in flight or waiting from ``now`` on."""
        seq, session_id = program.seq, program.session_id
        heapq.heappush(self._order, (program.last_active, seq, session_id))
        if self.factor is not None and program.lifecycle is Lifecycle.ACTIVE:
            horizon = idle_horizon(program, self.evidence, factor=self.factor,
                                   minimum=self.minimum, maximum=self.maximum)
            heapq.heappush(self._horizons,
                           (now + horizon, seq, session_id, program.last_active))
        # Stale entries are dropped as they surface; rebuild if they pile up anyway.
        bound = 2 * len(self.programs) + 1024
        if len(self._order) > bound:
            self._order = [(p.last_active, p.seq, p.session_id)
                           for p in self.programs.values() if not p.busy]
            heapq.heapify(self._order)
        if len(self._horizons) > bound:
            idle = {(p.seq, p.last_active) for p in self.programs.values() if not p.busy}
            self._horizons = [e for e in self._horizons if (e[1], e[3]) in idle]
            heapq.heapify(self._horizons)

    def returned(self, program: Program, now: float) -> None:
        """An idle program's next turn arrived: learn the gap; it is no longer dormant."""
        self.dormant.pop(program.session_id, None)
        if program.steps == 0:
            return  # its only turn was aborted: nothing ended, no gap to learn
        if program.max_gap == 0.0:
            if program.gone_counted:
                self.evidence.first_idle_undone()
            else:
                self.evidence.first_idle_ended(returned=True)
        gap = max(0.0, now - program.last_active)
        self.evidence.observe_gap(gap)
        program.max_gap = max(program.max_gap, gap, 1e-9)
        program.gap_ewma = smoothed_gap(program.gap_ewma, gap)

    def forget(self, session_id: str) -> None:
        """The program left the table."""
        self.dormant.pop(session_id, None)

    def oldest(self) -> Program | None:
        """Remove and return the program idle the longest (None: no program is idle)."""
        while self._order:
            last_active, seq, session_id = heapq.heappop(self._order)
            program = self._current(session_id, seq, last_active)
            if program is not None:
                return program
        return None

    def find_dormant(self, now: float) -> None:
        """Move idle programs whose horizon has passed into ``dormant``."""
        horizons = self._horizons
        while horizons and horizons[0][0] <= now:
            _, seq, session_id, last_active = heapq.heappop(horizons)
            program = self._current(session_id, seq, last_active)
            if program is None:
                continue
            if program.max_gap == 0.0 and not program.gone_counted:
                program.gone_counted = True
                self.evidence.first_idle_ended(returned=False)
            if program.lifecycle is Lifecycle.ACTIVE and program.worker is not None:
                self.dormant[session_id] = program

    def pop_dormant(self) -> Program | None:
        """Remove and return the program longest past its horizon that is still dormant."""
        while self.dormant:
            session_id = next(iter(self.dormant))
            program = self.dormant.pop(session_id)
            if (not program.busy and program.lifecycle is Lifecycle.ACTIVE
                    and self.programs.get(session_id) is program):
                return program
        return None
