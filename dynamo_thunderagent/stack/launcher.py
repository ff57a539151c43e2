"""Start a loopback-only Dynamo 1.6.1 stack: mocker workers, a frontend and, per arm, a router.

The arms are the systems a benchmark compares:

* ``stock``: the frontend's KV router with soft session affinity (request-level baseline).
* ``builtin``: the frontend's KV router plus Dynamo's Rust ThunderAgent, enabled by a
  router-policy YAML (``--router-policy-config``).
* ``dynamo-python``: Dynamo's experimental ``python -m dynamo.thunderagent_router`` component
  between the frontend and the workers.
* ``ours``: our router component (``dynamo-thunderagent serve``), or ``router_cmd``.

Topology of the two router arms. A router component becomes the frontend's handler for the
model by calling ``register_model`` on its own endpoint. The mocker workers also register the
model, and the frontend would happily spread requests over *both* worker sets, letting clients
bypass the router. So the workers live in a separate namespace, ``<ns>-workers``, and the
frontend is scoped with ``--namespace <ns>`` (exact match) so that it only sees the router.
Namespace ``dynamo`` is the default and cannot be used for scoping: a frontend started with
``--namespace dynamo`` still discovers every namespace.

Everything binds 127.0.0.1: the HTTP servers via flags, the request plane and system servers
via ``DYN_*_HOST`` variables, and the event plane through a loopback ZMQ broker (see
``zmq_broker``), because direct-mode ZMQ publishers bind the wildcard address.

Each process runs in its own process group; ``stop()`` signals exactly those groups.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from dynamo_thunderagent.policy_files import EXTENDED_POLICY
from dynamo_thunderagent.stack.tiny_model import MODEL_NAME, build_tiny_model
from dynamo_thunderagent.stack.zmq_broker import broker_url

Arm = Literal["stock", "builtin", "dynamo-python", "ours"]
ARMS: tuple[str, ...] = get_args(Arm)

LOOPBACK = "127.0.0.1"

# Dynamo's Rust ThunderAgent: a request classifier plus a worker-selection instance of the same
# type. Both halves are needed; the selection block must name its instance.
BUILTIN_POLICY_YAML = """\
request_classifier:
  type: thunderagent
worker_selection:
  instances:
    - name: ta
      type: thunderagent
  aggregated: ta
