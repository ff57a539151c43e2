"""``dynamo-thunderagent demo``: stock KV routing vs our scheduler on one local stack, side by side.

For each arm in turn: start the embedded stack (mocker workers, Dynamo frontend and, for arm
``ours``, our router component), drive a closed-loop group of agents whose contexts exceed
the KV capacity (by ``--pressure``, 2.5x by default), read our router's scheduler counters,
stop the stack, and summarise. Then print one table with every arm's figures and the
steps/min ratio of each arm to the first.

The demo reports what it measured in one run per arm on this machine; nothing is
extrapolated. The KV capacity is sized from the agents' plans, so ``--agents`` moves the
pressure only if ``--blocks`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dynamo_thunderagent.bench.runner import ArmResult, RunSpec, run_stack
from dynamo_thunderagent.bench.workload import (
    AgentPlan,
    WorkloadSpec,
    agent_stream,
    load_trace,
    replay_stream,
)
from dynamo_thunderagent.stack.arms import ARM_NAMES, ARMS, HEADLINE_ARMS, arm_named

# Agents of 8-16 turns: a 256-token shared system prompt, 256-512 tokens of task, then
# 64-192 tool tokens and 16-48 generated tokens per turn (about 2.5k tokens at the peak).
# Tool times follow workload.md's mixture at a quarter of the real durations (median 0.5 s,
# tail capped at 150 s), so a 60 s window sees many turns and some long-ACTING programs.
DEMO_SPEC = WorkloadSpec(
    turns=(8, 16),
    system_prompt_tokens=256,
    first_turn_tokens=(256, 512),
    tool_output_tokens=(64, 192),
    output_tokens=(16, 48),
    time_scale=0.25,
    session_prefix="demo",
)


@dataclass
class DemoConfig:
    """Everything one demo run depends on (printed with the results)."""

    arms: tuple[str, ...] = HEADLINE_ARMS
    agents: int = 16
    duration_s: float = 60.0
    warmup_s: float = 10.0
    drain_s: float = 10.0
    seed: int = 0
    num_workers: int = 2
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: sized from the plans and ``pressure``
    pressure: float = 2.5
    speedup_ratio: float = 1.0
    request_timeout_s: float = 60.0
    trace: Path | None = None
    trace_token_scale: float = 0.07
    policy: Path | None = None  # router-policy YAML for arm ours (None: the launcher's default)
    spec: WorkloadSpec = field(default_factory=lambda: DEMO_SPEC)

    def plans(self) -> Iterator[AgentPlan]:
        """The agent stream every arm replays (same seed, same programs)."""
        if self.trace is not None:
            replayed = load_trace(self.trace, self.trace_token_scale, 1.0 / self.speedup_ratio)
            return replay_stream(replayed, self.seed)
        return agent_stream(self.spec, self.seed)


@dataclass
class Sizing:
    """KV capacity and how far the first wave of agents exceeds it."""

    num_gpu_blocks: int
    capacity_tokens: int
    peak_total_tokens: int
    peak_max_tokens: int

    @property
    def pressure(self) -> float:
        return self.peak_total_tokens / self.capacity_tokens


def size_capacity(config: DemoConfig) -> Sizing:
    """Blocks per worker so the first ``agents`` programs' peak contexts are ``pressure`` x
    capacity, but never so few that one program could not fit a worker (x1.25)."""
    stream = config.plans()
    first = [next(stream) for _ in range(config.agents)]
    peak_total = sum(p.peak_context_tokens for p in first)
    peak_max = max(p.peak_context_tokens for p in first)
    blocks = config.num_gpu_blocks
    if blocks is None:
        wanted = peak_total / config.pressure / (config.num_workers * config.block_size)
        floor = 1.25 * peak_max / config.block_size
        blocks = math.ceil(max(wanted, floor))
    return Sizing(
        num_gpu_blocks=blocks,
        capacity_tokens=blocks * config.block_size * config.num_workers,
        peak_total_tokens=peak_total,
        peak_max_tokens=peak_max,
    )


def run_arm(arm: str, config: DemoConfig, sizing: Sizing, say: Callable[[str], None]) -> ArmResult:
    """Start the stack for ``arm``, drive the agents, read state, stop; never raises."""
    spec = RunSpec(
        arm=arm, plans=config.plans, agents=config.agents, window_s=config.duration_s,
        warmup_s=config.warmup_s, drain_s=config.drain_s,
        request_timeout_s=config.request_timeout_s, num_workers=config.num_workers,
        num_gpu_blocks=sizing.num_gpu_blocks, block_size=config.block_size,
        speedup_ratio=config.speedup_ratio,
        policy=arm_named(arm).chosen_policy({"--policy": config.policy}),
        job=f"demo-{config.seed}",
    )  # fmt: skip
    return run_stack(spec, say)


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render_table(results: list[ArmResult]) -> str:
    """The side-by-side table of the arms' figures (arms as columns)."""

    def m(result: ArmResult, name: str, spec: str = "") -> str:
        metrics = result.metrics
        return "-" if metrics is None else _fmt(getattr(metrics, name), spec)

    def s(result: ArmResult, name: str, spec: str = "") -> str:
        return _fmt(result.scheduler.get(name), spec) if result.scheduler else "-"

    rows: list[tuple[str, Callable[[ArmResult], str]]] = [
        ("steps/min (steady window)", lambda r: m(r, "steps_per_min", ".1f")),
        ("turns completed / errors", lambda r: f"{m(r, 'turns_ok')} / {m(r, 'errors')}"),
        ("agents completed", lambda r: m(r, "agents_completed")),
        ("prefix-cache hit rate", lambda r: m(r, "hit_rate", ".3f")),
        ("recomputed tokens", lambda r: m(r, "recomputed_tokens", ",")),
        ("  of reusable tokens", lambda r: m(r, "recomputed_fraction", ".1%")),
        ("turn latency p50 (s)", lambda r: m(r, "latency_p50_s", ".2f")),
        ("turn latency p99 (s)", lambda r: m(r, "latency_p99_s", ".2f")),
        (
            "pauses / resumes / moves",
            lambda r: (
                f"{s(r, 'pauses')} / {s(r, 'resumes')} / {s(r, 'moves')}" if r.scheduler else "-"
            ),
        ),
        ("admission wait p50 (s)", lambda r: s(r, "admission_wait_p50_s", ".2f")),
        ("admission wait p99 (s)", lambda r: s(r, "admission_wait_p99_s", ".2f")),
        ("admission wait max (s)", lambda r: s(r, "admission_wait_max_s", ".2f")),
    ]
    base = results[0]

    def ratio_cell(result: ArmResult) -> str:
        return "1.00x" if result is base else _ratio(result, base)

    if len(results) > 1:
        rows.append((f"steps/min ratio to {base.arm}", ratio_cell))
    label_w = max(len(label) for label, _ in rows)
    col_w = max(12, *(len(r.arm) for r in results))
    lines = [f"{'':<{label_w}}  " + "  ".join(f"{r.arm:>{col_w}}" for r in results)]
    for label, cell in rows:
        lines.append(f"{label:<{label_w}}  " + "  ".join(f"{cell(r):>{col_w}}" for r in results))
    for r in results:
        if r.error:
            lines.append(f"{r.arm}: {r.error}")
    return "\n".join(lines)


