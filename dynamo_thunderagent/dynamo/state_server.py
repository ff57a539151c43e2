"""The router's loopback HTTP endpoint: GET /state, /health and /metrics.

Served by the standard library's ``http.server`` on a thread of its own, so that a slow or
stuck client never holds up the event loop that routes requests. What a response shows is
read *on* the event loop (:func:`on_loop`): the scheduler and the router are only ever
touched from there, so a response is one consistent moment, never a table half-way
through a change.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from prometheus_client.exposition import CONTENT_TYPE_LATEST

T = TypeVar("T")

# How long a response may wait for the event loop before it answers 503.
LOOP_TIMEOUT_SECONDS = 5.0
# How long a connection may send nothing (or take no bytes of its answer) before it is
# closed: each open connection holds a thread, and a client that never finishes its request
# would hold one for ever.
CLIENT_IDLE_SECONDS = 10.0


def on_loop(loop: asyncio.AbstractEventLoop, read: Callable[[], T],
            timeout: float = LOOP_TIMEOUT_SECONDS) -> T:
    """``read()`` run on ``loop`` (directly when already on its thread); TimeoutError if the
    loop does not get to it within ``timeout`` seconds."""
    if _on_loop_thread(loop):
        return read()

    async def call() -> T:
        return read()

    future = asyncio.run_coroutine_threadsafe(call(), loop)
    try:
        return future.result(timeout)
    except FutureTimeout:
        future.cancel()
        raise TimeoutError(f"the router's event loop did not answer within {timeout} s") from None


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class StateServer:
    """GET /state (``state()`` as JSON), /health and /metrics (``metrics()``) on host:port."""

    def __init__(self, loop: asyncio.AbstractEventLoop, state: Callable[[], dict[str, Any]],
                 metrics: Callable[[], bytes] | None, host: str, port: int) -> None:
        self.loop = loop
        self.state = state
        self.metrics = metrics
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="thunderagent-state", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> StateServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, so only if it runs
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()

    def respond(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for GET ``path``."""
        route = path.split("?", 1)[0].rstrip("/") or "/"
        json_type = "application/json"
        try:
            if route == "/state":
                return 200, json_type, json.dumps(on_loop(self.loop, self.state)).encode()
            if route == "/metrics" and self.metrics is not None:
                return 200, CONTENT_TYPE_LATEST, on_loop(self.loop, self.metrics)
        except TimeoutError as error:
            return 503, json_type, json.dumps({"error": str(error)}).encode()
        if route == "/health":
            return 200, json_type, b'{"status": "ok"}'
        routes = "/state, /health" + (", /metrics" if self.metrics is not None else "")
        return 404, json_type, json.dumps({"error": f"not found; try {routes}"}).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # A connection that sends nothing for this long is closed: each holds a thread.
            timeout = CLIENT_IDLE_SECONDS

            def do_GET(self) -> None:
                status, content_type, body = server.respond(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would flood the router's log

        return Handler
