"""``dynamo-thunderagent bench sim``: sweep arms x agent counts on the simulator, print a table.

The command line over the scenarios and sweeps of :mod:`~dynamo_thunderagent.bench.sim.run`.
``--regime`` picks a preset scenario and every other scenario flag overrides one field of it;
``--workload long`` and ``--workload fanout`` swap in a shape of ``bench/shapes.py``, sized for
the preset's worker. Without ``--agents`` N is swept from the capacity. The output (markdown,
or JSON with ``--json``) is deterministic; the wall time goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench import live_sweep
from dynamo_thunderagent.bench.live_sweep import (
    DEFAULT_FACTORS,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    agent_counts,
    live_setup,
    plan_sweep,
    pressure_factors,
    workload_shape,
)
from dynamo_thunderagent.bench.regimes import REGIMES, regime_named
from dynamo_thunderagent.bench.shapes import SHAPES, shape_token_factor
from dynamo_thunderagent.bench.sim.arms import ARM_NAMES, DEFAULT_POLICY, build_arm, parse_arms
from dynamo_thunderagent.bench.sim.run import (
    SWEEP_FACTORS,
    Scenario,
    SweepSpec,
    markdown,
    regime_scenario,
    run_one,
    run_sweep,
    sweep_agents,
    to_json,
    tool_time_p90,
)
from dynamo_thunderagent.bench.sim.simulation import SimFigures, check_background_fits
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE
from dynamo_thunderagent.bench.workload import Background
from dynamo_thunderagent.catalog import PluginError
from dynamo_thunderagent.config import PolicyError
from dynamo_thunderagent.flags import finite_float

ROLLOUT_CAP_S = 86_400.0
"""``--rollout``'s cap without ``--window-s``: a simulated day, past any batch of the shapes
here (the longest, real Claude Code sessions, end within two hours)."""


def _argument(parse: Callable[[str], list[Any]]) -> Callable[[str], list[Any]]:
    """``parse`` (ValueError on bad text) as an argparse type, whose message it shows."""
    def parsed(text: str) -> list[Any]:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parsed


_ints = _argument(agent_counts)
_factors = _argument(pressure_factors)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench sim`` flags; every scenario flag defaults to the regime's preset."""
    parser.add_argument("--regime", choices=sorted(REGIMES), default="calibrated",
                        help="timing regime and its preset scenario (default calibrated)")
    parser.add_argument("--arms", default=",".join(ARM_NAMES),
                        help=f"comma-separated arms (default {','.join(ARM_NAMES)})")
    parser.add_argument("--agents", type=_ints, default=None,
                        help="comma-separated N values (default: 0.5x-3x the KV capacity)")
    parser.add_argument("--factors", type=_factors, default=None,
                        help="without --agents, N values whose mean peak contexts add up to "
                        "these multiples of the KV capacity (default 0.5,1,1.5,2,3; with "
                        "--live-sizing bench live's, 0.5,1,2,3, and the largest sizes the "
                        "pool, as in bench live)")
    parser.add_argument("--workers", type=int, help="workers (preset: 2)")
    parser.add_argument("--blocks", type=int, help="KV blocks per worker")
    parser.add_argument("--block-size", type=int, help="tokens per KV block")
    parser.add_argument("--max-num-seqs", type=int, help="running requests per worker")
    parser.add_argument("--max-num-batched-tokens", type=int, help="token budget per pass")
    parser.add_argument("--workload", choices=("trace", "synthetic", *SHAPES),
                        help="replay a trace or generate agents (preset: calibrated replays "
                        "the shared trace, cheap-recompute is synthetic); long: sessions "
                        "with compaction, fanout: parents with subagents, agentic-code: "
                        "aiperf's coding-agent distributions")
    parser.add_argument("--trace", help="replay this JSONL trace (implies --workload trace)")
    parser.add_argument("--token-scale", type=finite_float, help="multiply every token count")
    parser.add_argument("--time-scale", type=finite_float, help="multiply every tool time")
    parser.add_argument("--no-reuse-output", action="store_true",
                        help="clients do not send replies back verbatim (like the live driver)")
    parser.add_argument("--background", metavar="C[:P:O]",
                        help="other tenants' traffic beside the agents: C loops of requests "
                        "without a session id, P unique prompt and O output tokens each "
                        "(default 800 and 64), back to back, as bench live --background "
                        "(with --live-sizing P and O are live's mocker tokens, as there)")
    parser.add_argument("--rollout", action="store_true",
                        help="one batch: N agents start together and run to their end, as an "
                             "RL rollout does; reports its makespan and run times (the window, "
                             f"default {ROLLOUT_CAP_S:g} s here, with --live-sizing live's "
                             "cap over the time scale, caps it)")
    parser.add_argument("--live-sizing", action="store_true",
                        help="size the run as bench live sizes the same regime, workload and "
                        "seed: its KV pool, agent counts and window, in the simulator's "
                        "units, the first N agents joined mid-program as live runs join "
                        "them; --background tokens count as live's (not with --blocks, "
                        "--token-scale or --time-scale)")
    parser.add_argument("--window-s", type=finite_float, help="steady window, simulated seconds")
    parser.add_argument("--warmup-s", type=finite_float, help="warm-up dropped before the window")
    parser.add_argument("--policy", help=f"router-policy YAML for arm ours "
                        f"(default {DEFAULT_POLICY.name})")
    parser.add_argument("--ttl-s", type=finite_float,
                        help="ttl-pinning TTL in seconds (default: p90 of the tool time)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=0,
                        help="processes to run the sweep on (default 0: one per CPU; "
                        "results do not depend on it)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--out", help="also write sim.json and sim.md into this directory")


