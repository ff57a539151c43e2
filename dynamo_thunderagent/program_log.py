"""Scheduling decisions that change a program, as one kind of record and one kind of log line.

The scheduler's :class:`~dynamo_thunderagent.decisions.Decisions` say *what* changed (these
programs were paused, those resumed); an operator also wants *why*, *where*, *how big* and
*after how long*. :class:`ProgramEvent` carries exactly that, with the same fields for every
kind, so that one log query or one metric label set covers them all. The recording scheduler
(:mod:`dynamo_thunderagent.recording`) produces them; the classifier logs them
(:func:`log_event`) and hands them to its observers (the router's Prometheus metrics).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from dynamo_thunderagent.program import WorkerKey

log = structlog.get_logger("dynamo_thunderagent.program_log")


class EventKind(enum.Enum):
    """Every scheduling decision that changes a program."""

    ADMITTED = "admitted"  # a turn was released to a worker/rank (or any, cold start)
    DEFERRED = "deferred"  # a turn waits: its program is paused
    PAUSED = "paused"
    RESUMED = "resumed"
    MOVED = "moved"  # the program's worker/rank changed
    FORCED = "forced"  # resumed because its turn waited past resume_timeout_seconds
    EXPIRED = "expired"  # idle past session_retention_seconds
    EVICTED = "evicted"  # removed to make room in the table (max_tracked_requests)
    ENDED = "ended"  # session-final, or rolled back (a new program whose turn never ran)


# Per-turn events would flood INFO at 1,000 agents (several a second each); the rare ones
# (pressure, moves, expiry) are what an operator reads the log for.
PER_TURN = frozenset({EventKind.ADMITTED, EventKind.DEFERRED, EventKind.ENDED})


class PauseReason(enum.Enum):
    PRESSURE = "pressure"  # its rank was over pause_threshold; it was ACTING
    TOOL_BOUNDARY = "tool_boundary"  # marked while REASONING; paused when its turn ended
    NO_ROOM = "no_room"  # its new turn fits no rank, or programs already wait for room
    IDLE = "idle"  # dormant (past its idle horizon): gives way first


@dataclass(frozen=True)
class ProgramEvent:
    """One program-changing decision. ``wait``: seconds the program's turn had waited for
    room when it was admitted, resumed or forced (0 otherwise)."""

    kind: EventKind
    program: str
    worker: WorkerKey | None
    tokens: int
    reason: str
    wait: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The log line's fields: the same keys for every kind."""
        return {
            "program": self.program,
            "worker_id": None if self.worker is None else self.worker.worker_id,
            "dp_rank": None if self.worker is None else self.worker.dp_rank,
            "tokens": self.tokens,
            "reason": self.reason,
            "wait_s": round(self.wait, 3),
        }


def log_event(event: ProgramEvent) -> None:
    """``program.<kind>``: DEBUG for per-turn kinds, INFO for the rest."""
    level = logging.DEBUG if event.kind in PER_TURN else logging.INFO
    log.log(level, f"program.{event.kind.value}", **event.fields())


def configure_logging(env: Mapping[str, str] = os.environ) -> None:
    """structlog as Dynamo's processes log: JSON lines when ``DYN_LOGGING_JSONL`` is set
    (to anything but 0/false), else readable console lines; the level from ``DYN_LOG``
    (Dynamo's variable: error, warn, info, debug, trace; default info)."""
    jsonl = env.get("DYN_LOGGING_JSONL", "").strip().lower() not in ("", "0", "false", "no")
    level = _LEVELS.get(env.get("DYN_LOG", "info").split(",")[0].strip().lower(), logging.INFO)
    renderer: Any = (structlog.processors.JSONRenderer() if jsonl
                     else structlog.dev.ConsoleRenderer(colors=False))
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if jsonl:  # the console renderer formats exceptions itself
        processors.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


_LEVELS = {"error": logging.ERROR, "warn": logging.WARNING, "warning": logging.WARNING,
           "info": logging.INFO, "debug": logging.DEBUG, "trace": logging.DEBUG}


class SchedulerObserver(Protocol):
    """Told of what the scheduler did, as it happens (the router's metrics are one)."""

    def program_event(self, event: ProgramEvent) -> None:
        """One program-changing step."""

    def rejected(self, reason: str) -> None:
        """A request was rejected; ``reason`` is a bounded label (recording.REJECTION_REASONS)."""

    def ticked(self, seconds: float) -> None:
        """One scheduler tick took ``seconds``."""
