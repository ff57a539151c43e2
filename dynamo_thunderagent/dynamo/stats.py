"""What the router counts (GET /state, docs/metrics.md, "The state endpoint").

The counters add up: every request the router receives ends in exactly one of
passthrough, completed, aborted, rejected, session_final, cancelled or orphans
(docs/reliability.md).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynamo_thunderagent.quantile import percentile

# Bounded per-request samples kept for the state endpoint (benchmarks read them).
SAMPLE_LIMIT = 20_000
# What "recent" means for the share of requests that carry a session id: at most the last
# RECENT_REQUESTS requests, none older than RECENT_SECONDS.
RECENT_REQUESTS = 100
RECENT_SECONDS = 60.0
# The router says that most requests lack a session id only once it has seen this many in the
# window (a handful of health checks is not a client), and at most once per RECENT_SECONDS.
MISSING_SESSIONS_MIN_REQUESTS = 10
# ``dynamo-thunderagent doctor`` probes the frontend with session-final requests whose session
# id starts with this; they are counted apart (``doctor_probes``) and stay out of the window.
PROBE_SESSION_PREFIX = "thunderagent-doctor-probe-"
# GET /state lists at most this many programs (the default max_tracked_requests), so that a
# response stays around 2 MB whatever the table holds; ``programs_total`` says how many exist.
STATE_PROGRAM_LIMIT = 10_000


class RouterObserver(Protocol):
    """Told of what only the router sees (the metrics are one)."""

    def admission_waited(self, seconds: float) -> None:
        """A tracked turn was admitted after ``seconds``."""

    def rejected(self, reason: str) -> None:
        """The router rejected a request itself (``reason``: a bounded label)."""


def bounded_state(scheduler: dict[str, Any], limit: int = STATE_PROGRAM_LIMIT) -> dict[str, Any]:
    """The scheduler's snapshot with at most ``limit`` programs listed (the first created
    first), plus ``programs_total``."""
    programs = scheduler.get("programs")
    if not isinstance(programs, dict):
        return scheduler
    scheduler["programs_total"] = len(programs)
    if len(programs) > limit:
        scheduler["programs"] = dict(itertools.islice(programs.items(), limit))
    return scheduler


@dataclass
class RecentSessions:
    """Whether each recent request carried a session id: the last ``limit`` within ``seconds``."""

    limit: int = RECENT_REQUESTS
    seconds: float = RECENT_SECONDS
    seen: deque[tuple[float, bool]] = field(default_factory=deque)

    def observe(self, has_session: bool, now: float) -> None:
        self.seen.append((now, has_session))
        while len(self.seen) > self.limit:
            self.seen.popleft()

    def counts(self, now: float) -> tuple[int, int]:
        """(with a session id, without one) among the recent requests at ``now``."""
        while self.seen and now - self.seen[0][0] > self.seconds:
            self.seen.popleft()
        with_session = sum(1 for _, has in self.seen if has)
        return with_session, len(self.seen) - with_session


def missing_sessions_due(with_session: int, without_session: int, last_notice: float | None,
                         now: float) -> bool:
    """Whether to say now that most recent requests came without a session id.

    Most means more than half, over at least MISSING_SESSIONS_MIN_REQUESTS requests, and the
    notice repeats at most once per RECENT_SECONDS.
    """
    total = with_session + without_session
    if total < MISSING_SESSIONS_MIN_REQUESTS or without_session * 2 <= total:
        return False
    return last_notice is None or now - last_notice >= RECENT_SECONDS


def exposed_workers_due(exposed: frozenset[int], previous: frozenset[int],
                        last_warning: float | None, now: float) -> bool:
    """Whether to warn now about workers the frontend can reach directly: when there are
    some and the set changed, else at most once per RECENT_SECONDS."""
    if not exposed:
        return False
    return exposed != previous or last_warning is None or now - last_warning >= RECENT_SECONDS


@dataclass
class RouterStats:
    requests: int = 0
    passthrough: int = 0
    session_final: int = 0
    completed: int = 0
    aborted: int = 0
    rejected: int = 0
    errors: int = 0
    orphans: int = 0
    cancelled: int = 0  # clients that left while their request waited for admission
    doctor_probes: int = 0  # session-final probes from `doctor` (within session_final)
    # Turns sent home because the KV router's loads, which the selector weighs a home
    # against, could not be read or left the home rank out (preferred_load_slack).
    loads_unavailable: int = 0
    # Moves of a turn to another worker after its worker failed it (at most FAILOVER_LIMIT
    # per turn; a turn moved twice counts twice).
    failovers: int = 0
    # Streams cut because their worker left discovery and they stalled (each then fails
    # over as its worker's failure, fails with WorkerLeft, or ends as it had finished).
    stalled: int = 0
    with_session: int = 0  # requests that carried X-Dynamo-Session-ID (probes left out)
    without_session: int = 0  # requests that did not: plain KV routing, no program
    prompt_tokens: int = 0
    cached_tokens: int = 0
    admission_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLE_LIMIT))
    # Turns waiting for admission now, by ticket: when each started. A wait cut off by the
    # end of a run is not lost from the figures: it is reported as censored (a lower bound).
    waiting: dict[int, float] = field(default_factory=dict)
    # The longest wait for admission a turn's client gave up on (None: none did).
    given_up_max_s: float | None = None
    recent: RecentSessions = field(default_factory=RecentSessions)

    def wait_given_up(self, seconds: float) -> None:
        """A turn's wait for admission ended without it, after ``seconds``."""
        self.given_up_max_s = max(seconds, self.given_up_max_s or 0.0)

    def as_dict(self, now: float) -> dict[str, Any]:
        waits = list(self.admission_wait_s)
        oldest = min(self.waiting.values(), default=None)
        # Waits that did not end in admission: in progress now, or given up by the client.
        censored = [w for w in (None if oldest is None else now - oldest, self.given_up_max_s)
                    if w is not None]
        recent_with, recent_without = self.recent.counts(now)
        return {
            "requests": self.requests, "passthrough": self.passthrough,
            "session_final": self.session_final, "completed": self.completed,
            "aborted": self.aborted, "rejected": self.rejected, "errors": self.errors,
            "orphans": self.orphans, "cancelled": self.cancelled,
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "hit_rate": (self.cached_tokens / self.prompt_tokens) if self.prompt_tokens else None,
            # Turns only (a session-final request has nothing to wait for), nearest rank.
            "admission_wait_p50_s": percentile(waits, 0.5),
            "admission_wait_p99_s": percentile(waits, 0.99),
            "admission_wait_max_s": max(waits, default=None),
            "admission_waiting": len(self.waiting),
            "admission_wait_censored_max_s": max(censored, default=None),
            "doctor_probes": self.doctor_probes, "loads_unavailable": self.loads_unavailable,
            "failovers": self.failovers, "stalled": self.stalled,
            "with_session": self.with_session, "without_session": self.without_session,
            "recent_with_session": recent_with, "recent_without_session": recent_without,
            "recent_window": {"requests": self.recent.limit, "seconds": self.recent.seconds},
        }
