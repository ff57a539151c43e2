"""A harness that keeps a pool of tool sandboxes, driven by the router's lifecycle events.

ThunderAgent's second half manages the tools around the model: an agent's sandbox is
reclaimed when its program ends and prepared before its program resumes. The router
decides those moments (``dynamo-thunderagent serve --events-port PORT``); this harness
subscribes to them and acts on a pool of sandboxes. A sandbox here is a plain
subprocess (``sleep``), standing in for a container or a VM:

* ``resuming`` (about to run on worker/rank W): prepare the program's sandbox: wake it
  if it was parked, else hand it a warm spare (and start a new spare);
* ``paused``: park its sandbox (SIGSTOP: it keeps its state, uses no CPU);
* ``ended`` / ``expired``: reclaim it (terminate) and top the spares up.

A real harness also gives a program a sandbox when the agent starts (``acquire``); one
driven by events alone, as here, learns of a program at its first pause or resume.

    python examples/sandbox_pool/harness.py --events tcp://127.0.0.1:5557 --spares 2

Ctrl-C (or SIGTERM) stops it, reclaims every sandbox and, with ``--summary PATH``,
writes what it received and did as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dynamo_thunderagent.events import LifecycleEvent, Subscriber

SANDBOX_COMMAND = ("sleep", "86400")


@dataclass
class Sandbox:
    process: subprocess.Popen[bytes]
    parked: bool = False
    worker: str | None = None  # where its program runs (worker_id/dp_rank)


@dataclass
class SandboxPool:
    """Sandboxes by program (session id), plus warm spares ready to hand out."""

    spares: int = 2
    command: tuple[str, ...] = SANDBOX_COMMAND
    by_program: dict[str, Sandbox] = field(default_factory=dict)
    warm: list[subprocess.Popen[bytes]] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)

    def start(self) -> None:
        self._top_up()

    def _top_up(self) -> None:
        while len(self.warm) < self.spares:
            self.warm.append(subprocess.Popen(self.command, stdin=subprocess.DEVNULL))

    def acquire(self, session_id: str) -> Sandbox:
        """The program's sandbox, a warm spare if it has none yet."""
        sandbox = self.by_program.get(session_id)
        if sandbox is None:
            self._top_up()
            sandbox = self.by_program[session_id] = Sandbox(self.warm.pop(0))
            self._top_up()
            self.actions["acquired"] += 1
        return sandbox

    def handle(self, event: LifecycleEvent) -> str:
        """Act on one lifecycle event; what was done, in a word."""
        if event.event == "resuming":
            sandbox = self.acquire(event.session_id)
            if sandbox.parked:
                sandbox.process.send_signal(signal.SIGCONT)
                sandbox.parked = False
            sandbox.worker = None if event.worker_id is None else (
                f"{event.worker_id}/{event.dp_rank or 0}")
            action = "prepared"
        elif event.event == "paused":
            sandbox_or_none = self.by_program.get(event.session_id)
            if sandbox_or_none is None:
                action = "nothing to park"  # paused before it ever ran here
            else:
                sandbox_or_none.process.send_signal(signal.SIGSTOP)
                sandbox_or_none.parked = True
                action = "parked"
        else:  # ended, expired
            action = "reclaimed" if self.reclaim(event.session_id) else "nothing to reclaim"
        self.actions[action] += 1
        return action

    def reclaim(self, session_id: str) -> bool:
        sandbox = self.by_program.pop(session_id, None)
        if sandbox is None:
            return False
        _end(sandbox.process)
        self._top_up()
        return True

    def close(self) -> None:
        for session_id in list(self.by_program):
            self.reclaim(session_id)
        for process in self.warm:
            _end(process)
        self.warm.clear()


def _end(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGCONT)  # a stopped process handles SIGTERM only when woken
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", required=True,
                        help="the router's lifecycle events, e.g. tcp://127.0.0.1:5557")
    parser.add_argument("--spares", type=int, default=2, help="warm sandboxes kept ready")
    parser.add_argument("--summary", help="write what was received and done here (JSON)")
    args = parser.parse_args(argv)

    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    pool = SandboxPool(spares=args.spares)
    received: list[dict[str, Any]] = []
    pool.start()
    try:
        with Subscriber(args.events) as events:
            print(f"harness: listening on {args.events}", flush=True)
            while not stopping:
                event = events.receive(timeout=0.2)
                if event is None:
                    continue
                action = pool.handle(event)
                received.append({"seq": event.seq, "event": event.event,
                                 "session_id": event.session_id, "action": action})
                print(f"harness: {event.event} {event.session_id} "
                      f"worker={event.worker_id}/{event.dp_rank} -> {action}", flush=True)
    finally:
        pool.close()
        if args.summary:
            with open(args.summary, "w", encoding="utf-8") as handle:
                json.dump({"received": received, "actions": dict(pool.actions)}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
