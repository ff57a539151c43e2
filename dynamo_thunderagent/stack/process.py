"""Supervision: the stack's child processes, their ports, logs and process groups.

Each process runs in its own process group (it leads its own session), so signalling the
group reaches exactly that process and whatever it spawned, and nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dynamo_thunderagent.stack.topology import LOOPBACK, http_url

# "discovery": the etcd and NATS servers of a stack with etcd discovery.
Role = Literal["discovery", "broker", "worker", "router", "frontend"]

_PR_SET_PDEATHSIG = 1
# DYN_SYSTEM_PORT must fit an i16 in Dynamo 1.6.1.
SYSTEM_PORT_RANGE = (20000, 32767)
# Where the stack's other ports come from (below the OS's ephemeral range: ``free_port``).
PORT_RANGE = (10000, 32767)


class StackError(RuntimeError):
    """The stack failed to start or a process died; the message carries the log tails."""


@dataclass
class StackProcess:
    """One child process of the stack."""

    name: str
    role: Role
    argv: list[str]
    log_path: Path
    system_port: int | None
    popen: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def metrics_url(self) -> str | None:
        """Prometheus endpoint of the process's Dynamo system server, if it has one."""
        if self.system_port is None:
            return None
        return http_url(self.system_port, "/metrics")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system, every thread) the process has used so far; None where
        ``/proc`` cannot tell (not Linux, or the process is gone)."""
        return process_cpu_seconds(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) from ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat.rpartition(")")[2].split()
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


# A port handed to a process is free until that process binds it, which can take seconds: a
# probe bind cannot tell it from a free one, so the next pick could hand out the same port (a
# stack picks all its processes' ports before they start; with random picks the chance of two
# alike is small per stack and not small per test suite). Remember the recent picks and skip
# them.
_PICK_TRIES = 200
_RECENT_PICKS: deque[int] = deque(maxlen=512)
_PICKS_LOCK = threading.Lock()


def _claim(port: int) -> bool:
    """Record ``port`` as handed out; False when it was handed out lately."""
    with _PICKS_LOCK:
        if port in _RECENT_PICKS:
            return False
        _RECENT_PICKS.append(port)
        return True


def ephemeral_low() -> int:
    """The lowest port the OS hands out to a bind to port 0 (Linux's setting; its default
    where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the OS's ephemeral range (where it has
    room: ``PORT_RANGE``) and not handed out lately.

    Below that range because the Dynamo processes bind their own servers to port 0: the OS
    hands those out of the ephemeral range, and one could be a port picked here for a process
    that has not bound it yet (a router's state port once went to a worker's request-plane
    server, and the router could not start). Without room below it, the OS picks."""
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], ephemeral_low() - 1)
    if high - low >= 1_000:
        return _pick(_random_free(low, high), f"no free port in {low}-{high}")

    def os_pick() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            return int(sock.getsockname()[1])

    return _pick(os_pick, "the OS kept handing out ports that were handed out lately")


def free_system_port() -> int:
    """A free port for ``DYN_SYSTEM_PORT``, which Dynamo 1.6.1 parses as an i16 (<= 32767).

    The OS hands out ephemeral ports above that, so pick at random below the ephemeral range
    and keep the first one that binds and was not handed out lately.
    """
    low, high = SYSTEM_PORT_RANGE
    return _pick(_random_free(low, high),
                 f"no free port in {SYSTEM_PORT_RANGE} for DYN_SYSTEM_PORT")


def _random_free(low: int, high: int) -> Callable[[], int | None]:
    """A picker: a random port in ``low..high`` that binds on 127.0.0.1 now, else None."""
    rng = random.SystemRandom()

    def random_pick() -> int | None:
        port = rng.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                return None
        return port

    return random_pick


def _pick(candidate: Callable[[], int | None], failure: str) -> int:
    """The first port ``candidate`` finds free (None: it found none) that was not handed
    out lately, within _PICK_TRIES tries; StackError(``failure``) if none."""
    for _ in range(_PICK_TRIES):
        port = candidate()
        if port is not None and _claim(port):
            return port
    raise StackError(failure)


def _die_with_parent() -> None:
    """Child-side: get SIGTERM if the parent dies, so a killed test leaves no orphans (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def log_path(run_dir: Path, name: str) -> Path:
    """Where the process called ``name`` logs (stdout and stderr together)."""
    return run_dir / "logs" / f"{name}.log"


def spawn(
    name: str,
    role: Role,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    run_dir: Path,
    system_port: int | None,
) -> StackProcess:
    """Start one process in its own session, logging to ``<run_dir>/logs/<name>.log``.

    The log is appended to (a restarted process continues its predecessor's log) and starts
    with the command line.
    """
    path = log_path(run_dir, name)
    proc_env = dict(env)
    if system_port is not None:
        proc_env["DYN_SYSTEM_PORT"] = str(system_port)
    with path.open("ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=proc_env,
            cwd=str(run_dir),
            start_new_session=True,  # own process group: stop() signals exactly this group
            preexec_fn=_die_with_parent,
        )
    return StackProcess(name, role, list(argv), path, system_port, popen)


def signal_group(proc: StackProcess, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``proc`` leads; a group already gone is no error."""
    # The child leads its own session, so its pgid equals its pid; signal nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def end(proc: StackProcess, sig: signal.Signals, grace_s: float) -> None:
    """Signal one process group, then SIGKILL what is left after ``grace_s``."""
    signal_group(proc, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(timeout=grace_s)
    signal_group(proc, signal.SIGKILL)
    proc.popen.wait(timeout=5.0)


def stop_all(procs: Sequence[StackProcess], grace_s: float) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for all, then SIGKILL what is left.

    Signalled in the given order; the final SIGKILL also catches grandchildren left in a
    group after its leader exited.
    """
    for proc in procs:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        remaining = max(0.0, deadline - time.monotonic())
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=remaining)
    for proc in procs:
        signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5.0)
