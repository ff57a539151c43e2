"""``dynamo-thunderagent top``: a live terminal view of a running router's /state.

Refreshed every ``--interval`` seconds (default 1): each worker/rank's usage against
its capacity and thresholds (pause above ``pause_threshold``, resume below
``pause_threshold - resume_hysteresis``) and the prompt tokens of requests without a session
id running there (with what is taken off its capacity for them), the resident and paused
programs, the turns
waiting for room with how long each has waited, and the scheduler's recent decisions.
It only reads GET /state, so it runs anywhere the state port is reachable (loopback by
default: ``ssh -L`` to watch a remote router).

:func:`render` is pure (state in, renderable out); the loop around it owns the clock,
the HTTP reads and the terminal.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.urls import state_url

# Rows shown per table before "... and N more" (a terminal is only so tall).
MAX_PROGRAMS = 20
MAX_WAITING = 10
MAX_DECISIONS = 10
BAR_WIDTH = 20
# --once into a pipe or a file: Rich would assume 80 columns, where the tables' columns
# shrink to a letter or two; COLUMNS, where set, still wins.
PIPE_WIDTH = 160


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", required=True,
                        help="the router's state URL, e.g. http://127.0.0.1:8090/state "
                             "(serve --state-port); /state is added to a bare host:port")
    parser.add_argument("--interval", type=finite_float, default=1.0,
                        help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="print one view and exit (no live screen)")


def fetch_state(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET the router's /state; OSError or ValueError if it cannot be read."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        state = json.loads(response.read())
    if not isinstance(state, dict):
        raise ValueError("the state endpoint did not answer a JSON object")
    return state


# ---- rendering (pure) ---------------------------------------------------------------------
def _bar(fraction: float, pause: float, resume: float) -> Text:
    filled = max(0, min(BAR_WIDTH, round(fraction * BAR_WIDTH)))
    style = "red" if fraction > pause else "yellow" if fraction >= resume else "green"
    bar = Text("█" * filled, style=style)
    bar.append("░" * (BAR_WIDTH - filled), style="dim")
    bar.append(f" {fraction:6.1%}", style=style)
    return bar


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s"
    return f"{value / 60:.1f}m" if value < 3600 else f"{value / 3600:.1f}h"


def _sessionless(held: int | None, reserved: int | None) -> str:
    if not held:
        return "-"
    return f"{held:,} ({reserved or 0:,} off)"


def _ranks(scheduler: dict[str, Any], params: dict[str, Any]) -> Table:
    pause = float(params.get("pause_threshold", 0.95))
    resume = pause - float(params.get("resume_hysteresis", 0.10))
    table = Table(title=f"workers/ranks (pause above {pause:.0%}, resume below {resume:.0%})",
                  title_justify="left", expand=True)
    table.add_column("worker/rank", no_wrap=True)
    for column in ("capacity", "usage"):
        table.add_column(column, justify="right")
    table.add_column("usage / capacity", no_wrap=True, min_width=BAR_WIDTH + 8)
    for column in ("pause at", "resume below", "resident", "paused here", "sessionless"):
        table.add_column(column, justify="right")
    # Whether the pause rule pauses there now, and if not which gate holds it
    # (pressure.RELIEF; "-" from a router that predates it).
    table.add_column("pause rule")
    # Other tenants' requests running on each rank, and what is taken off its capacity for
    # them (sessionless_kv, sessionless_kv_full_loss).
    held = scheduler.get("sessionless_tokens") or {}
    reserved = scheduler.get("sessionless_reserved_tokens") or {}
    # Counted by the router over the whole table (/state lists at most 10,000 programs); from
    # the list where a router predates that count.
    paused_here: dict[str, int] = {}
    for program in scheduler.get("programs", {}).values():
        if program.get("lifecycle") == "paused" and program.get("worker"):
            paused_here[program["worker"]] = paused_here.get(program["worker"], 0) + 1
    for rank, figures in scheduler.get("ranks", {}).items():
        capacity = figures.get("capacity_tokens")
        usage = float(figures.get("usage_tokens") or 0)
        bar: RenderableType = (_bar(usage / capacity, pause, resume) if capacity
                               else Text("no capacity card", style="dim"))
        table.add_row(rank, _tokens(capacity), _tokens(usage), bar,
                      _tokens(None if not capacity else capacity * pause),
                      _tokens(None if not capacity else capacity * resume),
                      str(figures.get("programs", 0)),
                      str(figures.get("paused_programs", paused_here.get(rank, 0))),
                      _sessionless(held.get(rank), reserved.get(rank)),
                      str(figures.get("pausing") or "-").replace("_", " "))
    if not scheduler.get("ranks"):
        table.add_row("(no worker with capacity yet)", "", "", "", "", "", "", "", "", "")
    return table


def _programs(scheduler: dict[str, Any]) -> Table:
    programs = scheduler.get("programs", {})
    # The whole table's counts: /state lists at most 10,000 programs (programs_total).
    total = int(scheduler.get("programs_total", len(programs)))
    paused = scheduler.get("paused")
    if not isinstance(paused, int):
        paused = sum(1 for p in programs.values() if p.get("lifecycle") == "paused")
    table = Table(title=f"programs: {total - paused} resident, {paused} paused",
                  title_justify="left", expand=True)
    # Dynamo's worker ids are 64-bit: the column takes the longest whole.
    widest = max((len(str(p.get("worker") or "")) for p in programs.values()), default=0)
    for column in ("session", "lifecycle", "phase", "worker/rank", "tokens", "steps",
                   "turn", "pauses", "resumes", "moves"):
        table.add_column(column, justify="left" if column in ("session", "lifecycle", "phase",
                                                              "worker/rank", "turn") else "right",
                         min_width=widest if column == "worker/rank" else None,
                         no_wrap=column in ("worker/rank", "turn"))
    # Resident first, then paused; largest first within each.
    ordered = sorted(programs.items(), key=lambda item: (item[1].get("lifecycle") != "active",
                                                         -int(item[1].get("tokens") or 0)))
    for session, program in ordered[:MAX_PROGRAMS]:
        paused = program.get("lifecycle") == "paused"
        turn = "-"
        if program.get("in_flight"):
            turn = "waits for room" if paused else "in flight"
        if program.get("waiting"):
            turn += f" +{program['waiting']} queued"
        if program.get("marked_for_pause"):
            turn += " (marked)"
        table.add_row(session, Text(str(program.get("lifecycle")),
                                    style="yellow" if paused else "green"),
                      str(program.get("phase")), str(program.get("worker") or "-"),
                      _tokens(program.get("tokens")), str(program.get("steps", 0)), turn,
                      str(program.get("pauses", 0)), str(program.get("resumes", 0)),
                      str(program.get("moves", 0)))
    if len(ordered) > MAX_PROGRAMS:
        table.add_row(f"... and {len(ordered) - MAX_PROGRAMS} more", *[""] * 9)
    return table


def _waiting(scheduler: dict[str, Any]) -> Table:
    waiting = scheduler.get("deferred", [])
    table = Table(title=f"waiting for room: {len(waiting)}", title_justify="left", expand=True)
    for column in ("session", "waited", "tokens", "phase", "last worker/rank"):
        table.add_column(column, justify="right" if column in ("waited", "tokens") else "left")
    for turn in waiting[:MAX_WAITING]:
        table.add_row(turn.get("session_id", "?"), _seconds(float(turn.get("waited_seconds", 0))),
                      _tokens(turn.get("tokens")), str(turn.get("phase", "")),
                      str(turn.get("worker") or "-"))
    if len(waiting) > MAX_WAITING:
        table.add_row(f"... and {len(waiting) - MAX_WAITING} more", "", "", "", "")
    return table


def _decisions(state: dict[str, Any], now: float) -> Table:
    recent = list((state.get("lifecycle") or {}).get("recent_decisions", []))
    table = Table(title="recent decisions", title_justify="left", expand=True)
    for column in ("ago", "decision", "session", "worker/rank", "why"):
        table.add_column(column, justify="right" if column == "ago" else "left")
    styles = {"paused": "yellow", "marked": "yellow", "resuming": "green", "ended": "cyan",
              "expired": "magenta"}
    for decision in reversed(recent[-MAX_DECISIONS:]):
        kind = str(decision.get("decision"))
        table.add_row(_seconds(max(0.0, now - float(decision.get("at", now)))),
                      Text(kind, style=styles.get(kind, "")), str(decision.get("session_id")),
                      str(decision.get("worker") or "-"), str(decision.get("reason", "")))
    if not recent:
        table.add_row("", "(none yet)", "", "", "")
    return table


def _summary(state: dict[str, Any], url: str) -> Text:
    scheduler = state.get("scheduler", {})
    counters = scheduler.get("counters", {})
    router = state.get("router", {})
    policy = state.get("policy") or {}
    line = Text(f"{url}  ", style="bold")
    line.append(f"policy {policy.get('source', '?')}")
    reloads = policy.get("reloads")
    if reloads:
        line.append(f" (reloads ok {reloads.get('ok', 0)}, invalid {reloads.get('invalid', 0)}, "
                    f"needs restart {reloads.get('needs_restart', 0)})")
    selector = (policy.get("worker_selection") or {}).get("aggregated")
    if selector:
        settings = ", ".join(f"{key} {value}" for key, value
                             in (selector.get("parameters") or {}).items() if value is not None)
        line.append(f"  selector {selector.get('type', '?')}"
                    f"{f' ({settings})' if settings else ''}")
    line.append("\n")
    p99 = router.get("admission_wait_p99_s")
    line.append(
        f"requests {router.get('requests', 0)} (session-finals "
        f"{router.get('session_final', 0)}, passed through {router.get('passthrough', 0)}, "
        f"rejected {router.get('rejected', 0)})  completed {router.get('completed', 0)}  "
        f"in flight {state.get('in_flight', 0)}  waiting {router.get('admission_waiting', 0)}  "
        f"admission wait p99 {'-' if p99 is None else _seconds(float(p99))}  "
        f"pauses {counters.get('pauses', 0)} ({counters.get('aging_pauses', 0)} aging, "
        f"+{counters.get('idle_pauses', 0)} idle)  "
        f"resumes {counters.get('resumes', 0)} (forced {counters.get('forced_resumes', 0)}, "
        f"let in while evicting {counters.get('released_evicting', 0)})  "
        f"moves {counters.get('moves', 0)}  yields {counters.get('yields', 0)}  "
        f"expired {counters.get('expired', 0)}")
    return line


def render(state: dict[str, Any] | None, *, url: str, now: float,
           error: str | None = None) -> RenderableType:
    """One screen of ``top`` for ``state`` (the router's /state) read at ``now`` (Unix time).

    With ``error`` (the last read failed), the last state is shown under a red line that
    says why; with no state at all, only that line.
    """
    parts: list[RenderableType] = []
    if error is not None:
        parts.append(Panel(Text(f"cannot read {url}: {error}", style="bold red")))
    if state is None:
        return Group(*parts) if parts else Text(f"waiting for {url}")
    scheduler = state.get("scheduler", {})
    params = scheduler.get("parameters", {})
    parts += [_summary(state, url), _ranks(scheduler, params), _programs(scheduler),
              _waiting(scheduler), _decisions(state, now)]
    return Group(*parts)


# ---- the loop -----------------------------------------------------------------------------
def run_top(args: argparse.Namespace) -> int:
    try:
        url = state_url(args.state)
    except ValueError as bad:
        raise SystemExit(f"error: {bad}") from None
    if args.interval <= 0:
        raise SystemExit("error: --interval must be > 0")
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    console = Console(width=PIPE_WIDTH) if piped else Console()
    state: dict[str, Any] | None = None
    error: str | None = None

    def read(retry: str = "") -> None:
        nonlocal state, error
        try:
            state, error = fetch_state(url), None
        except (OSError, ValueError, http.client.HTTPException) as failure:
            error = _reason(failure) + retry

    if args.once:
        read()
        console.print(render(state, url=url, now=time.time(), error=error))
        return 0 if error is None else 1
    try:
        with Live(render(None, url=url, now=time.time()), console=console, screen=True,
                  auto_refresh=False) as live:
            while True:
                read(f"; retrying every {args.interval:g}s")
                live.update(render(state, url=url, now=time.time(), error=error), refresh=True)
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0


def _reason(failure: Exception) -> str:
    if isinstance(failure, urllib.error.URLError) and not isinstance(
            failure, urllib.error.HTTPError):
        return str(failure.reason)
    return str(failure)
