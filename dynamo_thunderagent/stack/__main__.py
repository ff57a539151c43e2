"""``python -m dynamo_thunderagent.stack``: bring a local stack up; keep it up until signalled.

``--regime`` runs the stack as ``bench live`` runs that regime (KV pool, mocker clock and
timing tables; see :mod:`dynamo_thunderagent.stack.regime`); without it the mocker keeps its
built-in timing on a small pool, as before. Either way the sizing is printed on stderr before
anything starts, and the URL on stdout once the model is served.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from dynamo_thunderagent.bench.regimes import REGIME_NAMES
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.policy_files import POLICY_CLOCKS
from dynamo_thunderagent.stack.arms import ARM_NAMES, BASELINE_ARM
from dynamo_thunderagent.stack.discovery import DEFAULT_DISCOVERY, DISCOVERY_BACKENDS
from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig, StackError
from dynamo_thunderagent.stack.regime import (
    DEFAULT_BLOCKS,
    DEFAULT_SPEEDUP_RATIO,
    StackRegime,
    banner,
    prepare_stack_regime,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynamo-thunderagent stack",
        description="Start mocker workers, a Dynamo frontend and (per arm) a router on 127.0.0.1.",
    )
    parser.add_argument(
        "--arm", choices=ARM_NAMES, default=BASELINE_ARM,
        help=f"system under test (default: {BASELINE_ARM})",
    )
    parser.add_argument(
        "--discovery", choices=DISCOVERY_BACKENDS, default=DEFAULT_DISCOVERY,
        help="how the processes find each other: file (a store in the run dir, events over a "
        "loopback ZMQ broker) or etcd (the stack's own etcd and NATS servers on loopback, as "
        f"a deployment runs them; needs etcd and nats-server, see `make setup`) (default: "
        f"{DEFAULT_DISCOVERY})",
    )
    parser.add_argument(
        "--regime", choices=REGIME_NAMES, default=None,
        help="run a benchmark regime: the KV pool, mocker clock and timing tables `bench live "
        "--regime` uses (default: none, the mocker's built-in timing at --speedup-ratio "
        f"{DEFAULT_SPEEDUP_RATIO:g} on {DEFAULT_BLOCKS} blocks a worker)",
    )
    parser.add_argument(
        "--policy-clock", choices=POLICY_CLOCKS, default="regime",
        help="with --regime: regime (default) scales the routers' durations (policy seconds, "
        "the Python port's timing flags) by the regime's time scale, like the mocker; wall: "
        "as written",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="mocker worker processes (default: 2)"
    )
    parser.add_argument(
        "--blocks", type=int, default=None,
        help=f"KV blocks per worker (default: {DEFAULT_BLOCKS}; with --regime, the benchmark's "
        "sizing)",
    )
    parser.add_argument(
        "--block-size", type=int, default=16, help="tokens per KV block (default: 16)"
    )
    parser.add_argument(
        "--speedup-ratio", type=finite_float, default=None,
        help=f"mocker speedup (default: {DEFAULT_SPEEDUP_RATIO:g}; a --regime sets its own)",
    )
    parser.add_argument(
        "--policy", type=Path, default=None, help="router-policy YAML for --arm builtin or ours"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="frontend HTTP port (default: a free one)"
    )
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="logs/discovery dir (default: a temp dir)"
    )
    parser.add_argument(
        "--router-cmd",
        default=None,
        help="router command for --arm ours, as one shell-style string with {placeholders}",
    )
    parser.add_argument("--timeout", type=finite_float, default=60.0,
                        help="startup timeout in seconds")
    return parser


def config_from_args(args: argparse.Namespace) -> StackConfig:
    """The stack the flags describe, before any regime is applied."""
    speedup = args.speedup_ratio
    blocks = args.blocks
    return StackConfig(
        arm=args.arm,
        discovery=args.discovery,
        num_workers=args.workers,
        num_gpu_blocks=DEFAULT_BLOCKS if blocks is None else blocks,
        block_size=args.block_size,
        speedup_ratio=DEFAULT_SPEEDUP_RATIO if speedup is None else speedup,
        policy=args.policy,
        http_port=args.port,
        run_dir=args.run_dir,
        router_cmd=shlex.split(args.router_cmd) if args.router_cmd else None,
        startup_timeout_s=args.timeout,
    )


def regime_from_args(args: argparse.Namespace, config: StackConfig) -> StackRegime | None:
    """Size ``--regime`` (None without it) and apply it to ``config``; the regime's mocker
    profile goes into the run dir, which is created here when none was given.

    Raises ValueError for flags the regime decides itself.
    """
    name = args.regime
    if name is None:
        return None
    if args.speedup_ratio is not None:
        raise ValueError(
            f"--speedup-ratio: regime {name} sets the mocker's clock itself (its timing "
            "tables are scaled to it); drop the flag, or drop --regime"
        )
    if config.run_dir is None:
        config.run_dir = Path(tempfile.mkdtemp(prefix="dta-stack-"))
    regime = prepare_stack_regime(
        name, config.run_dir.resolve(), workers=config.num_workers,
        block_size=config.block_size, blocks=args.blocks, policy_clock=args.policy_clock,
    )  # fmt: skip
    regime.apply(config)
    return regime


def discovery_line(stack: LocalStack) -> str:
    """The banner's discovery line: the backend and where its servers (or store) are."""
    where = stack.describe_discovery()
    if stack.discovery is None:
        return (f"discovery: file (store {where['store']}, events over a loopback ZMQ "
                "broker); `doctor` or a process of your own reads it with "
                f"DYN_DISCOVERY_BACKEND=file DYN_FILE_KV={where['store']}")
    return (f"discovery: etcd at {where['etcd']}, NATS at {where['nats']} (events over "
            "NATS); the Dynamo processes get DYN_DISCOVERY_BACKEND=etcd, ETCD_ENDPOINTS, "
            "NATS_SERVER and DYN_EVENT_PLANE=nats (`doctor` needs the first two: "
            f"DYN_DISCOVERY_BACKEND=etcd ETCD_ENDPOINTS={where['etcd']})")


def run_stack_cli(args: argparse.Namespace) -> int:
    """Print the sizing, start the stack, print its URL (and a JSON summary), block until
    SIGINT/SIGTERM, stop."""
    try:
        config = config_from_args(args)
        config.validate()
        regime = regime_from_args(args, config)
        stack = LocalStack(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(banner(regime, config, stack.url, stack.model_path), file=sys.stderr, flush=True)
    print(f"stack: {discovery_line(stack)}", file=sys.stderr, flush=True)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stack.start()
        print(stack.url, flush=True)
        summary = {
            "url": stack.url,
            "arm": config.arm,
            "discovery": stack.describe_discovery(),
            "regime": None if regime is None else regime.describe(),
            "run_dir": str(stack.run_dir),
            "policy": None if config.policy is None else str(config.policy),  # what it reads
            "pids": {p.name: p.pid for p in stack.processes},
            "metrics": stack.metrics_urls,
            "state": stack.state_url,  # our router's GET /state (arm ours), else None
        }
        print(json.dumps(summary, indent=2), file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            stack.assert_alive()
        return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logs = stack.run_dir / "logs"
        if logs.is_dir():
            print(f"stack: stopped; the logs stay in {logs}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    return run_stack_cli(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