# Past these a sweep runs for hours or never ends: simulated seconds (a week) and workers.
_FLAG_MAXIMA = {"window_s": 604_800, "warmup_s": 604_800, "workers": 1_024}


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """Build the sweep from parsed flags; raises ValueError naming a bad flag."""
    scenario = regime_scenario(args.regime)
    overrides: dict[str, Any] = {}
    for flag in ("workers", "blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                 "window_s", "warmup_s"):
        value = getattr(args, flag)
        if value is not None:
            if value < 0 or (value == 0 and flag != "warmup_s"):
                bound = ">= 0" if flag == "warmup_s" else "> 0"
                raise ValueError(f"--{flag.replace('_', '-')} must be {bound}, got {value}")
            most = _FLAG_MAXIMA.get(flag)
            if most is not None and value > most:
                raise ValueError(f"--{flag.replace('_', '-')} must be at most {most:,}, "
                                 f"got {value}")
            overrides[flag] = value
    if args.rollout:
        if args.warmup_s:
            raise ValueError("--warmup-s does not apply to --rollout: a batch is measured "
                             "from its start")
        overrides.update(rollout=True, warmup_s=0.0)
        overrides.setdefault("window_s", ROLLOUT_CAP_S)
    workload = scenario.workload
    if args.trace is not None:
        if args.workload is not None and args.workload != "trace":
            raise ValueError(f"--trace and --workload {args.workload} contradict each other")
        if not Path(args.trace).is_file():
            raise ValueError(f"--trace: no such file {args.trace}")
        overrides["trace"] = args.trace
    elif args.workload == "synthetic":
        overrides["trace"] = None
    elif args.workload in SHAPES:
        overrides["trace"] = None
        # Sized for the regime's preset worker (--blocks then changes the pressure only).
        pool = scenario.blocks * scenario.block_size
        workload = replace(SHAPES[args.workload], token_scale=shape_token_factor(pool))
    elif args.workload == "trace" and scenario.trace is None:
        if not DEFAULT_TRACE.is_file():
            raise ValueError(f"--workload trace: the shared trace {DEFAULT_TRACE} is missing; "
                             "pass --trace PATH")
        overrides["trace"] = str(DEFAULT_TRACE)
    if args.no_reuse_output:
        overrides["reuse_output"] = False
    if args.token_scale is not None:
        workload = replace(workload, token_scale=args.token_scale)
    if args.time_scale is not None:
        workload = replace(workload, time_scale=args.time_scale)
    workload.validate()
    scenario = replace(scenario, workload=workload, **overrides)
    if args.factors is not None and args.agents and not args.live_sizing:
        raise ValueError("--factors picks the agent counts and --agents names them; give "
                         "one (with --live-sizing, --factors also sizes the pool)")
    if args.background is not None:
        scenario = replace(scenario, background=Background.parse(args.background))
    live_agents: list[int] = []
    if args.live_sizing:  # before anything that reads the pool
        scenario, live_agents = live_sized(scenario, args)
    if scenario.background is not None:
        try:
            check_background_fits(scenario.background, scenario.engine())
        except ValueError as error:
            raise ValueError(f"--background: {error}") from None
    agents = args.agents or live_agents or sweep_agents(scenario, args.seed,
                                                        args.factors or SWEEP_FACTORS)
    ttl = args.ttl_s if args.ttl_s is not None else tool_time_p90(scenario, args.seed)
    return SweepSpec(scenario=scenario, arms=tuple(parse_arms(args.arms)),
                     agents=tuple(agents), seed=args.seed, policy=args.policy, ttl_s=ttl,
                     jobs=args.jobs if args.jobs > 0 else (os.cpu_count() or 1))


def live_sized(scenario: Scenario, args: argparse.Namespace) -> tuple[Scenario, list[int]]:
    """``scenario`` sized as ``bench live`` sizes the same regime, workload and seed, and the
    agent counts it would run (``--agents`` when given).

    Live runs shrink tokens by the setup's token scale and run the clock at its time scale;
    in the calibrated regimes a mocker token stands for ``1 / token_scale`` real tokens and
    a mocker second for ``1 / time_scale`` real seconds, which are the simulator's units, so
    the pool is the live one over the token scale, the workload at its real size and the
    window the live one over the time scale. In the cheap-recompute regime the simulator's
    timing is the mocker's own, so the units are the live ones. Other tenants' prompt and
    output tokens (``--background``) are live's mocker tokens, and a rollout's cap is live's
    over the time scale.
    """
    clashing = [flag for flag, value in (("--blocks", args.blocks),
                                         ("--token-scale", args.token_scale),
                                         ("--time-scale", args.time_scale)) if value is not None]
    if clashing:
        raise ValueError("--live-sizing sizes the pool and the scales as bench live does; "
                         f"leave out {', '.join(clashing)}")
    regime = regime_named(scenario.regime)
    if scenario.trace is not None:
        workload, trace = "trace", Path(scenario.trace)
    else:
        workload, trace = (args.workload if args.workload in SHAPES else regime.workload), None
    setup = live_setup(scenario.regime, workload=workload, trace=trace)
    sweep = plan_sweep(workload_shape(setup, args.seed), max_agents=setup.max_agents,
                       factors=args.factors or DEFAULT_FACTORS, agents=args.agents,
                       num_workers=scenario.workers, block_size=scenario.block_size)
    tokens = setup.token_scale if regime.calibrated else 1.0
    seconds = setup.time_scale if regime.calibrated else 1.0
    blocks = round(sweep.num_gpu_blocks / tokens)
    tier = regime.host_tier
    changes: dict[str, Any] = {
        "blocks": blocks,
        "host_blocks": tier.host_blocks(blocks) if tier is not None else 0,
        "workload": replace(scenario.workload, token_scale=setup.token_scale / tokens,
                            time_scale=setup.time_scale / seconds),
        "warm_start": not scenario.rollout,
        "live_sized": True,
    }
    if scenario.background is not None:  # given in live's (mocker) tokens
        changes["background"] = replace(
            scenario.background,
            prompt_tokens=max(1, round(scenario.background.prompt_tokens / tokens)),
            output_tokens=max(1, round(scenario.background.output_tokens / tokens)))
    if scenario.rollout and args.window_s is None:  # live's cap, not a simulated day
        changes["window_s"] = live_sweep.ROLLOUT_CAP_S / seconds
    elif args.window_s is None:
        # live's window is the whole run, warm-up included; the simulator's follows it
        changes["window_s"] = (DEFAULT_WINDOW_S - DEFAULT_WARMUP_S) / seconds
    if args.warmup_s is None and not scenario.rollout:
        changes["warmup_s"] = DEFAULT_WARMUP_S / seconds
    return replace(scenario, **changes), list(sweep.agents)


def run_case(argv: Sequence[str]) -> SimFigures:
    """One case of ``bench sim`` run in this process: ``argv`` is its flags, naming one arm
    and one ``--agents`` value. For the scripts beside docs/benchmarks.md that patch the
    simulator or the scheduler before a run; raises ValueError as :func:`spec_from_args`."""
    parser = argparse.ArgumentParser(prog="bench sim (one case)")
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(argv))
    if len(spec.arms) != 1 or len(spec.agents) != 1:
        raise ValueError(f"one case is one arm at one --agents value, not arms "
                         f"{','.join(spec.arms)} at {','.join(map(str, spec.agents))}")
    return run_one(spec.scenario, spec.arms[0], spec.agents[0], spec.seed, spec.policy,
                   spec.ttl_s)


