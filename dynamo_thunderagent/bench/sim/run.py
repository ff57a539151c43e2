"""The simulator's scenarios and sweeps (arms x agent counts), and their output as a table.

A *scenario* fixes everything but the arm and N: workers, KV pool, batching limits, timing
regime, workload, window. Two presets, one per timing regime, built from the regime's
definition in ``bench/regimes.py`` (the same the live harness reads):

* ``cheap-recompute``: the live harness's mocker setup (workload.md, "Measured here"): 2
  workers x 1,408 blocks x 16 tokens, agents of 10-20 turns (500-token shared system prompt,
  100-300 tool tokens and 32-64 generated tokens a turn, tool time lognormal with a 0.5 s
  median) and the mocker's default timing. Re-prefilling an evicted context is cheap here.
* ``calibrated``: real agents on GPU-like costs: the shared SWE-agent trace replayed
  (133 runs, median 39 steps, peak contexts of 37k tokens at the median, 77 generated tokens
  a step, short local tools; a 1,000-token shared system prompt assumed), 2 workers x 16,384
  blocks x 16 tokens (262k tokens each), timing fitted to the same trace
  (``bench.calibration``) and its per-call client overhead. Re-prefilling a context costs
  many decode steps. ``--workload synthetic`` swaps in the synthetic SWE-agent shape
  (``WorkloadSpec()``: 20-60 turns, ~30k-token peaks, the heavy-tailed tool mix of
  workload.md); without the trace file the preset falls back to it.

``--workload long`` and ``--workload fanout`` run the shapes of ``bench/shapes.py`` (long
sessions with compaction; parents fanning out to subagents) in either regime, their tokens
scaled by ``shape_token_factor`` of the regime's worker pool (1 when calibrated).

Without an explicit list of agent counts N is swept from the capacity
(:func:`sweep_agents`): N agents whose mean *peak* context adds up to 0.5x, 1x, 1.5x, 2x and
3x the cluster's KV capacity (workload.md's sweep). The command line that picks a preset and
overrides its fields is :mod:`~dynamo_thunderagent.bench.sim.command`.

``--live-sizing`` (``command.py``) sizes a scenario as ``bench live`` sizes the same regime,
workload and seed, in the simulator's units, with the first N agents joined mid-program as
live runs join them (``Scenario.warm_start``), so the two tools' figures compare run for run.

The same seed gives the same agents to every arm and the same output, byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Any

from dynamo_thunderagent.bench.regimes import regime_named
from dynamo_thunderagent.bench.shapes import SyntheticWorkload
from dynamo_thunderagent.bench.sim.arms import DEFAULT_POLICY, build_arm
from dynamo_thunderagent.bench.sim.engine import EngineConfig
from dynamo_thunderagent.bench.sim.simulation import RunConfig, SimFigures, Simulation
from dynamo_thunderagent.bench.sim.timing import TimingModel
from dynamo_thunderagent.bench.trace import (
    TRACE_SYSTEM_TOKENS,
    load_trace,
    replay_stream,
)
from dynamo_thunderagent.bench.workload import (
    AgentPlan,
    Background,
    WorkloadSpec,
    agent_stream,
    warm_start,
)

SWEEP_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)
SAMPLE_AGENTS = 64  # plans sampled to size the sweep and the TTL


@dataclass(frozen=True)
class Scenario:
    """Everything of a sweep but the arm and N (see the module docstring)."""

    regime: str
    timing: TimingModel
    workers: int
    blocks: int
    block_size: int
    workload: SyntheticWorkload
    warmup_s: float
    window_s: float
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    client_overhead_s: float = 0.0
    trace: str | None = None
    reuse_output: bool = True
    host_blocks: int = 0  # host tier per worker (0: none)
    host_copy_s_per_token: float = 0.0
    background: Background | None = None  # other tenants' sessionless requests
    rollout: bool = False  # one batch of N agents run to their end (``simulation.py``)
    # The first N agents join their programs at a seeded turn, as ``bench live``'s do
    # (``workload.warm_start``); off, every agent starts at its first turn.
    warm_start: bool = False
    live_sized: bool = False  # sized by ``--live-sizing`` (``command.live_sized``)

    def engine(self) -> EngineConfig:
        return EngineConfig(self.blocks, self.block_size, self.timing, self.max_num_seqs,
                            self.max_num_batched_tokens, self.reuse_output,
                            self.host_blocks, self.host_copy_s_per_token)

    @property
    def capacity_tokens(self) -> int:
        return self.workers * self.blocks * self.block_size

    def plans(self, seed: int) -> Iterator[AgentPlan]:
        """The agent stream of this scenario: synthetic, or the trace replayed shuffled."""
        if self.trace is None:
            return agent_stream(self.workload, seed)
        spec = self.workload
        plans = load_trace(self.trace, spec.token_scale, spec.time_scale,
                           system_prompt_tokens=TRACE_SYSTEM_TOKENS)
        return replay_stream(plans, seed)

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["timing"] = self.timing.describe()
        data["capacity_tokens"] = self.capacity_tokens
        if not self.host_blocks:  # no host tier: described as before there was one
            del data["host_blocks"], data["host_copy_s_per_token"]
        if self.background is None:  # likewise without other tenants' traffic
            del data["background"]
        if not self.rollout:  # and in a closed loop
            del data["rollout"]
        if not self.warm_start:  # and with every agent from its first turn
            del data["warm_start"]
        if not self.live_sized:  # and sized by its own flags
            del data["live_sized"]
        return data


def regime_scenario(name: str) -> Scenario:
    """The preset of a regime (``bench.regimes``): its cluster, timing, workload, window."""
    r = regime_named(name)
    trace = r.default_trace()
    tier = r.host_tier
    return Scenario(
        regime=r.name,
        timing=r.sim_timing,
        workers=r.sim.workers,
        blocks=r.sim.blocks,
        block_size=r.sim.block_size,
        workload=r.workload_spec(),
        warmup_s=r.sim.warmup_s,
        window_s=r.sim.window_s,
        client_overhead_s=r.client_overhead_s,
        trace=str(trace) if trace is not None else None,
        host_blocks=tier.host_blocks(r.sim.blocks) if tier else 0,
        host_copy_s_per_token=tier.copy_s_per_token if tier else 0.0,
    )


def sample_plans(scenario: Scenario, seed: int) -> list[AgentPlan]:
    return list(islice(scenario.plans(seed), SAMPLE_AGENTS))


def sweep_agents(scenario: Scenario, seed: int,
                 factors: Sequence[float] = SWEEP_FACTORS) -> list[int]:
    """N values whose total mean peak context (subagents included:
    ``AgentPlan.peak_footprint_tokens``) is ``factors`` x the cluster's capacity."""
    plans = sample_plans(scenario, seed)
    peak = sum(p.peak_footprint_tokens for p in plans) / len(plans)
    knee = scenario.capacity_tokens / peak
    return sorted({max(1, round(f * knee)) for f in factors})


