"""``dynamo-thunderagent demo``: stock KV routing against our scheduler, past the KV knee.

What it runs
------------
One regime of ``bench live`` (``--regime``, see ``bench/regimes.py``) at one load: the KV
capacity is sized so that the agents' mean peak contexts add up to ``--pressure`` (3x) the
capacity, well past the knee where a request-level router starts to thrash. Each arm (stock,
then ours) gets a fresh local stack (mocker workers, Dynamo's frontend and, for ours, our
router component) and the same seeded agents for ``--window`` seconds; nothing else differs.

* ``calibrated`` (default): the shared SWE-agent trace (``../shared/traces``) replayed, with
  the mocker's prefill and decode tables fitted to the trace's GPU timings, so re-prefilling an
  evicted agent context costs what it costs on that deployment next to a decode step. When the
  trace is absent the synthetic SWE-agent workload runs instead, and the demo says so.
* ``cheap-recompute``: the mocker's built-in timing and short toy agents: re-prefill is cheap,
  so thrash costs hit rate but hardly throughput, and a program-aware scheduler has little to
  win (it should not lose much either).

Sizing, warm start, agents and every figure are ``bench live``'s (``prepare_regime``,
``run_plans``, ``Observer``, ``make_row``), so they mean what ``docs/benchmarks.md`` says.

What it prints and writes
-------------------------
A table with one column per arm: steps/min over the steady window ``[--warmup, --window)``,
prefix-cache hit rate, recomputed tokens (their share of what turns could reuse, and the
count), agent-run completion time (mean, p90, over the agents every arm finished inside its
run: the same programs, since every arm replays the same seeded agents, warm starts
included, each counted from the turn it joins at; each arm's own ``bench live`` mean over
whole runs is shown too), turn latency p50/p99
and the longest turn, admission waits (ours; a turn still waiting at the end is reported
with its wait so far), programs paused, pauses, resumes and moves (ours), then each arm's
ratios to the first.
Into ``--out`` (default ``bench-results/demo-<UTC time>/``): ``results.json`` (every figure,
the sizing, the timeline) and ``demo_<regime>.png`` (steps/min and hit rate over time, one
line per arm). One run per
arm on this machine: the figures are measured, never extrapolated.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dynamo_thunderagent.bench.demo_report import (
    SCHEMA,
    TimelineBucket,
    agent_run_times,
    paired_agent_runs,
    ratios,
    render_table,
    timeline,
)
from dynamo_thunderagent.bench.live import LiveConfig, PreparedRegime, machine_info, prepare_all
from dynamo_thunderagent.bench.live_observer import Observer
from dynamo_thunderagent.bench.live_report import make_row
from dynamo_thunderagent.bench.live_sweep import ArmSpec, RunKey, parse_arms, run_plans
from dynamo_thunderagent.bench.regimes import REGIMES
from dynamo_thunderagent.bench.runner import RunSpec, run_stack
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.stack.arms import ARM_NAMES, HEADLINE_ARMS

DEMO_REGIMES: tuple[str, ...] = ("calibrated", "cheap-recompute")
DEFAULT_PRESSURE = 3.0
# Two runs of 100 s plus start-up and drain: about 4 minutes on 2 cores. The 20 s warm-up
# drops the cold prefill of the warm-started agents' histories.
DEFAULT_WINDOW_S = 100.0
DEFAULT_WARMUP_S = 20.0
BUCKET_S = 10.0


@dataclass
class DemoConfig:
    """Everything one demo depends on (written into ``results.json``)."""

    regime: str = "calibrated"
    arms: tuple[ArmSpec, ...] = field(
        default_factory=lambda: tuple(parse_arms(",".join(HEADLINE_ARMS)))
    )
    agents: int | None = None  # None: the regime's (bench live's largest N)
    pressure: float = DEFAULT_PRESSURE
    num_gpu_blocks: int | None = None  # None: sized from the workload and ``pressure``
    workers: int = 2
    block_size: int = 16
    window_s: float = DEFAULT_WINDOW_S
    warmup_s: float = DEFAULT_WARMUP_S
    drain_s: float = 5.0
    request_timeout_s: float = 300.0
    seed: int = 0
    trace: Path | None = None  # None: the shared trace when present
    out_dir: Path = field(default_factory=lambda: default_out_dir())
    plot: bool = True
    bucket_s: float = BUCKET_S

    def live_config(self) -> LiveConfig:
        """The one-point ``bench live`` sweep the demo is: N agents at ``pressure`` x
        capacity (capacity sized for exactly that N), one repeat."""
        return LiveConfig(
            regimes=(self.regime,), arms=self.arms, repeats=1, factors=(self.pressure,),
            max_agents=self.agents, num_gpu_blocks=self.num_gpu_blocks, workers=self.workers,
            block_size=self.block_size, window_s=self.window_s, warmup_s=self.warmup_s,
            drain_s=self.drain_s, request_timeout_s=self.request_timeout_s, seed=self.seed,
            workload="trace" if self.trace is not None else "auto", trace=self.trace,
            out_dir=self.out_dir, plots=False,
        )  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "regime": self.regime, "arms": [a.describe() for a in self.arms],
            "agents": self.agents, "pressure": self.pressure, "workers": self.workers,
            "block_size": self.block_size, "window_s": self.window_s,
            "warmup_s": self.warmup_s, "drain_s": self.drain_s,
            "request_timeout_s": self.request_timeout_s, "seed": self.seed,
            "bucket_s": self.bucket_s, "out_dir": str(self.out_dir),
        }  # fmt: skip


def default_out_dir() -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("bench-results") / f"demo-{stamp}"


def workload_note(config: DemoConfig, prepared: PreparedRegime) -> str | None:
    """Why the demo does not replay the trace its regime replays by default, if it does not."""
    if not REGIMES[config.regime].replays_trace or prepared.setup.workload == "trace":
        return None
    return (
        f"the SWE-agent trace is not at {DEFAULT_TRACE}; replaying the synthetic SWE-agent "
        "workload instead (shorter contexts: ours gains less there, see docs/benchmarks.md)"
    )


@dataclass
class ArmOutcome:
    """One arm's run: its ``bench live`` row, its timeline, and its finished agent runs
    (session id -> completion time; None when the run failed)."""

    row: dict[str, Any]
    timeline: list[TimelineBucket]
    agent_runs: dict[str, float] | None


def run_arm(
    arm: ArmSpec, index: int, prepared: PreparedRegime, config: DemoConfig,
    say: Callable[[str], None],
) -> ArmOutcome:  # fmt: skip
    """One fresh stack for ``arm``, the regime's agents for the window; never raises."""
    setup, sweep = prepared.setup, prepared.sweep
    agents = sweep.agents[0]
    spec = RunSpec(
        arm=arm.base, label=arm.label, plans=lambda: run_plans(setup, config.seed, agents),
        agents=agents, window_s=config.window_s, warmup_s=config.warmup_s,
        drain_s=config.drain_s, request_timeout_s=config.request_timeout_s,
        num_workers=config.workers, num_gpu_blocks=sweep.num_gpu_blocks,
        block_size=config.block_size, speedup_ratio=setup.speedup_ratio,
        # As bench live runs the arm: durations on the regime's clock, told of a host tier.
        policy=prepared.policy_for(arm), router_args=prepared.router_args_for(arm),
        mocker_args=prepared.mocker_args, extra_env=arm.arm.observed_env(),
        job=f"demo-{setup.regime}-{config.seed}",
    )  # fmt: skip
    observer = Observer(arm.arm, (config.warmup_s, config.window_s))
    result = run_stack(spec, say, observer)
    key = RunKey(setup.regime, 0, agents, arm.label, index, index)
    row = make_row(key, result, pressure=sweep.pressures[0], warmup_s=config.warmup_s,
                   window_s=config.window_s)  # fmt: skip
    row.pop("turn_latencies_s", None)
    if result.run is None:
        return ArmOutcome(row, [], None)
    records = result.run.records
    buckets = timeline(records, bucket_s=config.bucket_s, until_s=config.window_s)
    return ArmOutcome(row, buckets, agent_run_times(records))