def run_sim_cli(args: argparse.Namespace) -> int:
    """Entry point of ``bench sim``: 0 on success, 2 on bad flags or policy."""
    try:
        spec = spec_from_args(args)
        if "ours" in spec.arms:  # fail on a bad policy before simulating anything
            build_arm("ours", policy=spec.policy, ttl_s=spec.ttl_s, clock=lambda: 0.0)
        if args.ttl_s is not None and args.ttl_s <= 0:
            raise ValueError(f"--ttl-s must be > 0, got {args.ttl_s}")
        out = Path(args.out) if args.out is not None else None
        if out is not None:  # before the sweep: a folder that cannot be made loses no run
            if not args.out:
                raise ValueError("--out is empty: give a folder")
            out.mkdir(parents=True, exist_ok=True)
    except (ValueError, PolicyError, PluginError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: --out {args.out}: cannot make the folder: {error.strerror}",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        results = run_sweep(spec)
    except ValueError as error:  # a run that cannot go on (prompts larger than every pool)
        print(f"error: {error}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    text = markdown(spec, results)
    data = to_json(spec, results)
    if out is not None:
        (out / "sim.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        (out / "sim.md").write_text(text, encoding="utf-8")
    print(json.dumps(data, indent=2) if args.json else text, end="" if not args.json else "\n")
    # Wall time varies between machines, so it stays out of the (deterministic) output.
    print(f"simulated {len(results)} runs in {elapsed:.1f} s", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynamo-thunderagent bench sim",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    add_arguments(parser)
    return run_sim_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