def tool_time_p90(scenario: Scenario, seed: int) -> float:
    """The 90th percentile of tool time between turns (the TTL-pinning arm's default TTL)."""
    times = sorted(t.tool_seconds for p in sample_plans(scenario, seed) for t in p.turns[:-1])
    # A setting, not a reported figure: the sample at index floor(0.9 (n - 1)), which can
    # sit one below the nearest-rank p90 of quantile.percentile. Kept because the
    # recorded ttl-pinning outputs (tests/golden/sim) were made with it.
    return times[int(0.9 * (len(times) - 1))] if times else 1.0


@dataclass(frozen=True)
class SweepSpec:
    """A sweep: a scenario, the arms, the agent counts and the arms' settings."""

    scenario: Scenario
    arms: tuple[str, ...]
    agents: tuple[int, ...]
    seed: int = 0
    policy: str | None = None
    ttl_s: float = 1.0
    jobs: int = 1


def run_one(scenario: Scenario, arm_name: str, agents: int, seed: int,
            policy: str | None, ttl_s: float) -> SimFigures:
    """One deterministic run of ``arm_name`` with ``agents`` agents."""
    config = RunConfig(agents=agents, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s,
                       client_overhead_s=scenario.client_overhead_s,
                       background=scenario.background, rollout=scenario.rollout)
    sim: Simulation | None = None

    def clock() -> float:
        return sim.now() if sim is not None else 0.0

    arm = build_arm(arm_name, policy=policy, ttl_s=ttl_s, clock=clock,
                    host_blocks=scenario.host_blocks)
    plans = scenario.plans(seed)
    if scenario.rollout:  # the batch: the stream's first N, the same in every arm
        plans = islice(plans, agents)
    elif scenario.warm_start:
        plans = warm_start(plans, agents, seed)
    sim = Simulation(config, arm, plans)
    return sim.run()


def _run_star(args: tuple[Scenario, str, int, int, str | None, float]) -> SimFigures:
    return run_one(*args)