def pair_agent_runs(outcomes: list[ArmOutcome]) -> None:
    """Add each arm's completion time of the agent runs every arm finished to its row."""
    ran = {o.row["arm"]: o.agent_runs for o in outcomes if o.agent_runs is not None}
    paired = paired_agent_runs(ran)
    for o in outcomes:
        o.row.update(paired.get(o.row["arm"], {}))


def build_report(
    config: DemoConfig, prepared: PreparedRegime, outcomes: list[ArmOutcome],
    meta: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The demo's JSON document: config, sizing, every arm's figures, ratios, timelines."""
    rows = [o.row for o in outcomes]
    base = rows[0] if rows else None
    return {
        "schema": SCHEMA,
        **meta,
        "config": config.describe(),
        "regime": {"name": config.regime, "summary": REGIMES[config.regime].summary,
                   **prepared.describe()},
        "agents": prepared.sweep.agents[0],
        "pressure": round(prepared.sweep.pressures[0], 3),
        "workload_note": workload_note(config, prepared),
        "arms": {r["arm"]: r for r in rows},
        "ratios": {f"{r['arm']}/{base['arm']}": ratios(r, base)
                   for r in rows[1:]} if base else {},
        "steps_per_min_ratio": {f"{r['arm']}/{base['arm']}": ratios(r, base)["steps_per_min"]
                                for r in rows[1:]} if base else {},
        "timeline": {o.row["arm"]: [b.to_dict() for b in o.timeline] for o in outcomes},
    }  # fmt: skip


def run_demo_config(config: DemoConfig, *, as_json: bool, out: TextIO = sys.stdout,
                    prepared: PreparedRegime | None = None) -> int:
    """Run every arm, write ``results.json`` and the PNG, print the table (or the JSON).

    Returns 0 when every arm ran with zero errors, 1 otherwise.
    """
    progress = sys.stderr if as_json else out

    def say(line: str) -> None:
        print(line, file=progress, flush=True)

    t0 = time.monotonic()
    started_at = dt.datetime.now(dt.timezone.utc)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    if prepared is None:
        prepared = prepare_all(config.live_config())[config.regime]
    sweep, setup = prepared.sweep, prepared.setup
    note = workload_note(config, prepared)
    say(
        f"demo: regime {config.regime} ({REGIMES[config.regime].summary})\n"
        f"demo: workload {setup.workload}; {config.workers} mocker workers x "
        f"{sweep.num_gpu_blocks} blocks x {config.block_size} tokens = "
        f"{sweep.capacity_tokens:,} KV tokens; {sweep.agents[0]} closed-loop agents, mean peak "
        f"context {sweep.mean_peak_tokens:,.0f} tokens = {sweep.pressures[0]:.1f}x capacity; "
        f"window {config.window_s:.0f}s (steady after {config.warmup_s:.0f}s); arms "
        f"{', '.join(a.label for a in config.arms)}; seed {config.seed}"
        + (f"\ndemo: note: {note}" if note else "")
        + (f"\ndemo: note: {sweep.note}" if sweep.note else "")
    )
    outcomes = [run_arm(arm, i, prepared, config, say) for i, arm in enumerate(config.arms)]
    pair_agent_runs(outcomes)
    meta: dict[str, Any] = {
        "machine": machine_info(),
        "started_at": started_at.isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    report = build_report(config, prepared, outcomes, meta)
    plot_path = config.out_dir / f"demo_{config.regime}.png"
    report["plot"] = None
    if config.plot:
        try:
            from dynamo_thunderagent.bench.plots import write_timeline

            title = (f"{config.regime}: {sweep.agents[0]} agents at "
                     f"{sweep.pressures[0]:.1f}x KV capacity")  # fmt: skip
            write_timeline(report["timeline"], plot_path, title=title,
                           warmup_s=config.warmup_s)  # fmt: skip
            report["plot"] = str(plot_path)
        except ImportError as error:
            say(f"plot skipped ({error}); install matplotlib")
    results_path = config.out_dir / "results.json"
    results_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    rows = [o.row for o in outcomes]
    if as_json:
        print(json.dumps(report, indent=1), file=out, flush=True)
    else:
        print("", file=out)
        print(render_table(rows), file=out)
        print(
            f"\nOne run per arm on this machine, same agents (seed {config.seed}), "
            f"{sweep.agents[0]} agents at {sweep.pressures[0]:.1f}x the KV capacity. Steps/min, "
            "hit rate and turn latency over the steady window; recomputed tokens: tokens cached "
            "on a program's previous turn and prefilled again (whole KV blocks), and their "
            "share of the tokens a turn could have reused (arms run different numbers of "
            "turns, so the share compares, not the count); agent-run "
            "completion: first turn sent to last turn answered, over the same agents in every "
            "arm (those every arm finished: in a short window, mostly the agents the run "
            "starts with, which join their programs mid-way at the same turn in every arm, "
            "counted from there); turn latency includes admission wait.",
            file=out,
        )
        if note:
            print(f"Note: {note}.", file=out)
        if report["plot"]:
            print(f"plot: {report['plot']}", file=out)
        print(f"results: {results_path}", file=out, flush=True)
    failed = any(r.get("error") or r.get("errors") for r in rows)
    return 1 if failed else 0


# ============================================================================================
# Command line
# ============================================================================================


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--regime", choices=DEMO_REGIMES, default="calibrated",
      help="calibrated (default: the SWE-agent trace on timing fitted to a GPU, where "
           "re-prefill is expensive) or cheap-recompute (the mocker's default timing)")
    a("--arms", default=",".join(HEADLINE_ARMS),
      help=f"comma-separated, in order, the first is the baseline; from {', '.join(ARM_NAMES)} "
           f"(default {','.join(HEADLINE_ARMS)}; each arm adds a run of --window seconds)")
    a("--policy", type=Path, default=None,
      help="router-policy YAML for arm ours (default policies/thunderagent-extended.yaml)")
    a("--agents", type=int, default=None,
      help="closed-loop agents (default: the regime's, 24 calibrated, 30 cheap-recompute); "
           "the KV capacity is sized for them at --pressure")
    a("--pressure", type=finite_float, default=DEFAULT_PRESSURE,
      help=f"agents' mean peak context / KV capacity (default {DEFAULT_PRESSURE:g})")
    a("--blocks", type=int, default=None, help="KV blocks per worker (overrides --pressure)")
    a("--window", "--duration", dest="window", type=finite_float, default=DEFAULT_WINDOW_S,
      help=f"seconds each arm launches turns (default {DEFAULT_WINDOW_S:g})")
    a("--warmup", type=finite_float, default=None,
      help=f"seconds left out of the steady window (default min({DEFAULT_WARMUP_S:g}, "
           "window / 4))")
    a("--drain", type=finite_float, default=5.0,
      help="most seconds for turns in flight (default 5)")
    a("--seed", type=int, default=0)
    a("--trace", type=Path, default=None,
      help=f"replay this JSONL trace (calibrated regime; default {DEFAULT_TRACE.name} "
           "from ../shared/traces when present)")
    a("--out", type=Path, default=None,
      help="output folder (default bench-results/demo-<UTC time>/)")
    a("--no-plot", action="store_true", help="skip the PNG")
    a("--json", action="store_true", help="print one JSON object on stdout (progress on stderr)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """Validate the command line; raise ValueError naming the bad option."""
    arms = tuple(parse_arms(args.arms, ours_policy=args.policy))
    if args.agents is not None and args.agents < 1:
        raise ValueError("--agents must be >= 1")
    if args.pressure <= 0:
        raise ValueError("--pressure must be > 0")
    if args.blocks is not None and args.blocks < 1:
        raise ValueError("--blocks must be >= 1")
    if args.window <= 0 or args.drain < 0:
        raise ValueError("--window must be > 0 and --drain >= 0")
    warmup = min(DEFAULT_WARMUP_S, args.window / 4) if args.warmup is None else args.warmup
    if not 0 <= warmup < args.window:
        raise ValueError(f"--warmup must be in [0, --window), got {warmup}")
    if args.trace is not None and args.regime != "calibrated":
        raise ValueError("--trace: only the calibrated regime replays a trace")
    if args.trace is not None and not args.trace.is_file():
        raise ValueError(f"--trace: {args.trace} not found")
    config = DemoConfig(
        regime=args.regime, arms=arms, agents=args.agents, pressure=args.pressure,
        num_gpu_blocks=args.blocks, window_s=args.window, warmup_s=warmup,
        drain_s=args.drain, seed=args.seed, trace=args.trace,
        out_dir=args.out or default_out_dir(), plot=not args.no_plot,
    )  # fmt: skip
    config.live_config().setup(config.regime)  # validates the regime's setup
    return config


def run_demo(args: argparse.Namespace) -> int:
    """CLI entry: 0 when every arm ran with zero errors, 1 otherwise, 2 on bad options."""
    try:
        config = config_from_args(args)
        # Every arm's policy derived before the first run: a bad one stops the demo here.
        prepared = prepare_all(config.live_config())[config.regime]
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return run_demo_config(config, as_json=args.json, prepared=prepared)