def _ratio(arm: ArmResult, base: ArmResult) -> str:
    value = steps_ratio(arm, base)
    return "-" if value is None else f"{value:.2f}x"


def steps_ratio(arm: ArmResult, base: ArmResult) -> float | None:
    if arm.metrics is None or base.metrics is None or base.metrics.steps_per_min == 0:
        return None
    return arm.metrics.steps_per_min / base.metrics.steps_per_min


def run_demo_config(config: DemoConfig, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Run every arm, print the table (or one JSON object); 0 if every arm ran cleanly."""
    progress_stream = sys.stderr if as_json else out

    def say(line: str) -> None:
        print(line, file=progress_stream, flush=True)

    sizing = size_capacity(config)
    workload = f"trace {config.trace}" if config.trace else "synthetic agents (DEMO_SPEC)"
    say(
        f"demo: {config.num_workers} mocker workers x {sizing.num_gpu_blocks} blocks x "
        f"{config.block_size} tokens = {sizing.capacity_tokens:,} KV tokens; "
        f"{config.agents} closed-loop {workload}, seed {config.seed}; first wave peak context "
        f"{sizing.peak_total_tokens:,} tokens = {sizing.pressure:.1f}x capacity; "
        f"window {config.duration_s:.0f}s (steady after {config.warmup_s:.0f}s), "
        f"mocker speedup {config.speedup_ratio:g}"
    )
    results = [run_arm(arm, config, sizing, say) for arm in config.arms]
    failed = any(r.error or r.metrics is None or r.metrics.errors for r in results)
    if as_json:
        payload = {
            "config": {
                "arms": list(config.arms),
                "agents": config.agents,
                "duration_s": config.duration_s,
                "warmup_s": config.warmup_s,
                "seed": config.seed,
                "num_workers": config.num_workers,
                "num_gpu_blocks": sizing.num_gpu_blocks,
                "block_size": config.block_size,
                "capacity_tokens": sizing.capacity_tokens,
                "first_wave_peak_tokens": sizing.peak_total_tokens,
                "pressure": round(sizing.pressure, 3),
                "speedup_ratio": config.speedup_ratio,
                "trace": str(config.trace) if config.trace else None,
            },
            "arms": {r.arm: r.to_dict() for r in results},
            "steps_per_min_ratio": {
                f"{r.arm}/{results[0].arm}": steps_ratio(r, results[0]) for r in results[1:]
            },
        }
        print(json.dumps(payload, indent=2), file=out, flush=True)
    else:
        print("", file=out)
        print(render_table(results), file=out)
        print(
            "\nOne run per arm on this machine, same agent programs (seed "
            f"{config.seed}). Recomputed tokens: prompt tokens cached on a program's previous "
            "turn but prefilled again (whole KV blocks). Latency includes admission wait.",
            file=out,
            flush=True,
        )
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=int, default=16, help="closed-loop agents (default 16)")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds each arm launches turns (default 60)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds dropped from steps/min (default: min(10, duration / 4))",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=10.0,
        help="most seconds to wait for turns in flight after the window",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--policy", type=Path, default=None,
        help="router-policy YAML for arm ours (default: policies/thunderagent-extended.yaml)",
    )
    parser.add_argument(
        "--arms",
        default=",".join(HEADLINE_ARMS),
        help=f"comma-separated, in order; from {', '.join(ARM_NAMES)}",
    )
    parser.add_argument(
        "--pressure",
        type=float,
        default=2.5,
        help="first-wave peak context / KV capacity (default 2.5)",
    )
    parser.add_argument(
        "--blocks", type=int, default=None, help="KV blocks per worker (overrides --pressure)"
    )
    parser.add_argument(
        "--speedup-ratio",
        type=float,
        default=1.0,
        help="mocker clock speedup; tool times are divided by it",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="replay this JSONL trace instead of synthetic agents",
    )
    parser.add_argument(
        "--trace-token-scale",
        type=float,
        default=0.07,
        help="token scale for --trace (default 0.07)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """Validate the command line; raise ValueError naming the bad option."""
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown:
        raise ValueError(f"--arms: unknown {unknown or 'empty'}; choose from {ARM_NAMES}")
    if args.agents < 1 or args.duration <= 0 or args.drain < 0:
        raise ValueError("--agents must be >= 1, --duration > 0 and --drain >= 0")
    warmup = min(10.0, args.duration / 4) if args.warmup is None else args.warmup
    if not 0 <= warmup < args.duration:
        raise ValueError(f"--warmup must be in [0, --duration), got {warmup}")
    if args.pressure <= 0 or args.speedup_ratio <= 0:
        raise ValueError("--pressure and --speedup-ratio must be > 0")
    spec = DEMO_SPEC
    if args.speedup_ratio != 1.0:
        spec = WorkloadSpec(
            **{**DEMO_SPEC.__dict__, "time_scale": DEMO_SPEC.time_scale / args.speedup_ratio}
        )
    return DemoConfig(
        arms=arms, agents=args.agents, duration_s=args.duration, warmup_s=warmup,
        drain_s=args.drain, seed=args.seed, num_gpu_blocks=args.blocks,
        pressure=args.pressure, speedup_ratio=args.speedup_ratio, trace=args.trace,
        trace_token_scale=args.trace_token_scale, spec=spec, policy=args.policy,
    )  # fmt: skip


def run_demo(args: argparse.Namespace) -> int:
    """CLI entry: 0 when every arm ran with zero errors, 1 otherwise, 2 on bad options."""
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return run_demo_config(config, as_json=args.json)
