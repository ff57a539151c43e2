"""The arms: the systems a benchmark compares, one class each, and the one registry of them.

* ``stock``: the frontend's KV router with soft session affinity (request-level baseline).
* ``builtin``: the frontend's KV router plus Dynamo's Rust ThunderAgent, enabled by a
  router-policy YAML (``--router-policy-config``), with the same soft session affinity.
* ``dynamo-python``: Dynamo's experimental ``python -m dynamo.thunderagent_router`` component
  between the frontend and the workers.
* ``ours``: our router component (``dynamo-thunderagent serve``), or a given router command.

An arm owns everything that differs between them: its topology (whether a router component
sits between the frontend and the workers, see :mod:`~dynamo_thunderagent.stack.topology`),
the frontend's routing flags, the router's command line and environment, what to wait for
before the stack counts as up, and which scheduler figures a benchmark can read from it. The
stack, the demo, ``bench live``, ``bench clients`` and the stack CLI take their arm list from
:data:`ARMS`; adding an arm is one subclass of :class:`Arm` added there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dynamo_thunderagent.policy_files import EXTENDED_POLICY, PARITY_POLICY
from dynamo_thunderagent.stack.figures import (
    parse_builtin_log,
    parse_python_router_log,
    scheduler_figures,
)
from dynamo_thunderagent.stack.process import log_path
from dynamo_thunderagent.stack.readiness import (
    Readiness,
    log_contains,
    router_sees_workers,
)
from dynamo_thunderagent.stack.topology import (
    WORKER_NAMESPACE_SUFFIX,
    Topology,
    http_url,
)

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
# The builtin's state-change lines are debug; a benchmark turns them on to count pauses.
BUILTIN_LOG_FILTER = "info,thunderagent=debug"

# The policy our router runs with when the stack is given none.
DEFAULT_POLICY = EXTENDED_POLICY


@dataclass(frozen=True)
class LaunchContext:
    """What an arm's command lines are built from: the stack's settings and layout."""

    python: str
    model_name: str
    model_path: Path
    block_size: int
    num_workers: int
    run_dir: Path
    topology: Topology
    policy: Path | None = None  # the router-policy YAML the stack was given
    router_args: Sequence[str] = ()
    router_cmd: Sequence[str] | None = None
    state_port: int | None = None  # our router's GET /state port (arms that serve state)

    @property
    def state_url(self) -> str | None:
        """Our router's state endpoint; None when no state port or a custom router command."""
        if self.state_port is None or self.router_cmd is not None:
            return None
        return http_url(self.state_port, "/state")


