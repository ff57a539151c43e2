"""What the systems under test let a benchmark read about their scheduling (pure).

Our router serves its scheduler's counters on ``GET /state``; Dynamo's Python ThunderAgent
router logs each pause and resume; Dynamo's builtin (Rust) ThunderAgent logs its paused count
at debug level in the frontend's log. Stock KV routing has nothing to report. The arms in
:mod:`dynamo_thunderagent.stack.arms` choose which of these readers apply to them.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
_PY_EVENT = re.compile(r"thunderagent\.program (paused|resumed) .*\bpaused=(\d+)")
_BUILTIN_STATE = re.compile(r"ThunderAgent scheduler state changed .*\bpaused_programs=(\d+)")
_BUILTIN_FORCED = re.compile(r"forced program resumes .*\bforced_resumes=(\d+)")


def scheduler_figures(state: dict[str, Any]) -> dict[str, Any]:
    """The operator-facing figures of our router's ``/state`` document."""
    scheduler = state.get("scheduler") or {}
    router = state.get("router") or {}
    counters = scheduler.get("counters") or {}
    return {
        "pauses": counters.get("pauses", 0),
        "resumes": counters.get("resumes", 0),
        "moves": counters.get("moves", 0),
        "forced_resumes": counters.get("forced_resumes", 0),
        "paused_at_end": scheduler.get("paused"),
        "admission_wait_p50_s": router.get("admission_wait_p50_s"),
        "admission_wait_p99_s": router.get("admission_wait_p99_s"),
        "admission_wait_max_s": router.get("admission_wait_max_s"),
        # Turns still waiting when the run ended, or given up by their client: the longest
        # such wait (a lower bound).
        "admission_wait_censored_max_s": router.get("admission_wait_censored_max_s"),
        "router_hit_rate": router.get("hit_rate"),
        "rejected": router.get("rejected"),
        "yields": counters.get("yields", 0),
        # Waiting turns run at home because that rank's engine was evicting anyway (or
        # keeping paused programs anyway, pause_min_resume_loss).
        "released_evicting": counters.get("released_evicting", 0),
        # Pauses made, and marks set, to make room for turns past max_wait_seconds (and
        # marks that lapsed because no such turn waited any more).
        "aging_pauses": counters.get("aging_pauses", 0),
        "aging_marks": counters.get("aging_marks", 0),
        "aging_marks_cleared": counters.get("aging_marks_cleared", 0),
        # What the engine lost of the cache continuing turns expected, per rank, at the end.
        "cache_loss": scheduler.get("cache_loss"),
        # What paused programs found of their prompt back home, per rank, and the ranks
        # judged to keep them (pause_min_resume_loss), at the end.
        "resume_loss": scheduler.get("resume_loss"),
        "keeping_paused": scheduler.get("keeping_paused"),
        # What the cost model had measured by the end, and the hold and yield horizon
        # derived from it: what the priced decisions of the run were based on.
        "engine_costs": scheduler.get("costs"),
        "acting_hold_seconds": scheduler.get("acting_hold_seconds"),
        "acting_yield_seconds": scheduler.get("acting_yield_seconds"),
        # Every counter of the scheduler at the end, the ones above included: what each
        # mechanism did in the run (empty_rank_moves, priced_moves, held_home, ...).
        "counters": dict(counters),
    }


def _log_time(line: str) -> float | None:
    match = _TS.match(line)
    if match is None:
        return None
    stamp = dt.datetime.fromisoformat(match.group(1)).replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def parse_python_router_log(text: str) -> dict[str, Any]:
    """Pauses, resumes and the paused-count samples of ``dynamo.thunderagent_router``'s log."""
    pauses = resumes = 0
    samples: list[tuple[float, float]] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _PY_EVENT.search(line)
        if match is None:
            continue
        if match.group(1) == "paused":
            pauses += 1
        else:
            resumes += 1
        when = _log_time(line)
        if when is not None:
            samples.append((when, float(match.group(2))))
    return {"pauses": pauses, "resumes": resumes, "samples": samples}


def parse_builtin_log(text: str) -> dict[str, Any]:
    """Paused-count samples and forced resumes of Dynamo's builtin ThunderAgent (debug log)."""
    samples: list[tuple[float, float]] = []
    forced = 0
    seen = False
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        match = _BUILTIN_STATE.search(line)
        if match is not None:
            seen = True
            when = _log_time(line)
            if when is not None:
                samples.append((when, float(match.group(1))))
            continue
        forced_match = _BUILTIN_FORCED.search(line)
        if forced_match is not None:
            forced = max(forced, int(forced_match.group(1)))
    return {"samples": samples, "forced_resumes": forced, "seen": seen}
