"""``dynamo-thunderagent``: validate policies, serve the router, run the stack, benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from dynamo_thunderagent.catalog import PluginError, load_policy
from dynamo_thunderagent.config import PolicyError


def _validate(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.dynamo.reload import check_policy  # what serve checks too

    try:
        resolved = load_policy(args.path)
        check_policy(resolved)
    except (PolicyError, PluginError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(resolved.describe(), indent=2))
    return 0


def _bench_overhead(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.bench.overhead import run_overhead

    return run_overhead(args)


def _serve(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.dynamo.serve import run_serve

    return run_serve(args)


def _doctor(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.dynamo.doctor import run_doctor

    return run_doctor(args)


def _top(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.top import run_top

    return run_top(args)


def _demo(args: argparse.Namespace) -> int:
    from dynamo_thunderagent.bench.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynamo-thunderagent",
        description="Program-aware (ThunderAgent) scheduling for NVIDIA Dynamo.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = sub.add_parser("validate", help="check a router-policy YAML and print it resolved")
    validate.add_argument("path", help="router-policy YAML (e.g. policies/thunderagent.yaml)")
    validate.set_defaults(func=_validate)

    serve = sub.add_parser(
        "serve", help="run the router component (classifier + selector) in front of workers")
    from dynamo_thunderagent.dynamo.serve import add_arguments

    add_arguments(serve)
    serve.set_defaults(func=_serve)

    doctor = sub.add_parser(
        "doctor", help="check a running deployment for what silently bypasses the scheduler")
    from dynamo_thunderagent.dynamo.doctor import add_arguments as add_doctor_arguments

    add_doctor_arguments(doctor)
    doctor.set_defaults(func=_doctor)

    top = sub.add_parser(
        "top", help="a live terminal view of a running router's /state (usage, programs, "
                    "waits, decisions)")
    from dynamo_thunderagent.top import add_arguments as add_top_arguments

    add_top_arguments(top)
    top.set_defaults(func=_top)

    from dynamo_thunderagent.stack.__main__ import build_parser as stack_parser
    from dynamo_thunderagent.stack.__main__ import run_stack_cli

    stack = sub.add_parser(
        "stack", parents=[stack_parser()], add_help=False, conflict_handler="resolve",
        help="start a loopback Dynamo stack (mocker workers, frontend, router) until Ctrl-C")
    stack.set_defaults(func=run_stack_cli)

    from dynamo_thunderagent.bench.demo import add_arguments as add_demo_arguments

    demo = sub.add_parser(
        "demo", help="stock KV routing vs this scheduler on a local stack, side by side")
    add_demo_arguments(demo)
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    overhead = bench_sub.add_parser(
        "overhead", help="time one admission decision and one tick at fleet scale")
    overhead.add_argument("--workers", type=int, default=64)
    overhead.add_argument("--dp-ranks", type=int, default=8)
    overhead.add_argument("--programs", type=int, default=2000)
    overhead.add_argument("--ticks", type=int, default=200)
    overhead.add_argument("--admissions", type=int, default=5000)
    overhead.add_argument("--seed", type=int, default=0)
    overhead.add_argument("--policy", help="router-policy YAML whose thunderagent parameters "
                          "are timed (default: the shipped extended policy)")
    overhead.add_argument("--json", action="store_true", help="print one JSON object")
    overhead.set_defaults(func=_bench_overhead)
    from dynamo_thunderagent.bench.trace_command import add_arguments as add_trace_arguments
    from dynamo_thunderagent.bench.trace_command import run_trace_cli

    trace = bench_sub.add_parser(
        "trace", help="write a JSONL trace (the format --trace replays) from a generated "
        "workload or from public agent traces")
    add_trace_arguments(trace)
    trace.set_defaults(func=run_trace_cli)
    from dynamo_thunderagent.bench.sim.command import add_arguments as add_sim_arguments
    from dynamo_thunderagent.bench.sim.command import run_sim_cli

    sim = bench_sub.add_parser(
        "sim", help="simulate arms x agent counts on a discrete-event model of the workers")
    add_sim_arguments(sim)
    sim.set_defaults(func=run_sim_cli)
    from dynamo_thunderagent.bench.live_cli import add_arguments as add_live_arguments
    from dynamo_thunderagent.bench.live_cli import run_live_cli

    live = bench_sub.add_parser(
        "live", help="interleaved, repeated A/B runs of every arm x N on local stacks")
    add_live_arguments(live)
    live.set_defaults(func=run_live_cli)
    from dynamo_thunderagent.bench.clients import add_arguments as add_clients_arguments
    from dynamo_thunderagent.bench.clients import run_clients_cli

    clients = bench_sub.add_parser(
        "clients", help="aiperf (a standard benchmark client) against each arm, side by side")
    add_clients_arguments(clients)
    clients.set_defaults(func=run_clients_cli)
    from dynamo_thunderagent.bench.reliability import add_arguments as add_reliability_arguments
    from dynamo_thunderagent.bench.reliability import run_reliability_cli

    reliability = bench_sub.add_parser(
        "reliability", help="a session-id flood and a soak with random faults, with figures")
    add_reliability_arguments(reliability)
    reliability.set_defaults(func=run_reliability_cli)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