@dataclass(frozen=True)
class RouterLaunch:
    """The router component's command line and the variables it adds to the stack's env."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class ObservedRun(Protocol):
    """What a benchmark saw of one run, for :meth:`Arm.figures` to read."""

    def log(self, role: str) -> str:
        """Text the process of ``role`` (router, frontend...) logged during the run."""
        ...

    def state(self) -> dict[str, Any] | None:
        """Our router's ``/state`` now; None when the stack serves none or it is unreachable."""
        ...

    def state_samples(self) -> Sequence[tuple[float, float]]:
        """``(time, paused programs)`` polled from ``/state`` during the run."""
        ...

    def paused(self, samples: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
        """Time-weighted (mean, max) of paused-count samples over the steady window."""
        ...


class Arm(ABC):
    """A system under test: how the stack launches it, when it is ready, what it reports."""

    name: ClassVar[str]
    # Where its router component serves; the default (no router) is the frontend's namespace.
    topology: ClassVar[Topology] = Topology()
    # Runs with a router-policy YAML (StackConfig.policy); others refuse one.
    takes_policy: ClassVar[bool] = False
    # The policy a benchmark runs it with when its command line names none.
    default_policy: ClassVar[Path | None] = None
    # The benchmark option that names its policy (``--policy`` is our router's).
    policy_option: ClassVar[str | None] = None
    # Its router serves GET /state on a port the stack picks.
    serves_state: ClassVar[bool] = False
    # Its policy can say how large a host KV tier is (``host_kv_blocks``): a benchmark with
    # a host tier tells it, as an operator would (Dynamo 1.6's cards do not publish it).
    configures_host_tier: ClassVar[bool] = False
    # Its policy file is read by our router (validated as ours reads it), not Dynamo's plugin.
    reads_our_policy: ClassVar[bool] = False

    def policy_path(self, ctx: LaunchContext) -> Path | None:
        """The router-policy YAML its processes read, if any."""
        return None

    def prepare(self, ctx: LaunchContext) -> None:
        """Write the files its processes read (called once the run dir exists)."""

    def clock_args(self, time_scale: float) -> list[str]:
        """Router flags that put its built-in durations on a clock of ``time_scale`` wall
        seconds per real second; none for an arm whose durations are in a policy file."""
        return []

    @abstractmethod
    def frontend_args(self, ctx: LaunchContext) -> list[str]:
        """The frontend's routing flags."""

    def router(self, ctx: LaunchContext) -> RouterLaunch | None:
        """Its router component between the frontend and the workers; None if it has none."""
        return None

    def readiness(self, ctx: LaunchContext) -> list[Readiness]:
        """What else to wait for once the workers registered and the frontend lists the model."""
        return []

    def router_readiness(self, ctx: LaunchContext) -> list[Readiness]:
        """What to wait for after its router was restarted."""
        return []

    def observed_env(self) -> dict[str, str]:
        """Environment a benchmark adds so that :meth:`figures` has something to read."""
        return {}

    def figures(self, run: ObservedRun) -> dict[str, Any]:
        """The scheduler figures it can report (pauses, resumes, moves, paused count...);
        the keys it cannot measure are left out."""
        return {}

    def chosen_policy(self, given: Mapping[str, Path | None]) -> Path | None:
        """Its policy among a command line's policy options (``{"--policy": path, ...}``)."""
        if self.policy_option is None:
            return None
        return given.get(self.policy_option)


# Soft session affinity, as Dynamo's examples run the KV router for agents: a session's
# turns prefer the worker of its previous turn. Stock and the builtin both get it, so the
# comparison between them is the ThunderAgent plugin alone.
SOFT_SESSION_AFFINITY = (
    "--router-session-affinity-ttl-secs", "1800",
    "--router-session-affinity-mode", "soft",
)  # fmt: skip


class StockArm(Arm):
    """Stock Dynamo: the frontend's KV router with soft session affinity."""

    name = "stock"

    def frontend_args(self, ctx: LaunchContext) -> list[str]:
        return ["--router-mode", "kv", *SOFT_SESSION_AFFINITY]


class BuiltinArm(Arm):
    """Dynamo's Rust ThunderAgent inside the frontend's KV router."""

    name = "builtin"
    takes_policy = True
    default_policy = PARITY_POLICY
    policy_option = "--builtin-policy"

    def policy_path(self, ctx: LaunchContext) -> Path | None:
        return ctx.policy or ctx.run_dir / "thunderagent-policy.yaml"

    def prepare(self, ctx: LaunchContext) -> None:
        path = self.policy_path(ctx)
        if ctx.policy is None and path is not None:
            path.write_text(BUILTIN_POLICY_YAML, encoding="utf-8")

    def frontend_args(self, ctx: LaunchContext) -> list[str]:
        return ["--router-mode", "kv", "--router-policy-config", str(self.policy_path(ctx)),
                *SOFT_SESSION_AFFINITY]

    def readiness(self, ctx: LaunchContext) -> list[Readiness]:
        frontend_log = log_path(ctx.run_dir, "frontend")
        return [Readiness(lambda: log_contains(frontend_log, BUILTIN_ADMISSION_LOG_LINE),
                          f"{BUILTIN_ADMISSION_LOG_LINE!r} in the frontend log")]

    def observed_env(self) -> dict[str, str]:
        return {"DYN_LOG": BUILTIN_LOG_FILTER}

    def figures(self, run: ObservedRun) -> dict[str, Any]:
        parsed = parse_builtin_log(run.log("frontend"))
        if not parsed["seen"]:
            return {}
        paused_mean, paused_max = run.paused(parsed["samples"])
        return {"forced_resumes": parsed["forced_resumes"], "paused_mean": paused_mean,
                "paused_max": paused_max}


class _RouterComponentArm(Arm):
    """An arm whose router is a component of its own: one router instance sits behind the
    frontend, and its own routing decides the workers."""

    def frontend_args(self, ctx: LaunchContext) -> list[str]:
        return ["--router-mode", "round-robin", "--namespace", ctx.topology.namespace]


# The Python port's durations: its defaults (dynamo/thunderagent_router), the first three the
# parity policy's values, the last two priority offsets in seconds of waiting. Its router takes
# them as flags, not from a policy file.
PYTHON_PORT_SECONDS = {
    "--resume-timeout-seconds": 1800.0,
    "--scheduler-interval-seconds": 5.0,
    "--acting-decay-tau-seconds": 1.0,
    "--soft-demote-priority-jump": -2.0,
    "--resume-priority-boost": 1.0,
}


class DynamoPythonArm(_RouterComponentArm):
    """Dynamo's experimental Python ThunderAgent router component."""

    name = "dynamo-python"
    topology = Topology(router_namespace="tapy", router_component="thunderagent_router")

    def router(self, ctx: LaunchContext) -> RouterLaunch:
        # dynamo.thunderagent_router serves {DYN_NAMESPACE}.thunderagent_router.generate and
        # rewrites its worker endpoint's namespace to {DYN_NAMESPACE}-{suffix}.
        env = {"DYN_NAMESPACE": ctx.topology.namespace,
               "DYN_NAMESPACE_WORKER_SUFFIX": WORKER_NAMESPACE_SUFFIX}
        argv = [
            ctx.python, "-m", "dynamo.thunderagent_router",
            "--endpoint", ctx.topology.worker_endpoint,
            "--router-block-size", str(ctx.block_size),
            "--model-name", ctx.model_name,
            "--model-path", str(ctx.model_path),
            *ctx.router_args,
        ]  # fmt: skip
        return RouterLaunch(argv, env)

    def clock_args(self, time_scale: float) -> list[str]:
        # flag=value: a negative value as a word of its own would read as an option
        return [f"{flag}={seconds * time_scale:g}" for flag, seconds in PYTHON_PORT_SECONDS.items()]

    def figures(self, run: ObservedRun) -> dict[str, Any]:
        parsed = parse_python_router_log(run.log("router"))
        paused_mean, paused_max = run.paused(parsed["samples"])
        return {"pauses": parsed["pauses"], "resumes": parsed["resumes"],
                "paused_mean": paused_mean, "paused_max": paused_max}


class OursArm(_RouterComponentArm):
    """Our router component (``dynamo-thunderagent serve``), or ``router_cmd`` in its place.

    ``router_cmd`` items may use the placeholders {worker_endpoint}, {router_endpoint},
    {namespace}, {model_name}, {model_path}, {block_size}, {run_dir}, {python}; the same
    values are in the env as DTA_WORKER_ENDPOINT, DTA_ROUTER_ENDPOINT, DTA_NAMESPACE,
    DTA_MODEL_NAME, DTA_MODEL_PATH, DTA_BLOCK_SIZE, DTA_RUN_DIR, DTA_PYTHON.
    """

    name = "ours"
    topology = Topology(router_namespace="ta", router_component="router")
    takes_policy = True
    default_policy = EXTENDED_POLICY
    policy_option = "--policy"
    serves_state = True
    configures_host_tier = True
    reads_our_policy = True

    def policy_path(self, ctx: LaunchContext) -> Path | None:
        if ctx.router_cmd is not None:
            return None
        return ctx.policy or DEFAULT_POLICY  # both absolute (LocalStack resolves it)

    def router(self, ctx: LaunchContext) -> RouterLaunch:
        router_endpoint = ctx.topology.router_endpoint or ""
        values = {
            "worker_endpoint": ctx.topology.worker_endpoint,
            "router_endpoint": router_endpoint,
            "namespace": ctx.topology.namespace,
            "model_name": ctx.model_name,
            "model_path": str(ctx.model_path),
            "block_size": str(ctx.block_size),
            "run_dir": str(ctx.run_dir),
            "python": ctx.python,
        }
        env = {f"DTA_{key.upper()}": value for key, value in values.items()}
        if ctx.router_cmd is not None:
            argv = [item.format(**values) for item in ctx.router_cmd] + list(ctx.router_args)
            return RouterLaunch(argv, env)
        argv = [
            ctx.python, "-m", "dynamo_thunderagent", "serve",
            "--router-policy-config", str(self.policy_path(ctx)),
            "--endpoint", ctx.topology.worker_endpoint,
            "--router-endpoint", router_endpoint,
            "--model-name", ctx.model_name,
            "--model-path", str(ctx.model_path),
            "--block-size", str(ctx.block_size),
            "--state-port", str(ctx.state_port),
            *ctx.router_args,
        ]  # fmt: skip
        return RouterLaunch(argv, env)

    def readiness(self, ctx: LaunchContext) -> list[Readiness]:
        # The frontend lists the model before our router's worker watch has seen every
        # worker (about a second); agents started then would all land on the first one.
        return self.router_readiness(ctx)

    def router_readiness(self, ctx: LaunchContext) -> list[Readiness]:
        state_url = ctx.state_url
        if state_url is None:  # a custom router command: nothing to ask
            return []
        want = ctx.num_workers
        return [Readiness(lambda: router_sees_workers(state_url, want),
                          f"{want} live workers in the router's state")]

    def figures(self, run: ObservedRun) -> dict[str, Any]:
        state = run.state()
        figures: dict[str, Any] = (
            scheduler_figures(state) if state is not None else {"state_error": "no /state"}
        )
        figures["paused_mean"], figures["paused_max"] = run.paused(run.state_samples())
        return figures


def _registry(*arms: Arm) -> dict[str, Arm]:
    registry: dict[str, Arm] = {}
    for arm in arms:
        if arm.name in registry:
            raise ValueError(f"arm {arm.name!r} registered twice")
        registry[arm.name] = arm
    return registry


# Every arm, in the order a full comparison runs them.
ARMS: Mapping[str, Arm] = _registry(StockArm(), BuiltinArm(), DynamoPythonArm(), OursArm())
ARM_NAMES: tuple[str, ...] = tuple(ARMS)
# The arm every other is compared with (``steps_per_min_vs_stock``).
BASELINE_ARM: str = StockArm.name
# The headline pair the demo and the quick sweep run: the baseline and ours.
HEADLINE_ARMS: tuple[str, ...] = (StockArm.name, OursArm.name)


def arm_named(name: str) -> Arm:
    """The registered arm called ``name``; ValueError listing the arms if there is none."""
    try:
        return ARMS[name]
    except KeyError:
        raise ValueError(f"unknown arm {name!r}; choose from {', '.join(ARM_NAMES)}") from None
