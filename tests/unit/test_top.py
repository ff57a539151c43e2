"""`dynamo-thunderagent top`: what the view shows for a router's /state, and the live view
itself under tmux, against a canned state served by a local HTTP server."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from rich.console import Console

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.dynamo.notify import LifecycleNotifier, table_worker_of
from dynamo_thunderagent.dynamo.stats import RouterStats
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.scheduler import Scheduler
from dynamo_thunderagent.top import render, run_top
from dynamo_thunderagent.urls import state_url

from .conftest import loopback_server

W0, W1 = WorkerKey(7587, 0), WorkerKey(7588, 0)
NOW = 1000.0


def canned_state(now: float = NOW) -> dict[str, Any]:
    """A /state as the router builds it at ``now`` (Unix time): a scheduler with resident,
    paused and waiting programs on two ranks, and the decisions that led there."""
    scheduler = Scheduler(ThunderAgentParameters(buffer_per_program=0, pause_threshold=0.9,
                                                 pause_target=0.8))
    notifier = LifecycleNotifier(table_worker_of(scheduler.table.programs), clock=lambda: now)
    cards = {W0: CapacityCard(1_000, 1), W1: CapacityCard(1_000, 1)}
    notifier(scheduler.set_workers(frozenset({W0.worker_id, W1.worker_id}), cards))
    for index, (session, tokens) in enumerate([("agent-a", 700), ("agent-b", 500),
                                               ("agent-c", 300)]):
        rid = f"r{index}"
        notifier(scheduler.submit(rid, session, tokens, now - 30))
        scheduler.completed(rid, tokens, now - 20)
    notifier(scheduler.submit("r9", "agent-d", 800, now - 12.5))  # no room: waits
    notifier(scheduler.tick(now))
    return {
        "scheduler": {**scheduler.snapshot(now), "deferred_requests": 1},
        "router": RouterStats(requests=5, completed=3).as_dict(now),
        "in_flight": 0, "live_workers": [W0.worker_id, W1.worker_id],
        "policy": {"source": "policies/thunderagent-extended.yaml",
                   "reloads": {"ok": 2, "invalid": 1, "needs_restart": 0}, "last_reload": None,
                   "worker_selection": {"aggregated": {
                       "instance": "ta", "type": "thunderagent",
                       "parameters": {"preferred_load_slack": 1.0}}}},
        "lifecycle": notifier.state(),
    }


def test_the_view_shows_ranks_against_thresholds_programs_waits_and_decisions() -> None:
    state = canned_state()
    console = Console(record=True, width=200, color_system=None)
    console.print(render(state, url="http://127.0.0.1:8090/state", now=NOW + 2))
    screen = console.export_text()
    assert "pause above 90%, resume below 80%" in screen
    assert "7587/0" in screen and "1,000" in screen and "900" in screen  # capacity, pause at
    assert "reloads ok 2, invalid 1" in screen
    # What the requests were, so that requests and completed turns add up.
    assert "requests 5 (session-finals 0, passed through 0, rejected 0)  completed 3" in screen
    assert "selector thunderagent (preferred_load_slack 1.0)" in screen
    assert "(forced 0, let in while evicting 0)" in screen  # hold_max_cache_loss's counter
    assert "(0 aging, +0 idle)" in screen  # aging_makes_room's pauses are among the pauses
    assert "agent-d" in screen and "12.5s" in screen  # the waiting turn and its wait
    assert "waits for room" in screen
    assert "programs: 3 resident, 1 paused" in screen
    assert "recent decisions" in screen and "paused" in screen and "no room" in screen
    assert "pause rule" in screen and "under threshold" in screen  # each rank's verdict


def test_the_counts_are_the_whole_tables_when_state_lists_only_part_of_it() -> None:
    from dynamo_thunderagent.dynamo.stats import bounded_state

    state = canned_state()
    state["scheduler"] = bounded_state(state["scheduler"], limit=1)  # as past 10,000 programs
    assert len(state["scheduler"]["programs"]) == 1
    # Paused programs that last ran on a rank, counted by the router over the whole table.
    state["scheduler"]["ranks"][str(W1)]["paused_programs"] = 4_321
    console = Console(record=True, width=200, color_system=None)
    console.print(render(state, url="http://127.0.0.1:8090/state", now=NOW + 2))
    screen = console.export_text()
    assert "programs: 3 resident, 1 paused" in screen
    assert "4321" in screen


def test_state_counts_the_programs_paused_off_each_rank() -> None:
    from .conftest import W0 as HOME
    from .conftest import make

    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9)
    h.workers({HOME: 2_000})
    h.acting_on("small", HOME, 600)
    h.acting_on("big", HOME, 1_200)
    h.workers({HOME: 1_500})  # over the threshold: the smaller program gives way
    assert h.tick().paused == ["small"]
    rank = h.scheduler.snapshot(h.now)["ranks"][str(HOME)]
    assert (rank["programs"], rank["paused_programs"]) == (1, 1)


def test_the_view_shows_what_requests_without_a_session_id_hold_on_each_rank() -> None:
    scheduler = Scheduler(ThunderAgentParameters(sessionless_kv="reserve",
                                                 sessionless_kv_full_loss=0.1))
    scheduler.set_workers(frozenset({W0.worker_id, W1.worker_id}),
                          {W0: CapacityCard(10_000, 1), W1: CapacityCard(10_000, 1)})
    scheduler.cache_loss.observe(W1, 1_000, 980)  # W1's engine lost 2%: a fifth is taken off
    scheduler.sessionless_started("chat-1", W0, 1_234, NOW)
    scheduler.sessionless_started("chat-2", W1, 4_321, NOW)
    state = {**canned_state(), "scheduler": scheduler.snapshot(NOW)}
    console = Console(record=True, width=200, color_system=None)
    console.print(render(state, url="http://127.0.0.1:8090/state", now=NOW))
    screen = console.export_text()
    assert "sessionless" in screen
    assert "1,234 (1,234 off)" in screen  # no loss measured on W0 yet: all of it
    assert "4,321 (864 off)" in screen


def test_an_unreachable_router_is_said_and_the_last_state_kept() -> None:
    console = Console(record=True, width=160, color_system=None)
    console.print(render(canned_state(), url="u", now=NOW, error="Connection refused"))
    screen = console.export_text()
    assert "cannot read u: Connection refused" in screen and "agent-a" in screen


def test_a_bare_host_and_port_is_a_state_url() -> None:
    assert state_url("127.0.0.1:8090") == "http://127.0.0.1:8090/state"
    assert state_url("http://h:1/state") == "http://h:1/state"


@pytest.mark.parametrize(("given", "why"), [
    ("localhost:abc", "Port could not be cast"), ("http://[::1", "Invalid IPv6 URL"),
    ("ftp://h:1", "it needs http(s)://HOST[:PORT]"), (":8090", "it needs http(s)://HOST"),
    ("http://a b:80", "it holds spaces or control characters"),
])
def test_a_state_url_that_is_not_one_is_a_bad_argument(given: str, why: str) -> None:
    # Before: a traceback (http.client.InvalidURL, ValueError) from the first read.
    with pytest.raises(SystemExit, match=f"error: --state '{re.escape(given)}' is not a "
                                         f"URL: .*{re.escape(why)}"):
        run_top(argparse.Namespace(state=given, interval=1.0, once=True))


def test_once_into_a_pipe_prints_tables_wide_enough_to_read(
        state_server: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: 80 columns, headers cut to "se…", "li…".
    monkeypatch.delenv("COLUMNS", raising=False)
    assert run_top(argparse.Namespace(state=state_server, interval=1.0, once=True)) == 0
    screen = capsys.readouterr().out
    for header in ("session", "lifecycle", "phase", "sessionless", "paused here", "pause rule"):
        assert header in screen


# ---- the live view, in a real terminal (tmux) --------------------------------------------
@pytest.fixture
def state_server() -> Iterator[str]:
    body = json.dumps(canned_state(time.time())).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with loopback_server(Handler) as url:
        yield f"{url}/state"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_top_draws_the_live_view_in_a_terminal(state_server: str) -> None:
    session = f"dta-top-{uuid.uuid4().hex[:8]}"
    # COLUMNS/LINES from the test's environment would override the terminal's size.
    command = (f"env -u COLUMNS -u LINES {sys.executable} -m dynamo_thunderagent top "
               f"--state {state_server} --interval 0.5")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50",
                    command], check=True)
    try:
        deadline = time.monotonic() + 60
        screen = ""
        while time.monotonic() < deadline:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True, check=True).stdout
            if "recent decisions" in screen:
                break
            time.sleep(0.2)
        assert "workers/ranks (pause above 90%, resume below 80%)" in screen, screen
        assert "7588/0" in screen and "agent-d" in screen and "waiting for room: 1" in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
