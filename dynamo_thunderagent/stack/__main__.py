"""``python -m dynamo_thunderagent.stack``: bring a local stack up; keep it up until signalled."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from dynamo_thunderagent.stack.arms import ARM_NAMES, BASELINE_ARM
from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig, StackError


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
        "--workers", type=int, default=2, help="mocker worker processes (default: 2)"
    )
    parser.add_argument(
        "--blocks", type=int, default=256, help="KV blocks per worker (default: 256)"
    )
    parser.add_argument(
        "--block-size", type=int, default=16, help="tokens per KV block (default: 16)"
    )
    parser.add_argument(
        "--speedup-ratio", type=float, default=10.0, help="mocker speedup (default: 10)"
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
    parser.add_argument("--timeout", type=float, default=60.0, help="startup timeout in seconds")
    return parser


def config_from_args(args: argparse.Namespace) -> StackConfig:
    import shlex

    return StackConfig(
        arm=args.arm,
        num_workers=args.workers,
        num_gpu_blocks=args.blocks,
        block_size=args.block_size,
        speedup_ratio=args.speedup_ratio,
        policy=args.policy,
        http_port=args.port,
        run_dir=args.run_dir,
        router_cmd=shlex.split(args.router_cmd) if args.router_cmd else None,
        startup_timeout_s=args.timeout,
    )


def run_stack_cli(args: argparse.Namespace) -> int:
    """Start the stack, print its URL (and a JSON summary), block until SIGINT/SIGTERM, stop."""
    try:
        config = config_from_args(args)
        config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = LocalStack(config)
    try:
        stack.start()
        print(stack.url, flush=True)
        summary = {
            "url": stack.url,
            "arm": config.arm,
            "run_dir": str(stack.run_dir),
            "pids": {p.name: p.pid for p in stack.processes},
            "metrics": stack.metrics_urls,
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


def main(argv: list[str] | None = None) -> int:
    return run_stack_cli(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
