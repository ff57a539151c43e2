"""The command line of ``dynamo-thunderagent bench live``: its options, their checks, the dry run.

The command's reference (what a run does, the workloads, the figures, the output) is the
docstring of :mod:`~dynamo_thunderagent.bench.live`, which runs the sweep this module
configures. Bad options raise ``ValueError`` naming the flag; :func:`run_live_cli` turns that
into exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from dynamo_thunderagent.bench.live import LiveConfig, default_out_dir, prepare_all, run_live
from dynamo_thunderagent.bench.live_sweep import (
    DEFAULT_ARMS,
    DEFAULT_FACTORS,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    QUICK_ARMS,
    QUICK_FACTORS,
    ROLLOUT_CAP_S,
    WORKLOADS,
    agent_counts,
    interleave,
    parse_arms,
    pressure_factors,
)
from dynamo_thunderagent.bench.regimes import REGIME_NAMES
from dynamo_thunderagent.bench.workload import Background
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.policy_files import POLICY_CLOCKS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``bench live`` (``--quick`` changes the defaults of the ones left unset)."""
    a = parser.add_argument
    a("--regime", choices=[*REGIME_NAMES, "all"], default="calibrated",
      help="timing regime (default calibrated; all = every regime in turn)")
    a("--arms", default=None,
      help=f"comma-separated arms in order: {', '.join(DEFAULT_ARMS)}, or "
           f"ours:<label>=<policy.yaml> (default: all of them; --quick: {','.join(QUICK_ARMS)})")
    a("--arm-policy", action="append", default=[], metavar="LABEL=PATH",
      help="add an ablation arm ours:LABEL running our router with PATH (repeatable)")
    a("--policy", type=Path, default=None,
      help="router-policy YAML of arm ours (default policies/thunderagent-extended.yaml)")
    a("--builtin-policy", type=Path, default=None,
      help="router-policy YAML of arm builtin (default policies/thunderagent.yaml)")
    a("--repeats", type=int, default=None, help="repeats of every arm x N (default 3; quick 1)")
    a("--factors", default=None,
      help="pressures to sweep, x KV capacity (default 0.5,1,2,3; quick 1,3)")
    a("--max-agents", type=int, default=None,
      help="N at the largest factor (default: calibrated 24, cheap-recompute 30)")
    a("--agents", default=None, help="explicit comma-separated N values (overrides --factors)")
    a("--blocks", type=int, default=None, help="KV blocks per worker (overrides the sizing)")
    a("--workers", type=int, default=2, help="mocker workers (default 2)")
    a("--window", type=finite_float, default=None,
      help="seconds of turns per run (default 40; quick 30; with --rollout the batch's cap, "
      f"default {ROLLOUT_CAP_S:g})")
    a("--warmup", type=finite_float, default=None,
      help="seconds dropped from the steady window (default 10; quick 8; --rollout: none)")
    a("--drain", type=finite_float, default=5.0,
      help="most seconds for turns in flight (default 5)")
    a("--request-timeout", type=finite_float, default=300.0, help="client timeout per request")
    a("--seed", type=int, default=0)
    a("--workload", choices=["auto", *WORKLOADS], default="auto",
      help="agents: auto (calibrated: trace, cheap-recompute: toy), trace, swe, toy, "
      "long (sessions with compaction), fanout (parents with subagents), agentic-code "
      "(aiperf's coding-agent distributions)")
    a("--trace", type=Path, default=None,
      help="replay this JSONL trace (implies --workload trace)")
    a("--token-scale", type=finite_float, default=None, help="override the regime's token scale")
    a("--time-scale", type=finite_float, default=None, help="override the regime's time scale")
    a("--policy-clock", choices=POLICY_CLOCKS, default="regime",
      help="regime (default): the routers' durations (policy seconds, the Python port's "
      "timing flags) are scaled by the time scale, like tools and engine; wall: as written")
    a("--out", type=Path, default=None, help="output folder (default bench-results/<UTC time>/)")
    a("--no-plots", action="store_true", help="skip the PNG plots")
    a("--dry-run", action="store_true", help="print the sizing and schedule, run nothing")
    a("--quick", action="store_true",
      help="a short check (under 5 min): calibrated, stock and ours, N at 1x and 3x, 1 repeat")
    a("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")
    a("--rollout", action="store_true",
      help="one batch per run, as an RL rollout: the N agents start together from their first "
      "turn and run to their end; reports the batch's makespan and run times")
    a("--background", default=None, metavar="C[:P:O]",
      help="other tenants' chat traffic beside the agents: C loops sending sessionless "
      "requests of P unique prompt tokens for O output tokens back to back (default "
      "P=800, O=64, mocker tokens), which no program-aware router tracks")


