"""Readiness: the probes that say a stack (or one of its processes) is up, and the wait loop.

Each probe answers one question from outside the processes (a port, an HTTP document, the
registered model cards, a log line) and never raises for a service that is not up yet.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo_thunderagent.stack.topology import LOOPBACK, WORKER_COMPONENT


@dataclass(frozen=True)
class Readiness:
    """One condition to wait for: ``check()`` is true once it holds; ``what`` names it in a
    timeout message."""

    check: Callable[[], bool]
    what: str


def http_get(url: str, timeout: float = 2.0) -> bytes | None:
    """The body of ``GET url``, or None if it could not be fetched."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def port_open(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((LOOPBACK, port)) == 0


def model_listed(api_url: str, model_name: str) -> bool:
    """The frontend's ``/models`` lists ``model_name``."""
    body = http_get(f"{api_url}/models")
    if body is None:
        return False
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        return any(m.get("id") == model_name for m in data.get("data", []))
    return False


def router_sees_workers(state_url: str, want: int) -> bool:
    """Our router's ``/state`` lists ``want`` workers, live or prefill-only, and, if its
    classifier reports ranks, knows the capacity of each live one."""
    body = http_get(state_url)
    if body is None:
        return False
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        state = json.loads(body)
        ranks = (state.get("scheduler") or {}).get("ranks")
        known = want if ranks is None else sum(
            1 for rank in ranks.values() if rank.get("capacity_tokens"))
        prefill = len(state.get("prefill_only_workers") or [])  # never the router's target
        return (len(state.get("live_workers") or []) + prefill >= want
                and known + prefill >= want)
    return False


def log_contains(path: Path, line: str) -> bool:
    """``line`` occurs in the log at ``path``."""
    return line in path.read_text(errors="replace")


def worker_instances(
    cards: Iterable[Mapping[str, Any]],
    worker_namespace: str,
    index_by_port: Mapping[int | None, int],
) -> dict[int, int]:
    """Live worker instance ids keyed by worker index, from the registered model cards
    (:func:`~dynamo_thunderagent.stack.discovery.model_cards`).

    The match goes through each worker's system port (``index_by_port``), which its model
    card embeds in the URLs it serves its tokenizer files from.
    """
    found: dict[int, int] = {}
    for card in cards:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if (card.get("namespace"), card.get("component")) != (
                worker_namespace,
                WORKER_COMPONENT,
            ):
                continue
            text = json.dumps(card.get("card_json", {}))
            for port, index in index_by_port.items():
                if f"{LOOPBACK}:{port}/" in text:
                    found[index] = int(card["instance_id"])
    return found


def wait_for(
    ready: Readiness,
    deadline: float,
    *,
    still_running: Callable[[], None],
    timed_out: Callable[[str], BaseException],
) -> None:
    """Poll ``ready`` every 0.2 s until it holds.

    ``still_running`` raises if a process has died (checked before every poll, so a crash is
    reported at once rather than at the deadline); past ``deadline`` (monotonic time) the
    error ``timed_out(ready.what)`` is raised. An OSError from a probe counts as not ready.
    """
    while True:
        still_running()
        with contextlib.suppress(OSError):
            if ready.check():
                return
        if time.monotonic() > deadline:
            raise timed_out(ready.what)
        time.sleep(0.2)
