"""Scheduling decisions that change a program, as one kind of log line, and who is told of them.

The scheduler's :class:`~dynamo_thunderagent.decisions.Decisions` say *what* changed (these
programs were paused, those resumed) and, in ``Decisions.steps``, *why*, *where*, *how big*
and *after how long*: one :class:`~dynamo_thunderagent.decisions.ProgramEvent` per step, with
the same fields for every kind, so that one log query or one metric label set covers them all.
The classifier logs them (:func:`log_event`) and hands them to its observers
(:class:`SchedulerObserver`; the router's Prometheus metrics are one).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Protocol

import structlog

from dynamo_thunderagent.decisions import EventKind, ProgramEvent

log = structlog.get_logger("dynamo_thunderagent.program_log")

# Per-turn events would flood INFO at 1,000 agents (several a second each); the rare ones
# (pressure, moves, expiry) are what an operator reads the log for.
PER_TURN = frozenset({EventKind.ADMITTED, EventKind.DEFERRED, EventKind.ENDED})


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
        """A request was rejected; ``reason`` is a bounded label (``decisions.RejectLimit``)."""

    def ticked(self, seconds: float) -> None:
        """One scheduler tick took ``seconds``."""