def _listed(flag: str, text: str, parse: Callable[[str], list[Any]]) -> list[Any]:
    try:
        return parse(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None


def config_from_args(args: argparse.Namespace) -> LiveConfig:
    """Validate the command line; raise ValueError naming the bad option."""
    quick = bool(args.quick)
    regimes = REGIME_NAMES if args.regime == "all" else (args.regime,)
    arms_text = args.arms or ",".join(QUICK_ARMS if quick else DEFAULT_ARMS)
    arms = parse_arms(arms_text, args.arm_policy, ours_policy=args.policy,
                      builtin_policy=args.builtin_policy)  # fmt: skip
    repeats = args.repeats if args.repeats is not None else (1 if quick else 3)
    factors = tuple(_listed("--factors", args.factors, pressure_factors)) if args.factors else (
        QUICK_FACTORS if quick else DEFAULT_FACTORS)  # fmt: skip
    agents = None
    if args.agents:
        agents = tuple(_listed("--agents", args.agents, agent_counts))
    window = args.window if args.window is not None else (
        ROLLOUT_CAP_S if args.rollout else 30.0 if quick else DEFAULT_WINDOW_S)
    warmup = args.warmup if args.warmup is not None else (
        0.0 if args.rollout else 8.0 if quick else DEFAULT_WARMUP_S)
    if args.rollout and warmup:
        raise ValueError("--warmup does not apply to --rollout: a batch is measured from its "
                         "start")
    if not 1 <= repeats <= 100:
        raise ValueError(f"--repeats must be in 1..100, got {repeats}")
    if window <= 0:
        raise ValueError(f"--window must be > 0, got {window}")
    if not 0 <= warmup < window:
        raise ValueError(f"--warmup must be in [0, --window), got {warmup}")
    for flag, value, ok, rule in (("--drain", args.drain, args.drain >= 0, ">= 0"),
                                  ("--request-timeout", args.request_timeout,
                                   args.request_timeout > 0, "> 0"),
                                  ("--workers", args.workers, 1 <= args.workers <= 64,
                                   "in 1..64")):
        if not ok:
            raise ValueError(f"{flag} must be {rule}, got {value}")
    if args.max_agents is not None and args.max_agents < 1:
        raise ValueError("--max-agents must be >= 1")
    config = LiveConfig(
        regimes=tuple(regimes), arms=tuple(arms), repeats=repeats, factors=factors,
        agents=agents, max_agents=args.max_agents, num_gpu_blocks=args.blocks,
        workers=args.workers, window_s=window, warmup_s=warmup, drain_s=args.drain,
        request_timeout_s=args.request_timeout, seed=args.seed, workload=args.workload,
        trace=args.trace, token_scale=args.token_scale, time_scale=args.time_scale,
        out_dir=args.out or default_out_dir(), plots=not args.no_plots, quick=quick,
        background=Background.parse(args.background) if args.background else None,
        policy_clock=args.policy_clock, rollout=bool(args.rollout),
    )  # fmt: skip
    for regime in config.regimes:
        config.setup(regime)  # validates the regime's setup
    return config


def dry_run(config: LiveConfig, out: TextIO = sys.stdout) -> int:
    """Print the sizing and the schedule as JSON; start nothing."""
    plans: dict[str, Any] = {}
    agents: dict[str, list[int]] = {}
    for regime in config.regimes:
        setup, sweep = config.plan(regime)
        plans[regime] = {"setup": setup.describe(), "sweep": sweep.describe()}
        agents[regime] = list(sweep.agents)
    schedule = interleave(config.regimes, agents, [a.label for a in config.arms],
                          config.repeats)  # fmt: skip
    per_run = config.window_s + config.drain_s / 2 + 4.0
    print(json.dumps({
        "config": config.describe(), "regimes": plans,
        "schedule": [dataclasses.asdict(k) for k in schedule],
        "estimated_minutes": round(len(schedule) * per_run / 60, 1),
    }, indent=1), file=out)  # fmt: skip
    return 0


def run_live_cli(args: argparse.Namespace) -> int:
    """CLI entry of ``bench live``: 0 clean, 1 a run failed or saw errors, 2 bad options."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            return dry_run(config)
        except (ValueError, OSError) as error:  # a trace that cannot be read, a bad pool
            print(f"error: {error}", file=sys.stderr)
            return 2
    try:
        prepared = prepare_all(config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return run_live(config, as_json=args.json, prepared=prepared)

