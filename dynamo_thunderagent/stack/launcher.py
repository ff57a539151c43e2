"""Start a loopback-only Dynamo 1.6.1 stack: mocker workers, a frontend and, per arm, a router.

:class:`LocalStack` is the lifecycle: it builds the tiny model, starts etcd and NATS (etcd
discovery) or the event broker (file discovery), the workers, the arm's router and the
frontend, waits until they are ready, restarts a worker or the router on demand, and stops
everything. What it delegates:

* :mod:`~dynamo_thunderagent.stack.arms`: everything that differs between the systems under
  test (routing flags, the router's command line, extra readiness, figures);
* :mod:`~dynamo_thunderagent.stack.topology`: namespaces and endpoints;
* :mod:`~dynamo_thunderagent.stack.environment`: the loopback-only environment;
* :mod:`~dynamo_thunderagent.stack.discovery`: the etcd and NATS servers, the registrations;
* :mod:`~dynamo_thunderagent.stack.process`: spawning and signalling process groups;
* :mod:`~dynamo_thunderagent.stack.readiness`: the probes and the wait loop.

Each process runs in its own process group; ``stop()`` signals exactly those groups.

(This module is about 550 lines because :class:`LocalStack` is the one object the demo, the
benchmarks and the end-to-end tests drive: its public surface, the addresses, ``start``,
``stop``, the restarts, the extra processes that build misconfigurations (a worker in the
router's namespace, a second router) and the views of discovery, is the stack's API, and
each of its methods is a few lines over the modules above. What could stand alone already
does.)
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from dynamo_thunderagent.stack.arms import LaunchContext, arm_named
from dynamo_thunderagent.stack.config import StackConfig
from dynamo_thunderagent.stack.discovery import (
    EtcdNats,
    etcd_healthy,
    find_binaries,
    model_cards,
)
from dynamo_thunderagent.stack.environment import stack_env
from dynamo_thunderagent.stack.process import (
    Role,
    StackError,
    StackProcess,
    end,
    free_port,
    free_system_port,
    signal_group,
    spawn,
    stop_all,
)
from dynamo_thunderagent.stack.readiness import (
    Readiness,
    model_listed,
    port_open,
    router_sees_workers,
    wait_for,
    worker_instances,
)
from dynamo_thunderagent.stack.tiny_model import build_tiny_model
from dynamo_thunderagent.stack.topology import (
    LOOPBACK,
    WORKER_COMPONENT,
    WORKER_ENDPOINT_NAME,
    http_url,
)
from dynamo_thunderagent.stack.zmq_broker import broker_url

# Starts of the frontend when the HTTP port picked for it is taken before it binds it.
FRONTEND_PORT_TRIES = 3

# StackConfig and StackError live in their own modules; they are importable from here too,
# next to the stack they configure and report on.
__all__ = ["LocalStack", "StackConfig", "StackError", "StackProcess"]

# Frontend first (stops new traffic), router and workers next, broker last. The discovery
# servers are stopped after all of these have exited: a Dynamo process that loses etcd or
# NATS while shutting down waits on it instead of exiting.
_STOP_ORDER: dict[Role, int] = {"frontend": 0, "router": 1, "worker": 2, "broker": 3,
                                "discovery": 4}  # fmt: skip


class LocalStack:
    """A running local stack. Use as a context manager, or call ``start()`` and ``stop()``."""

    def __init__(self, config: StackConfig | None = None, **overrides: object) -> None:
        base = config or StackConfig()
        if overrides:
            base = dataclasses.replace(base, **overrides)  # type: ignore[arg-type]
        base.validate()
        self.config = base
        self.arm = arm_named(base.arm)
        self.processes: list[StackProcess] = []
        self.http_port = base.http_port or free_port()
        # Absolute: the workers read the model folder by path, and a relative one is taken
        # for a hub repository id (the mocker then fails to start).
        self.run_dir = Path(base.run_dir or tempfile.mkdtemp(prefix="dta-stack-")).resolve()
        self.model_path: Path = (base.model_path or self.run_dir / "model").resolve()
        # Etcd discovery: the stack's own etcd and NATS servers, on ports picked now so that
        # the banner can name them before anything starts. None: file discovery.
        self.discovery: EtcdNats | None = (
            EtcdNats(etcd_port=free_port(), etcd_peer_port=free_port(), nats_port=free_port(),
                     run_dir=self.run_dir)
            if base.discovery == "etcd" else None
        )  # fmt: skip
        # Our router's loopback state endpoint (GET /state), in the arms that serve one.
        self.state_port: int | None = free_port() if self.arm.serves_state else None
        self.launch = LaunchContext(
            python=base.python, model_name=base.model_name, model_path=self.model_path,
            block_size=base.block_size, num_workers=base.num_workers, run_dir=self.run_dir,
            # Absolute too: the processes run in the run dir (a relative --out of bench live
            # put the builtin arm's policy copy out of the frontend's reach).
            topology=self.arm.topology, policy=base.policy.resolve() if base.policy else None,
            router_args=tuple(base.router_args),
            router_cmd=None if base.router_cmd is None else tuple(base.router_cmd),
            state_port=self.state_port,
        )  # fmt: skip
        self.policy_path: Path | None = self.arm.policy_path(self.launch)
        self._stopped = False
        self._atexit_registered = False
        self._env: dict[str, str] = {}

    # ----- topology ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, e.g. ``http://127.0.0.1:PORT/v1``."""
        return http_url(self.http_port, "/v1")

    @property
    def namespace(self) -> str:
        """Namespace the frontend serves (the router's namespace in the router arms)."""
        return self.arm.topology.namespace

    @property
    def worker_namespace(self) -> str:
        return self.arm.topology.worker_namespace

    @property
    def worker_endpoint(self) -> str:
        """``ns.component.endpoint`` the mocker workers serve."""
        return self.arm.topology.worker_endpoint

    @property
    def router_endpoint(self) -> str | None:
        """``ns.component.endpoint`` the router component serves, in the router arms."""
        return self.arm.topology.router_endpoint

    @property
    def state_url(self) -> str | None:
        """Our router's state endpoint (arm ours with the default router command)."""
        return self.launch.state_url

    @property
    def kv_dir(self) -> Path:
        """The file-discovery store (file discovery only)."""
        return self.run_dir / "kv"

    @property
    def etcd_url(self) -> str | None:
        """The stack's etcd (``ETCD_ENDPOINTS``); None with file discovery."""
        return None if self.discovery is None else self.discovery.etcd_url

    @property
    def nats_url(self) -> str | None:
        """The stack's NATS server (``NATS_SERVER``); None with file discovery."""
        return None if self.discovery is None else self.discovery.nats_url

    def describe_discovery(self) -> dict[str, str]:
        """Which discovery the stack runs and where: the etcd and NATS URLs, or the store."""
        if self.discovery is None:
            return {"backend": "file", "store": str(self.kv_dir)}
        return self.discovery.describe()

    @property
    def workers(self) -> list[StackProcess]:
        return [p for p in self.processes if p.role == "worker"]

    @property
    def frontend(self) -> StackProcess:
        return next(p for p in self.processes if p.role == "frontend")

    @property
    def router(self) -> StackProcess | None:
        """The stack's router (a second one, :meth:`start_router_again`, is not it)."""
        return next((p for p in self.processes if p.role == "router" and p.name == "router"),
                    None)

    @property
    def metrics_urls(self) -> dict[str, str]:
        """``/metrics`` of every Dynamo process, keyed by process name (worker-0, frontend...)."""
        urls = {p.name: p.metrics_url for p in self.processes}
        urls["frontend-http"] = http_url(self.http_port, "/metrics")
        return {name: url for name, url in urls.items() if url is not None}

    def base_env(self) -> dict[str, str]:
        """Environment shared by every process: file discovery, TCP + ZMQ (or etcd, TCP +
        NATS), loopback only."""
        discovery_env = None if self.discovery is None else self.discovery.env()
        return stack_env(self.run_dir, self.kv_dir, self.config.extra_env, os.environ,
                         discovery_env)  # fmt: skip

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
        if self.discovery is None:
            self.kv_dir.mkdir(exist_ok=True)
        build_tiny_model(self.model_path)
        self.arm.prepare(self.launch)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        env = self.base_env()
        deadline = time.monotonic() + cfg.startup_timeout_s

        if self.discovery is not None:
            self._start_discovery(self.discovery, env, deadline)
        elif cfg.event_broker:
            xsub, xpub = free_port(), free_port()
            self._spawn(
                "zmq-broker",
                "broker",
                [cfg.python, "-m", "dynamo_thunderagent.stack.zmq_broker", str(xsub), str(xpub)],
                env,
                system_port=None,
            )
            self._wait_for(
                Readiness(lambda: port_open(xsub) and port_open(xpub), "zmq broker"), deadline
            )
            env["DYN_ZMQ_BROKER_URL"] = broker_url(xsub, xpub)
        self._env = env  # restart_router starts the replacement with the same settings

        for index in range(cfg.num_workers):
            self._spawn(
                f"worker-{index}",
                "worker",
                self._mocker_argv(index=index),
                env,
                system_port=free_system_port(),
            )
        self._start_router(env)
        frontend = self._spawn(
            "frontend", "frontend", self._frontend_argv(), env, system_port=free_system_port()
        )
        for attempt in range(1, FRONTEND_PORT_TRIES + 1):
            try:
                self._wait_for(
                    Readiness(self._workers_registered, f"{cfg.num_workers} worker registrations"),
                    deadline,
                )
                self._wait_for(
                    Readiness(lambda: model_listed(self.url, cfg.model_name),
                              f"model {cfg.model_name!r} on {self.url}/models"),
                    deadline,
                )  # fmt: skip
                break
            except StackError:
                if attempt == FRONTEND_PORT_TRIES or not self._lost_its_port(frontend):
                    raise
                # The port was free when picked, and the OS handed it to another process
                # before the frontend bound it: pick another and start the frontend again.
                self.processes.remove(frontend)
                self.http_port = free_port()
                frontend = self._spawn("frontend", "frontend", self._frontend_argv(), env,
                                       system_port=free_system_port())
        for ready in self.arm.readiness(self.launch):
            self._wait_for(ready, deadline)
        return self

    def stop(self) -> None:
        """SIGTERM each process group we started, then SIGKILL what is left after the grace;
        the discovery servers (etcd, NATS) once every other process has exited."""
        if self._stopped:
            return
        self._stopped = True
        ordered = sorted(self.processes, key=lambda p: _STOP_ORDER[p.role])
        grace = self.config.stop_grace_s
        stop_all([p for p in ordered if p.role != "discovery"], grace)
        stop_all([p for p in ordered if p.role == "discovery"], grace)
        if self.discovery is not None:
            # Registrations die with the stack; etcd's data dir alone holds a 64 MB WAL
            # segment, too much to leave behind in each kept run dir (the logs stay).
            shutil.rmtree(self.discovery.etcd_data_dir, ignore_errors=True)
            shutil.rmtree(self.discovery.nats_store_dir, ignore_errors=True)
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if not self.config.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal one worker's process group (default SIGKILL); return its PID."""
        proc = self.workers[index]
        signal_group(proc, sig)
        return proc.pid

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
        end(old, signal.SIGKILL, self.config.stop_grace_s)
        position = self.processes.index(old)
        new = self._spawn(old.name, "worker", self._mocker_argv(index=index), self._env,
                          system_port=free_system_port())
        self.processes.remove(new)
        self.processes[position] = new  # keep worker indices stable
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        self._wait_for(Readiness(lambda: index in self.worker_instances(),
                                 f"the restarted {old.name} to register"), deadline)
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
        end(old, sig, self.config.stop_grace_s)
        self.processes.remove(old)
        self._start_router(self._env)
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        for ready in self.arm.router_readiness(self.launch):
            self._wait_for(Readiness(ready.check, f"the restarted router: {ready.what}"),
                           deadline)
        router = self.router
        assert router is not None
        return router.pid

    def start_router_again(self, timeout: float | None = None) -> tuple[StackProcess, str]:
        """Start a second router like the first, at the same endpoint, with a state port of
        its own; return it and its state URL once it lists every worker.

        This builds the misconfiguration ``doctor`` and the routers themselves report: two
        program tables for one set of workers. The process is listed in ``processes`` (not
        as ``router``) and is stopped with the stack, or earlier with :meth:`end_process`.
        """
        self._check_running()
        launch = self.arm.router(self.launch)
        if launch is None or "--state-port" not in launch.argv:
            raise StackError(f"arm {self.config.arm!r} has no router with a state port")
        argv = list(launch.argv)
        port = free_port()
        argv[argv.index("--state-port") + 1] = str(port)
        proc = self._spawn("router-2", "router", argv, {**self._env, **launch.env},
                           system_port=free_system_port())
        state_url = http_url(port, "/state")
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        want = self.config.num_workers
        self._wait_for(Readiness(lambda: router_sees_workers(state_url, want),
                                 f"the second router: {want} live workers in its state"),
                       deadline)
        return proc, state_url

    def end_process(self, proc: StackProcess, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop one process of the stack with ``sig`` (SIGKILL after the stop grace) and
        forget it, so that readiness and liveness checks no longer count it."""
        end(proc, sig, self.config.stop_grace_s)
        self.processes.remove(proc)

    def start_worker_in(self, namespace: str, timeout: float | None = None) -> StackProcess:
        """Start one more mocker worker, like the others but serving in ``namespace``.

        In the router's namespace this builds the misconfiguration ``doctor`` reports: a
        frontend scoped to that namespace reaches the worker directly. The worker is listed
        in ``processes`` (stopped with the stack) after the others, so their indices keep;
        this returns once discovery lists its model card.
        """
        endpoint = f"{namespace}.{WORKER_COMPONENT}.{WORKER_ENDPOINT_NAME}"
        return self._add_worker(
            f"worker-{len(self.workers)}-{namespace}", self._mocker_argv(endpoint),
            lambda proc: bool(worker_instances(self.model_cards(), namespace,
                                               {proc.system_port: 0})),
            f"a worker to register in namespace {namespace!r}", timeout)

    def start_worker_command(self, name: str, argv: Sequence[str],
                             timeout: float | None = None) -> StackProcess:
        """Start a worker of the caller's own command in the stack's environment: an
        engine other than the mocker, such as the fault suite's engine that fails on
        request. It gets a system port of its own and must serve ``worker_endpoint``; it is
        listed and stopped with the stack, after the other workers (their indices keep).
        Returns once discovery lists its model card."""
        index = len(self.workers)
        return self._add_worker(name, argv, lambda _: index in self.worker_instances(),
                                f"worker {name} to register", timeout)

    def _add_worker(self, name: str, argv: Sequence[str],
                    registered: Callable[[StackProcess], bool], what: str,
                    timeout: float | None) -> StackProcess:
        """Start one more worker process (system port of its own, listed after the others)
        and wait until ``registered(process)`` says discovery lists it."""
        self._check_running()
        proc = self._spawn(name, "worker", argv, self._env, system_port=free_system_port())
        deadline = time.monotonic() + (timeout or self.config.startup_timeout_s)
        self._wait_for(Readiness(lambda: registered(proc), what), deadline)
        return proc

    def assert_alive(self) -> None:
        """Raise StackError naming any process that has exited."""
        dead = [p for p in self.processes if not p.alive()]
        if dead:
            raise StackError(
                self._failure_report("processes exited: " + ", ".join(p.name for p in dead))
            )

    # ----- discovery views -----------------------------------------------------------------

    def model_cards(self) -> list[dict[str, Any]]:
        """The model cards registered now, from etcd or the file-discovery store.

        Raises OSError when etcd cannot be reached.
        """
        return model_cards(self.discovery, self.kv_dir)

    def worker_instances(self) -> dict[int, int]:
        """Live worker instance ids keyed by worker index (from the registered model cards).

        The match goes through each worker's system port, which its model card embeds in the
        URLs it serves its tokenizer files from.
        """
        by_port = {p.system_port: i for i, p in enumerate(self.workers)}
        return worker_instances(self.model_cards(), self.worker_namespace, by_port)

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for p in self.processes:
            state = "alive" if p.alive() else f"exit {p.popen.returncode}"
            parts.append(f"----- {p.name} (pid {p.pid}, {state}) {p.log_path}\n{p.log_tail(lines)}")
        return "\n".join(parts)

    # ----- internals ---------------------------------------------------------------------

    def _mocker_argv(self, endpoint: str | None = None, index: int | None = None) -> list[str]:
        """A mocker's command line; ``index``: worker ``index``'s, its ``worker_args`` last."""
        cfg = self.config
        own = cfg.worker_args[index] if index is not None and index < len(cfg.worker_args) else []
        return [
            cfg.python, "-m", "dynamo.mocker",
            "--model-path", str(self.model_path),
            "--model-name", cfg.model_name,
            "--endpoint", f"dyn://{endpoint or self.worker_endpoint}",
            "--num-gpu-blocks-override", str(cfg.num_gpu_blocks),
            "--block-size", str(cfg.block_size),
            "--speedup-ratio", str(cfg.speedup_ratio),
            *cfg.mocker_args,
            *own,
        ]  # fmt: skip

    def _frontend_argv(self) -> list[str]:
        cfg = self.config
        return [
            cfg.python, "-m", "dynamo.frontend",
            "--http-host", LOOPBACK,
            "--http-port", str(self.http_port),
            *self.arm.frontend_args(self.launch),
            *cfg.frontend_args,
        ]  # fmt: skip

    def _start_discovery(self, servers: EtcdNats, env: dict[str, str], deadline: float) -> None:
        """Start etcd and NATS (MissingBinaries if either is not installed) and wait for both."""
        binaries = find_binaries(self.config.python, env.get("PATH"))
        servers.etcd_data_dir.mkdir(parents=True, exist_ok=True)
        servers.nats_store_dir.mkdir(parents=True, exist_ok=True)
        self._spawn("etcd", "discovery", servers.etcd_argv(binaries["etcd"]), env,
                    system_port=None)
        self._spawn("nats", "discovery", servers.nats_argv(binaries["nats-server"]), env,
                    system_port=None)
        self._wait_for(Readiness(lambda: etcd_healthy(servers.etcd_url),
                                 f"etcd to be healthy at {servers.etcd_url}/health"), deadline)
        self._wait_for(Readiness(lambda: port_open(servers.nats_port),
                                 f"NATS to listen at {servers.nats_url}"), deadline)

    def _start_router(self, env: dict[str, str]) -> None:
        launch = self.arm.router(self.launch)
        if launch is None:
            return
        self._spawn("router", "router", launch.argv, {**env, **launch.env},
                    system_port=free_system_port())

    def _spawn(
        self,
        name: str,
        role: Role,
        argv: Sequence[str],
        env: dict[str, str],
        system_port: int | None,
    ) -> StackProcess:
        proc = spawn(name, role, argv, env, run_dir=self.run_dir, system_port=system_port)
        self.processes.append(proc)
        return proc

    def _lost_its_port(self, frontend: StackProcess) -> bool:
        """The frontend exited because its HTTP port, picked here, was taken meanwhile."""
        if self.config.http_port is not None or frontend.alive():
            return False  # a port the caller chose is the caller's to change
        try:
            text = frontend.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return "already in use" in text.rsplit("\n$ ", 1)[-1]  # since its own command line

    def _workers_registered(self) -> bool:
        return len(self.worker_instances()) >= self.config.num_workers

    def _wait_for(self, ready: Readiness, deadline: float) -> None:
        def timed_out(what: str) -> StackError:
            return StackError(self._failure_report(
                f"timed out after {self.config.startup_timeout_s:.0f}s waiting for {what}"))

        wait_for(ready, deadline, still_running=self.assert_alive, timed_out=timed_out)

    def _failure_report(self, headline: str) -> str:
        return (f"{headline} (arm {self.config.arm}, {self.config.discovery} discovery, "
                f"run dir {self.run_dir})\n{self.log_tails()}")  # fmt: skip
