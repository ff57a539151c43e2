"""What the router counts, and the loopback HTTP server that shows it.

The counters add up: every request the router receives ends in exactly one of
passthrough, completed, aborted, rejected, session_final, cancelled or orphans
(docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dynamo_thunderagent.quantile import percentile

# Bounded per-request samples kept for the state endpoint (benchmarks read them).
SAMPLE_LIMIT = 20_000


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
    prompt_tokens: int = 0
    cached_tokens: int = 0
    admission_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLE_LIMIT))
    # Turns waiting for admission now, by ticket: when each started. A wait cut off by the
    # end of a run is not lost from the figures: it is reported as censored (a lower bound).
    waiting: dict[int, float] = field(default_factory=dict)

    def as_dict(self, now: float) -> dict[str, Any]:
        waits = list(self.admission_wait_s)
        oldest = min(self.waiting.values(), default=None)
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
            "admission_wait_censored_max_s": None if oldest is None else now - oldest,
        }


async def serve_state(state: Callable[[], dict[str, Any]], host: str,
                      port: int) -> asyncio.AbstractServer:
    """A tiny loopback HTTP server: GET /state (``state()`` as JSON) and GET /health."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path.startswith("/state"):
                status, body = "200 OK", json.dumps(state()).encode()
            elif path.startswith("/health"):
                status, body = "200 OK", b'{"status": "ok"}'
            else:
                status, body = "404 Not Found", b'{"error": "try /state or /health"}'
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
