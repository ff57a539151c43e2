"""``bench live``: watching one run of an arm (the shell beside the pure report).

An :class:`Observer` reads the logs an arm's processes wrote during the run and, where the
stack serves one, polls our router's ``/state`` on a thread for the paused count; the
figures are then computed by the arm (:meth:`~dynamo_thunderagent.stack.arms.Arm.figures`)
and the pure functions of :mod:`~dynamo_thunderagent.bench.live_report`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dynamo_thunderagent.bench.live_report import EMPTY_FIGURES, time_weighted
from dynamo_thunderagent.bench.runner import get_json
from dynamo_thunderagent.stack.arms import Arm

if TYPE_CHECKING:
    from dynamo_thunderagent.bench.records import RunResult
    from dynamo_thunderagent.stack.launcher import LocalStack


class Observer:
    """Collects an arm's scheduler figures: what :meth:`Arm.figures` reads, over one run.

    It is the arm's :class:`~dynamo_thunderagent.stack.arms.ObservedRun`: the logs written
    since :meth:`start`, our router's ``/state`` (polled for the paused count while the run
    lasts, when the stack serves one), and time-weighted means over the steady window
    ``window = (warmup_s, window_s)`` relative to the run's start, cut at the run's end when
    it ended sooner (a rollout's batch). Figures an arm cannot measure stay None
    (:data:`EMPTY_FIGURES`).
    """

    def __init__(self, arm: Arm, window: tuple[float, float], poll_s: float = 1.0) -> None:
        self.arm = arm
        self.window = window
        self.poll_s = poll_s
        self.t0 = 0.0
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_offsets: dict[str, int] = {}
        self._stack: LocalStack | None = None
        self._ended: float | None = None  # the run's length, once it is over

    def start(self, stack: LocalStack) -> None:
        self.t0 = time.time()
        self._stack = stack
        for proc in stack.processes:
            with contextlib.suppress(OSError):
                self._log_offsets[proc.name] = proc.log_path.stat().st_size
        if stack.state_url is not None:
            url = stack.state_url
            self._thread = threading.Thread(target=self._poll, args=(url,), daemon=True)
            self._thread.start()

    def _poll(self, url: str) -> None:
        while not self._stop.is_set():
            state = get_json(url, timeout=2.0)
            if state is not None:
                paused = (state.get("scheduler") or {}).get("paused")
                if isinstance(paused, int):
                    self.samples.append((time.time(), float(paused)))
            self._stop.wait(self.poll_s)

    # ----- ObservedRun ---------------------------------------------------------------------

    def log(self, role: str) -> str:
        for proc in self._stack.processes if self._stack is not None else ():
            if proc.role == role:
                with contextlib.suppress(OSError), proc.log_path.open("rb") as fh:
                    fh.seek(self._log_offsets.get(proc.name, 0))
                    return fh.read().decode("utf-8", errors="replace")
        return ""

    def state(self) -> dict[str, Any] | None:
        url = self._stack.state_url if self._stack is not None else None
        return get_json(url) if url else None

    def state_samples(self) -> Sequence[tuple[float, float]]:
        return self.samples

    def paused(self, samples: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
        lo, hi = self.window
        if self._ended is not None:
            hi = min(hi, self._ended)
        return time_weighted(samples, self.t0 + lo, self.t0 + hi)

    def finish(self, stack: LocalStack, run: RunResult) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
        self._stack = stack
        self._ended = run.elapsed_s
        figures = dict(EMPTY_FIGURES)
        figures.update(self.arm.figures(self))
        return figures