def run_sweep(spec: SweepSpec) -> list[SimFigures]:
    """Every (N, arm) pair, N-major; parallel over ``jobs`` processes, same results."""
    tasks = [(spec.scenario, arm, n, spec.seed, spec.policy, spec.ttl_s)
             for n in spec.agents for arm in spec.arms]
    if spec.jobs <= 1 or len(tasks) == 1:
        return [_run_star(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=min(spec.jobs, len(tasks))) as pool:
        return list(pool.map(_run_star, tasks))


# ---- output ---------------------------------------------------------------------------------
def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _steps(steps_per_min: float) -> str:
    """Steps/min to a table: whole steps, one decimal under 100 (shapes of long turns run
    a few steps a minute, where whole steps hide a tenth of the figure)."""
    return f"{steps_per_min:.1f}" if steps_per_min < 100 else f"{steps_per_min:.0f}"


def markdown(spec: SweepSpec, results: Sequence[SimFigures]) -> str:
    """The sweep as markdown: setup, steps/min by N, then every figure per (N, arm)."""
    s = spec.scenario
    baseline = {r.agents: r.steps_per_min for r in results if r.arm == "stock"}
    lines = [
        f"### bench sim: {s.regime} regime, seed {spec.seed}",
        "",
        f"- workers: {s.workers} x {s.blocks} blocks x {s.block_size} tokens "
        f"({s.capacity_tokens:,} tokens); max_num_seqs {s.max_num_seqs}, "
        f"max_num_batched_tokens {s.max_num_batched_tokens}",
        f"- timing: {s.timing.describe()}",
        "- workload: " + (f"trace {s.trace}" if s.trace else _describe_workload(s.workload))
        + f"; client overhead {s.client_overhead_s:g} s per turn",
        (f"- rollout: one batch of N agents started together, run to their end (capped at "
         f"{s.window_s:g} s, simulated); steps/min up to the batch's end"
         if s.rollout else
         f"- window: {s.window_s:g} s after {s.warmup_s:g} s warm-up (simulated)")
        + f"; ours: {spec.policy or DEFAULT_POLICY.name}; ttl-pinning TTL {spec.ttl_s:.2f} s",
        *([] if not s.live_sized else [
            "- sized as bench live sizes it (--live-sizing)"
            + (": the first N agents join their programs at seeded turns"
               if s.warm_start else "")]),
        *([] if s.background is None else [
            f"- other tenants: {s.background.concurrency} loops of sessionless requests, "
            f"{s.background.prompt_tokens} unique prompt and {s.background.output_tokens} "
            "output tokens each, back to back"]),
        "",
        "steps/min (x stock):",
        "",
        "| N | " + " | ".join(spec.arms) + " |",
        "|---|" + "---|" * len(spec.arms),
    ]
    by_key = {(r.agents, r.arm): r for r in results}
    for n in spec.agents:
        cells = []
        for arm in spec.arms:
            r = by_key[(n, arm)]
            ratio = (f" ({r.steps_per_min / baseline[n]:.2f}x)"
                     if baseline.get(n) and arm != "stock" else "")
            cells.append(f"{_steps(r.steps_per_min)}{ratio}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| N | arm | steps/min | hit rate | recomputed tok | turn p50/p99 s | "
        "wait p50/p99/max s | pauses | resumes | moves | busy | problems |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.agents} | {r.arm} | {_steps(r.steps_per_min)} | {_f(r.hit_rate, 3)} | "
            f"{r.recomputed_tokens:,} | {_f(r.latency_p50_s)} / {_f(r.latency_p99_s)} | "
            f"{_f(r.wait_p50_s)} / {_f(r.wait_p99_s)} / {_f(r.wait_max_s)} | {r.pauses} | "
            f"{r.resumes} | {r.moves} | {r.busy_fraction:.2f} | {len(r.problems)} |")
    if s.rollout:
        lines += ["", "the batch (makespan: start to the last agent's end; runs: agents "
                  "finished, and their completion time):", "",
                  "| N | arm | makespan s | runs | run mean / p90 s |", "|---|---|---|---|---|"]
        lines += [f"| {r.agents} | {r.arm} | {_f(r.rollout['makespan_s'])} | "
                  f"{r.rollout['runs']} | {_f(r.rollout['run_mean_s'])} / "
                  f"{_f(r.rollout['run_p90_s'])} |" for r in results if r.rollout is not None]
    if s.background is not None:
        lines += ["", "other tenants' requests finished in the window / p50 latency s:", ""]
        lines += [f"- N={r.agents} {r.arm}: {r.background['completed']} / "
                  f"{_f(r.background['latency_p50_s'], 2)}"
                  for r in results if r.background is not None]
    problems = [f"- N={r.agents} {r.arm}: {p}" for r in results for p in r.problems]
    if problems:
        lines += ["", "problems:", *problems]
    return "\n".join(lines) + "\n"


def _describe_workload(w: SyntheticWorkload) -> str:
    if not isinstance(w, WorkloadSpec):
        return w.describe()
    return (f"synthetic, {w.turns[0]}-{w.turns[1]} turns, system prompt "
            f"{w.system_prompt_tokens} tokens, first turn {w.first_turn_tokens[0]}-"
            f"{w.first_turn_tokens[1]}, +{w.tool_output_tokens[0]}-{w.tool_output_tokens[1]} "
            f"tool and {w.output_tokens[0]}-{w.output_tokens[1]} generated tokens a turn, "
            f"tool time mix of {len(w.tool_time)} (token x{w.token_scale:g}, "
            f"time x{w.time_scale:g})")


def to_json(spec: SweepSpec, results: Sequence[SimFigures]) -> dict[str, Any]:
    return {
        "scenario": spec.scenario.describe(),
        "arms": list(spec.arms),
        "agents": list(spec.agents),
        "seed": spec.seed,
        "policy": spec.policy,
        "ttl_s": spec.ttl_s,
        "results": [r.to_dict() for r in results],
    }