"""
BUILTIN_ADMISSION_LOG_LINE = "ThunderAgent admission enabled"

# Namespaces of the router arms (see module docstring).
ROUTER_NAMESPACE = {"dynamo-python": "tapy", "ours": "ta"}
WORKER_NAMESPACE_SUFFIX = "workers"
DEFAULT_NAMESPACE = "dynamo"
WORKER_COMPONENT = "backend"
WORKER_ENDPOINT_NAME = "generate"
OUR_ROUTER_COMPONENT = "router"

# The policy our router runs with when the stack is given none.
DEFAULT_POLICY = EXTENDED_POLICY

_PR_SET_PDEATHSIG = 1
# DYN_SYSTEM_PORT must fit an i16 in Dynamo 1.6.1.
SYSTEM_PORT_RANGE = (20000, 32767)


class StackError(RuntimeError):
    """The stack failed to start or a process died; the message carries the log tails."""


@dataclass
class StackProcess:
    """One child process of the stack."""

    name: str
    role: Literal["broker", "worker", "router", "frontend"]
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
        return f"http://{LOOPBACK}:{self.system_port}/metrics"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class StackConfig:
    """What to start. Defaults give the stock arm with two small mocker workers."""

    arm: Arm = "stock"
    num_workers: int = 2
    num_gpu_blocks: int = 256
    block_size: int = 16
    speedup_ratio: float = 10.0
    mocker_args: list[str] = field(default_factory=list)
    frontend_args: list[str] = field(default_factory=list)
    # builtin and ours: the router-policy YAML. None: for builtin, BUILTIN_POLICY_YAML written
    # into the run dir; for ours, the project's policies/thunderagent-extended.yaml.
    policy: Path | None = None
    # dynamo-python: extra flags for dynamo.thunderagent_router (e.g. --pause-threshold 0.9).
    router_args: list[str] = field(default_factory=list)
    # ours: the router command line. Each item may use the placeholders {worker_endpoint},
    # {router_endpoint}, {namespace}, {model_name}, {model_path}, {block_size}, {run_dir},
    # {python}; the same values are in the env as DTA_WORKER_ENDPOINT, DTA_ROUTER_ENDPOINT,
    # DTA_NAMESPACE, DTA_MODEL_NAME, DTA_MODEL_PATH, DTA_BLOCK_SIZE.
    router_cmd: list[str] | None = None
    http_port: int | None = None
    model_name: str = MODEL_NAME
    model_path: Path | None = None
    run_dir: Path | None = None
    keep_run_dir: bool = True  # False: delete the run dir (logs included) on stop()
    startup_timeout_s: float = 60.0
    stop_grace_s: float = 10.0
    python: str = sys.executable
    # Route the event plane through a loopback broker (needs pyzmq). Without it, Dynamo's
    # ZMQ publishers bind 0.0.0.0.
    event_broker: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {self.arm!r}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.num_gpu_blocks < 1 or self.block_size < 1:
            raise ValueError("num_gpu_blocks and block_size must be >= 1")
        if self.speedup_ratio <= 0:
            raise ValueError(f"speedup_ratio must be > 0, got {self.speedup_ratio}")
        if self.arm not in ("builtin", "ours") and self.policy is not None:
            raise ValueError(
                "policy (a router-policy YAML) only applies to arms 'builtin' and 'ours'"
            )


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def free_system_port() -> int:
    """A free port for ``DYN_SYSTEM_PORT``, which Dynamo 1.6.1 parses as an i16 (<= 32767).

    The OS hands out ephemeral ports above that, so pick at random below the ephemeral range
    and keep the first one that binds.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(SYSTEM_PORT_RANGE[0], SYSTEM_PORT_RANGE[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise StackError(f"no free port in {SYSTEM_PORT_RANGE} for DYN_SYSTEM_PORT")


def _die_with_parent() -> None:
    """Child-side: get SIGTERM if the parent dies, so a killed test leaves no orphans (Linux)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _http_get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bytes(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((LOOPBACK, port)) == 0


class LocalStack:
    """A running local stack. Use as a context manager, or call ``start()`` and ``stop()``."""

    def __init__(self, config: StackConfig | None = None, **overrides: object) -> None:
        base = config or StackConfig()
        if overrides:
            base = dataclasses.replace(base, **overrides)  # type: ignore[arg-type]
        base.validate()
        self.config = base
        self.processes: list[StackProcess] = []
        self.http_port = base.http_port or free_port()
        # Absolute: the workers read the model folder by path, and a relative one is taken
        # for a hub repository id (the mocker then fails to start).
        self.run_dir = Path(base.run_dir or tempfile.mkdtemp(prefix="dta-stack-")).resolve()
        self.model_path: Path = (base.model_path or self.run_dir / "model").resolve()
        self.policy_path: Path | None = None
        # Our router's loopback state endpoint (GET /state), in arm ours.
        self.state_port: int | None = free_port() if base.arm == "ours" else None
        self._stopped = False
        self._atexit_registered = False
        self._env: dict[str, str] = {}

    # ----- topology ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://{LOOPBACK}:{self.http_port}/v1"

    @property
    def namespace(self) -> str:
        """Namespace the frontend serves (the router's namespace in the router arms)."""
        return ROUTER_NAMESPACE.get(self.config.arm, DEFAULT_NAMESPACE)

    @property
    def worker_namespace(self) -> str:
        if self.config.arm in ROUTER_NAMESPACE:
            return f"{self.namespace}-{WORKER_NAMESPACE_SUFFIX}"
        return DEFAULT_NAMESPACE

    @property
    def worker_endpoint(self) -> str:
        """``ns.component.endpoint`` the mocker workers serve."""
        return f"{self.worker_namespace}.{WORKER_COMPONENT}.{WORKER_ENDPOINT_NAME}"

    @property
    def router_endpoint(self) -> str | None:
        """``ns.component.endpoint`` the router component serves, in the router arms."""
        if self.config.arm == "ours":
            return f"{self.namespace}.{OUR_ROUTER_COMPONENT}.{WORKER_ENDPOINT_NAME}"
        if self.config.arm == "dynamo-python":
            return f"{self.namespace}.thunderagent_router.generate"
        return None

    @property
    def state_url(self) -> str | None:
        """Our router's state endpoint (arm ours with the default router command)."""
        if self.state_port is None or self.config.router_cmd is not None:
            return None
        return f"http://{LOOPBACK}:{self.state_port}/state"

    @property
    def kv_dir(self) -> Path:
        return self.run_dir / "kv"

    @property
    def workers(self) -> list[StackProcess]:
        return [p for p in self.processes if p.role == "worker"]

    @property
    def frontend(self) -> StackProcess:
        return next(p for p in self.processes if p.role == "frontend")

    @property
    def router(self) -> StackProcess | None:
        return next((p for p in self.processes if p.role == "router"), None)

    @property
    def metrics_urls(self) -> dict[str, str]:
        """``/metrics`` of every Dynamo process, keyed by process name (worker-0, frontend...)."""
        urls = {p.name: p.metrics_url for p in self.processes}
        urls["frontend-http"] = f"http://{LOOPBACK}:{self.http_port}/metrics"
        return {name: url for name, url in urls.items() if url is not None}

    def base_env(self) -> dict[str, str]:
        """Environment shared by every process: file discovery, TCP + ZMQ, loopback only."""
        env = dict(os.environ)
        # Never inherit a namespace or router endpoint from the caller's shell.
        for key in ("DYN_NAMESPACE", "DYN_NAMESPACE_WORKER_SUFFIX", "DYN_ROUTER_ENDPOINT"):
            env.pop(key, None)
        env.update(
            {
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.kv_dir),
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_EVENT_PLANE": "zmq",
                "DYN_TCP_RPC_HOST": LOOPBACK,
                "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK,
                "DYN_EVENT_PLANE_HOST": LOOPBACK,
                "DYN_SYSTEM_HOST": LOOPBACK,
                "HOME": str(self.run_dir / "home"),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        # Children run in the run dir; make this package importable there even when it is not
        # installed (e.g. `python -m dynamo_thunderagent.stack.zmq_broker` from a checkout).
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        env.update(self.config.extra_env)
        return env

    # ----- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalStack:
        """Start every process and wait until the model is served; raise StackError if not."""
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "home").mkdir(exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.kv_dir.mkdir(exist_ok=True)
        build_tiny_model(self.model_path)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        env = self.base_env()
        deadline = time.monotonic() + cfg.startup_timeout_s

        if cfg.event_broker:
            xsub, xpub = free_port(), free_port()
            self._spawn(
                "zmq-broker",
                "broker",
                [cfg.python, "-m", "dynamo_thunderagent.stack.zmq_broker", str(xsub), str(xpub)],
                env,
                system_port=None,
            )
            self._wait_for(lambda: _port_open(xsub) and _port_open(xpub), deadline, "zmq broker")
            env["DYN_ZMQ_BROKER_URL"] = broker_url(xsub, xpub)
        self._env = env  # restart_router starts the replacement with the same settings

        for index in range(cfg.num_workers):
            self._spawn(
                f"worker-{index}",
                "worker",
                self._mocker_argv(),
                env,
                system_port=free_system_port(),
            )

        if cfg.arm in ("dynamo-python", "ours"):
            self._start_router(env)

        self._spawn(
            "frontend", "frontend", self._frontend_argv(), env, system_port=free_system_port()
        )

        self._wait_for(
            self._workers_registered, deadline, f"{cfg.num_workers} worker registrations"
        )
        self._wait_for(
            self._model_listed, deadline, f"model {cfg.model_name!r} on {self.url}/models"
        )
        if cfg.arm == "builtin":
            self._wait_for(
                lambda: (
                    BUILTIN_ADMISSION_LOG_LINE in self.frontend.log_path.read_text(errors="replace")
                ),
                deadline,
                f"{BUILTIN_ADMISSION_LOG_LINE!r} in the frontend log",
            )
        if self.state_url is not None:
            # The frontend lists the model before our router's worker watch has seen every
            # worker (about a second); agents started then would all land on the first one.
            self._wait_for(self._router_sees_workers, deadline,
                           f"{cfg.num_workers} live workers in the router's state")
        return self

    def stop(self) -> None:
        """SIGTERM each process group we started, then SIGKILL what is left after the grace."""
        if self._stopped:
            return
        self._stopped = True
        # Frontend first (stops new traffic), workers next, broker last.
        order = {"frontend": 0, "router": 1, "worker": 2, "broker": 3}
        procs = sorted(self.processes, key=lambda p: order[p.role])
        for proc in procs:
            self._signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_grace_s
        for proc in procs:
            remaining = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=remaining)
        for proc in procs:
            # Also catch grandchildren left in the group after the leader exited.
            self._signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5.0)
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if not self.config.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one worker's process group (default SIGKILL); return its PID."""
        proc = self.workers[index]
        self._signal_group(proc, sig)
        return proc.pid

    def _end(self, proc: StackProcess, sig: signal.Signals) -> None:
        """Signal one process group, then SIGKILL what is left after the grace."""
        self._signal_group(proc, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=self.config.stop_grace_s)
        self._signal_group(proc, signal.SIGKILL)
        proc.popen.wait(timeout=5.0)

    def _check_running(self) -> None:
        if self._stopped or not self._env:
            raise StackError("the stack is not running: start() it before restarting a process")

    def restart_worker(self, index: int, timeout: float | None = None) -> int:
        """Start a new worker in place of worker ``index`` (killed or not); return its PID.

        The old process group is killed first if still alive. The replacement registers
        with a new instance id; this returns once discovery lists it.
        """
        self._check_running()
        old = self.workers[index]
        self._end(old, signal.SIGKILL)
        position = self.processes.index(old)
        new = self._spawn(old.name, "worker", self._mocker_argv(), self._env,
                          system_port=free_system_port())
        self.processes.remove(new)
        self.processes[position] = new  # keep worker indices stable
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        self._wait_for(lambda: index in self.worker_instances(), deadline,
                       f"the restarted {old.name} to register")
        return new.pid

    def restart_router(self, sig: signal.Signals = signal.SIGKILL,
                       timeout: float | None = None) -> int:
        """Stop the router with ``sig`` (default SIGKILL), start a new one; return its PID.

        The replacement has the same command line, settings and state port and appends to
        the same log; this returns once it is ready as at start (for arm ours: its state
        lists every worker). Programs the old router knew are gone (nothing is persisted).
        """
        self._check_running()
        old = self.router
        if old is None:
            raise StackError(f"arm {self.config.arm!r} has no router to restart")
        self._end(old, sig)
        self.processes.remove(old)
        self._start_router(self._env)
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        if self.state_url is not None:
            self._wait_for(self._router_sees_workers, deadline,
                           f"the restarted router to see {self.config.num_workers} workers")
        router = self.router
        assert router is not None
        return router.pid

    def assert_alive(self) -> None:
        """Raise StackError naming any process that has exited."""
        dead = [p for p in self.processes if not p.alive()]
        if dead:
            raise StackError(
                self._failure_report("processes exited: " + ", ".join(p.name for p in dead))
            )

    # ----- discovery views -----------------------------------------------------------------

    def worker_instances(self) -> dict[int, int]:
        """Live worker instance ids keyed by worker index (from the file-discovery store).

        The match goes through each worker's system port, which its model card embeds in the
        URLs it serves its tokenizer files from.
        """
        by_port = {p.system_port: i for i, p in enumerate(self.workers)}
        found: dict[int, int] = {}
        mdc_dir = self.kv_dir / "v1" / "mdc"
        if not mdc_dir.is_dir():
            return found
        for entry in mdc_dir.iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError):
                card = json.loads(entry.read_text())
                if (card.get("namespace"), card.get("component")) != (
                    self.worker_namespace,
                    WORKER_COMPONENT,
                ):
                    continue
                text = json.dumps(card.get("card_json", {}))
                for port, index in by_port.items():
                    if f"{LOOPBACK}:{port}/" in text:
                        found[index] = int(card["instance_id"])
        return found

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for p in self.processes:
            state = "alive" if p.alive() else f"exit {p.popen.returncode}"
            parts.append(f"----- {p.name} (pid {p.pid}, {state}) {p.log_path}\n{p.log_tail(lines)}")
        return "\n".join(parts)

    # ----- internals ---------------------------------------------------------------------

    def _mocker_argv(self) -> list[str]:
        cfg = self.config
        return [
            cfg.python, "-m", "dynamo.mocker",
            "--model-path", str(self.model_path),
            "--model-name", cfg.model_name,
            "--endpoint", f"dyn://{self.worker_endpoint}",
            "--num-gpu-blocks-override", str(cfg.num_gpu_blocks),
            "--block-size", str(cfg.block_size),
            "--speedup-ratio", str(cfg.speedup_ratio),
            *cfg.mocker_args,
        ]  # fmt: skip

    def _frontend_argv(self) -> list[str]:
        cfg = self.config
        argv = [
            cfg.python, "-m", "dynamo.frontend",
            "--http-host", LOOPBACK,
            "--http-port", str(self.http_port),
        ]  # fmt: skip
        if cfg.arm == "stock":
            argv += [
                "--router-mode", "kv",
                "--router-session-affinity-ttl-secs", "1800",
                "--router-session-affinity-mode", "soft",
            ]  # fmt: skip
        elif cfg.arm == "builtin":
            self.policy_path = cfg.policy or self.run_dir / "thunderagent-policy.yaml"
            if cfg.policy is None:
                self.policy_path.write_text(BUILTIN_POLICY_YAML, encoding="utf-8")
            argv += ["--router-mode", "kv", "--router-policy-config", str(self.policy_path)]
        else:
            # One router instance sits behind the frontend; its own routing decides workers.
            argv += ["--router-mode", "round-robin", "--namespace", self.namespace]
        return argv + cfg.frontend_args

    def _start_router(self, env: dict[str, str]) -> None:
        cfg = self.config
        router_env = dict(env)
        if cfg.arm == "dynamo-python":
            # dynamo.thunderagent_router serves {DYN_NAMESPACE}.thunderagent_router.generate and
            # rewrites its worker endpoint's namespace to {DYN_NAMESPACE}-{suffix}.
            router_env["DYN_NAMESPACE"] = self.namespace
            router_env["DYN_NAMESPACE_WORKER_SUFFIX"] = WORKER_NAMESPACE_SUFFIX
            argv = [
                cfg.python, "-m", "dynamo.thunderagent_router",
                "--endpoint", self.worker_endpoint,
                "--router-block-size", str(cfg.block_size),
                "--model-name", cfg.model_name,
                "--model-path", str(self.model_path),
                *cfg.router_args,
            ]  # fmt: skip
        else:
            values = {
                "worker_endpoint": self.worker_endpoint,
                "router_endpoint": self.router_endpoint or "",
                "namespace": self.namespace,
                "model_name": cfg.model_name,
                "model_path": str(self.model_path),
                "block_size": str(cfg.block_size),
                "run_dir": str(self.run_dir),
                "python": cfg.python,
            }
            router_env.update({f"DTA_{key.upper()}": value for key, value in values.items()})
            if cfg.router_cmd is not None:
                argv = [item.format(**values) for item in cfg.router_cmd] + cfg.router_args
            else:
                policy = (cfg.policy or DEFAULT_POLICY).resolve()
                self.policy_path = policy
                argv = [
                    cfg.python, "-m", "dynamo_thunderagent", "serve",
                    "--router-policy-config", str(policy),
                    "--endpoint", self.worker_endpoint,
                    "--router-endpoint", self.router_endpoint or "",
                    "--model-name", cfg.model_name,
                    "--model-path", str(self.model_path),
                    "--block-size", str(cfg.block_size),
                    "--state-port", str(self.state_port),
                    *cfg.router_args,
                ]  # fmt: skip
        self._spawn("router", "router", argv, router_env, system_port=free_system_port())

    def _spawn(
        self,
        name: str,
        role: Literal["broker", "worker", "router", "frontend"],
        argv: Sequence[str],
        env: dict[str, str],
        system_port: int | None,
    ) -> StackProcess:
        log_path = self.run_dir / "logs" / f"{name}.log"
        proc_env = dict(env)
        if system_port is not None:
            proc_env["DYN_SYSTEM_PORT"] = str(system_port)
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=proc_env,
                cwd=str(self.run_dir),
                start_new_session=True,  # own process group: stop() signals exactly this group
                preexec_fn=_die_with_parent,
            )
        proc = StackProcess(name, role, list(argv), log_path, system_port, popen)
        self.processes.append(proc)
        return proc

    @staticmethod
    def _signal_group(proc: StackProcess, sig: signal.Signals) -> None:
        # The child leads its own session, so its pgid equals its pid; signal nothing else.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def _workers_registered(self) -> bool:
        return len(self.worker_instances()) >= self.config.num_workers

    def _router_sees_workers(self) -> bool:
        """Our router lists every worker live and, if its classifier reports ranks, knows
        the capacity of each."""
        body = _http_get(self.state_url) if self.state_url else None
        if body is None:
            return False
        want = self.config.num_workers
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            state = json.loads(body)
            ranks = (state.get("scheduler") or {}).get("ranks")
            known = want if ranks is None else sum(
                1 for rank in ranks.values() if rank.get("capacity_tokens"))
            return len(state.get("live_workers") or []) >= want and known >= want
        return False

    def _model_listed(self) -> bool:
        body = _http_get(f"{self.url}/models")
        if body is None:
            return False
        with contextlib.suppress(ValueError):
            data = json.loads(body)
            return any(m.get("id") == self.config.model_name for m in data.get("data", []))
        return False

    def _wait_for(self, ready: object, deadline: float, what: str) -> None:
        assert callable(ready)
        while True:
            self.assert_alive()
            with contextlib.suppress(OSError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise StackError(
                    self._failure_report(
                        f"timed out after {self.config.startup_timeout_s:.0f}s waiting for {what}"
                    )
                )
            time.sleep(0.2)

    def _failure_report(self, headline: str) -> str:
        return f"{headline} (arm {self.config.arm}, run dir {self.run_dir})\n{self.log_tails()}"
