"""``dynamo-thunderagent bench live``: interleaved, repeated A/B runs of every arm on local stacks.

What it does
------------
For each timing regime (``--regime calibrated|cheap-recompute|all``, see
``docs/calibration.md``), for each repeat, for each agent count N, it runs every arm once, in
an order rotated from one (repeat, N) group to the next, each on a fresh local stack (mocker
workers, Dynamo frontend and, per arm, a router). One run drives N closed-loop agents (a
finished agent is replaced) for ``--window`` seconds and records the figures of
``docs/../shared/docs/workload.md``: steps/min, prefix-cache hit rate, recomputed tokens, turn
latency, admission wait, pauses, resumes, worker moves, errors. Arms:

* ``stock``: Dynamo's KV router with soft session affinity;
* ``builtin``: Dynamo 1.6.1's Rust ThunderAgent (frontend ``--router-policy-config``), with
  ``--builtin-policy`` (default ``policies/thunderagent.yaml``, the parity file);
* ``dynamo-python``: ``python -m dynamo.thunderagent_router``;
* ``ours``: ``dynamo-thunderagent serve`` with ``--policy`` (default
  ``policies/thunderagent-extended.yaml``);
* ablations ``ours:<label>=<policy.yaml>`` (or ``--arm-policy label=path``): our router with
  another policy file (``builtin:<label>=<path>`` works the same way for the builtin arm).

Capacity and the sweep
----------------------
The KV capacity is fixed for a regime (the same for every N and arm): it is chosen so that
``--max-agents`` agents' mean *peak* contexts add up to ``max(--factors)`` x capacity, never
so small that the largest program in the workload could not fit one worker. The agent counts
are ``N_i = round(f_i / max(f) x max_agents)``, so with the default factors ``0.5, 1, 2, 3``
and 24 agents: N = 4, 8, 16, 24 at 0.5x, 1x, 2x and 3x capacity (``pressure`` in the output
is the exact ratio).

Workloads
---------
* ``calibrated`` (default workload ``trace``): the shared SWE-agent trace replayed (agent
  contexts of tens of thousands of tokens, 77 generated tokens a step at the median, a
  1,000-token shared system prompt assumed), tokens scaled by ``token_scale`` (0.1) and every
  duration by ``time_scale`` (0.25: the run's clock is 4x the GPU's); the mocker's prefill and
  decode tables come from :mod:`~dynamo_thunderagent.bench.calibration` at the same scales.
  The traced deployment's per-call client overhead (0.72 s, not engine time) is added to every
  tool gap, as the simulator does. The routers' durations run on the same clock
  (``--policy-clock regime``, the default): ours and the builtin get a copy of their policy
  with every ``*_seconds`` parameter times ``time_scale``, the Python port its flags in
  seconds scaled alike, so a policy means against the agents what it means in production;
  ``--policy-clock wall`` runs the files as written (every figure before 2026-12-02).
* ``cheap-recompute`` (default workload ``toy``): the agents of workload.md's "measured here"
  runs (10-20 turns, 500-token shared system prompt, 100-300 tool tokens and 32-64 generated
  tokens a turn, tool time lognormal with a 0.5 s median) on the mocker's built-in timing.
* ``swe``: the synthetic SWE-agent shape (``WorkloadSpec()``), scaled like the trace.
* ``long`` and ``fanout``: long coding-assistant sessions with compaction, and parents that
  fan out to short subagents sharing a large system prompt (``bench/shapes.py``). Scaled
  like the trace, and further by ``shape_token_factor`` where the regime's simulated worker
  is smaller than the calibrated one (cheap-recompute), so that as many programs fit a
  worker; subagents send their own session id, ``X-Dynamo-Parent-Session-ID`` and a
  session-final of their own.

A rollout (``--rollout``) runs one batch instead of a closed loop, as an RL rollout or an
evaluation does: the N agents start together at their first turn (no warm start, no warm-up)
and a slot whose agent ends takes no other, so every arm runs the same agents to their end.
The run ends with the batch's last agent; ``--window`` caps it (default 600 s here). Every
figure then covers the whole batch: steps/min up to its end, ``makespan_s`` (start to the
last agent's last turn answered; None when the cap cut the batch or a run was lost), and
``agent_run_mean_s`` / ``agent_run_p90_s`` over the runs that
finished (every run of the batch, unless the cap cut it or runs were lost: ``results.md``
then says how many of the N).

Beside any workload, ``--background C[:P:O]`` sends other tenants' sessionless requests (C at
a time, P unique prompt and O output tokens) until the window closes; they are no agent's
turns, and each run's row carries their count, errors and p50 latency (``bench/driver.py``).

Warm start: a short window would otherwise see only young agents (every agent starts at turn
0 at once, so contexts never reach their steady-state sizes). The first N agents of a run
therefore start at a seeded, uniformly drawn turn of their program, whose whole history is
their first prompt (a cold prefill, dropped with the warm-up); agents that replace finished
ones start at turn 0. Every arm and repeat sees the same agents (same ``--seed``), so the
spread across repeats is machine noise.

Definitions of the figures (per run; see ``bench/metrics.py``)
---------------------------------------------------------------
* ``steps_per_min``: successful turns that completed inside the steady window
  ``[warmup, window)``, per minute.
* ``hit_rate``: cached / prompt tokens of the successful turns that completed inside the steady
  window (``hit_rate_all``: every turn, warm-up included).
* ``latency_p50_s`` / ``latency_p99_s``: turn latency (admission wait included) of the turns
  that started in the steady window, nearest rank; a turn still waiting when the drain ended,
  or that the client gave up on (its request timed out), counts with its time until then (a
  lower bound; ``latency_censored`` counts them); other failed turns are left out.
  ``latency_max_s``: the longest of them (the max over repeats, as for every ``*_max`` /
  ``*_max_s`` figure), the one figure that shows how long any arm held a turn back: the
  ports do not report their waits.
* ``agent_run_mean_s`` / ``agent_run_p90_s``: agent-run completion time, first turn sent to
  last turn answered (not the session-final after it: ours and the Python port answer it in
  the router, stock and the builtin queue it on a worker), over the ``agent_runs`` agents
  that ran whole inside the run (warm-started agents, which began mid-program, are left
  out: their records say ``joined``).
* ``makespan_s`` (``--rollout``): when the batch's last agent run ended (its last turn
  answered), from the run's start; None when any run of the batch did not finish
  its turns (the cap cut it, or a turn failed).
* ``recomputed_tokens``: tokens a program had cached on its previous turn and prefilled again
  (whole KV blocks), over the whole run.
* ``pauses`` / ``resumes`` / ``moves`` / ``forced_resumes``: ours from ``/state`` counters;
  dynamo-python from its router log (pauses and resumes; moves None); builtin and stock None
  (not exposed). Ours' row also keeps, under ``scheduler.counters``, every counter of its
  scheduler at the end (what each mechanism did: ``empty_rank_moves``, ``priced_moves``, ...).
* ``paused_mean`` / ``paused_max``: programs paused, time-weighted over the steady window:
  ours by polling ``/state`` every second, dynamo-python from the paused count in its log
  lines, builtin from its scheduler's state-change debug lines (``DYN_LOG`` is raised to
  debug for the ``thunderagent`` target in that arm). None for stock.
* ``admission_wait_*``: ours only (its router measures the wait of every turn, session-final
  requests left out); None elsewhere. A turn still waiting when the run's figures are read,
  or whose client gave up (as the driver's do when the window closes), is not dropped:
  ``admission_wait_censored_max_s`` is the longest such wait (a lower bound).

Output (``--out DIR``, default ``bench-results/<UTC timestamp>/``)
-----------------------------------------------------------------
* ``results.json``: the report (see :func:`build_report`), rewritten after every run so an
  interrupted sweep keeps what it measured;
* ``results.md``: the markdown tables (:func:`render_markdown`);
* ``steps_per_min_<regime>.png``, ``hit_rate_<regime>.png``, ``latency_cdf_<regime>.png``.

``--json`` prints the report on stdout (without the per-run latency samples) as ONE object:
``report["arms"][arm]`` holds the figures of the first regime at its largest N
(``steps_per_min``, ``hit_rate``, ... as means over the repeats, except errors, summed, and
the ``*_max`` / ``*_max_s`` figures, their max; plus ``spread`` and ``by_n`` with every N);
``report["regimes"][regime]["arms"]`` the same per regime. Errors count every failed
request, session-finals included; ``errors_by_type`` (per run and, summed, per cell, and a
line under ``results.md``'s table) names a session-final's or release's with what it was,
``APITimeoutError (session-final)``: one the engine did not answer within the driver's 10 s,
which loses no turn. Progress goes to stderr. Exit status: 0 when every run finished with
zero errors, 1 otherwise, 2 for bad options.

(This module is about 550 lines because this docstring, the command's reference, is about
125 of them, and the sweep's run loop belongs with the regime's preparation (policies on its
clock); the command line is ``live_cli``, the sweep plan, the figures and the report are
``live_sweep``, ``live_report``, ``live_markdown`` and ``live_observer``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dynamo_thunderagent.bench.calibration.mocker import StackGeometry
from dynamo_thunderagent.bench.live_markdown import render_markdown
from dynamo_thunderagent.bench.live_observer import Observer
from dynamo_thunderagent.bench.live_report import build_report, make_row
from dynamo_thunderagent.bench.live_sweep import (
    DEFAULT_ARMS,
    DEFAULT_FACTORS,
    DEFAULT_WARMUP_S,
    DEFAULT_WINDOW_S,
    ArmSpec,
    RegimeSetup,
    RunKey,
    SweepPlan,
    batch_plans,
    interleave,
    live_setup,
    plan_sweep,
    run_plans,
    workload_shape,
)
from dynamo_thunderagent.bench.regimes import REGIMES
from dynamo_thunderagent.bench.runner import (
    RunSpec,
    run_stack,
)
from dynamo_thunderagent.bench.workload import Background
from dynamo_thunderagent.policy_files import POLICY_CLOCKS, policy_on_clock, policy_with_host_tier

# ============================================================================================
# Progress
# ============================================================================================


class ProgressView:
    """A progress bar over the scheduled runs on ``stream`` (tqdm on a terminal, else lines)."""

    def __init__(self, total: int, expected_run_s: float, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.expected_run_s = expected_run_s
        self.stream = stream
        self.t0 = time.monotonic()
        self._bar: Any = None
        if stream.isatty():
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self._bar = tqdm(total=total, file=stream, unit="run", dynamic_ncols=True)

    def say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def begin(self, key: RunKey, repeats: int) -> None:
        label = f"{key.regime} rep {key.repeat + 1}/{repeats} N={key.agents} {key.arm}"
        if self._bar is not None:
            self._bar.set_description(label)
            return
        elapsed = time.monotonic() - self.t0
        per_run = elapsed / self.done if self.done else self.expected_run_s
        eta = per_run * (self.total - self.done)
        self.say(
            f"== run {self.done + 1}/{self.total} ({100 * self.done / self.total:.0f}%, "
            f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left): {label}"
        )

    def end(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# ============================================================================================
# Configuration and the run
# ============================================================================================


@dataclass
class LiveConfig:
    """Everything a sweep depends on (written into the report)."""

    regimes: tuple[str, ...] = ("calibrated",)
    arms: tuple[ArmSpec, ...] = tuple(ArmSpec(a, a) for a in DEFAULT_ARMS)
    repeats: int = 3
    factors: tuple[float, ...] = DEFAULT_FACTORS
    agents: tuple[int, ...] | None = None
    max_agents: int | None = None  # None: the regime's default
    num_gpu_blocks: int | None = None
    workers: int = 2
    block_size: int = 16
    window_s: float = DEFAULT_WINDOW_S
    warmup_s: float = DEFAULT_WARMUP_S
    drain_s: float = 5.0
    request_timeout_s: float = 300.0
    seed: int = 0
    workload: str = "auto"
    trace: Path | None = None
    token_scale: float | None = None
    time_scale: float | None = None
    out_dir: Path = field(default_factory=lambda: default_out_dir())
    plots: bool = True
    quick: bool = False
    background: Background | None = None  # sessionless requests beside the agents
    # "regime": the routers' durations (policy seconds) run on the regime's clock, like the
    # agents' tools and the engine; "wall": as the files write them.
    policy_clock: str = "regime"
    rollout: bool = False  # one batch of N agents run to their end per run (window: its cap)

    def plan(self, regime: str) -> tuple[RegimeSetup, SweepPlan]:
        """The regime's setup and its sweep (capacity fixed for the largest N)."""
        setup = self.setup(regime)
        shape = workload_shape(setup, self.seed)
        sweep = plan_sweep(
            shape, max_agents=setup.max_agents, factors=self.factors, agents=self.agents,
            num_workers=self.workers, block_size=self.block_size,
            num_gpu_blocks=self.num_gpu_blocks,
        )  # fmt: skip
        return setup, sweep

    def setup(self, regime: str) -> RegimeSetup:
        return live_setup(regime, workload=self.workload, trace=self.trace,
                          token_scale=self.token_scale, time_scale=self.time_scale,
                          max_agents=self.max_agents)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "regime_names": list(self.regimes),
            "arms": [a.describe() for a in self.arms],
            "repeats": self.repeats,
            "factors": list(self.factors),
            "agents": list(self.agents) if self.agents else None,
            "workers": self.workers,
            "block_size": self.block_size,
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "drain_s": self.drain_s,
            "request_timeout_s": self.request_timeout_s,
            "seed": self.seed,
            "quick": self.quick,
            "rollout": self.rollout,
            "background": None if self.background is None else dataclasses.asdict(
                self.background),
            "out_dir": str(self.out_dir),
        }


def default_out_dir() -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("bench-results") / stamp


@dataclass
class PreparedRegime:
    """A regime ready to run: its setup, sweep and mocker flags."""

    setup: RegimeSetup
    sweep: SweepPlan
    mocker_args: list[str]
    host_blocks: int = 0  # host KV tier per worker (0: none)
    work_dir: Path | None = None  # where derived files (told policies) go
    # The clock the routers' durations run on, in wall seconds per real second: the regime's
    # time scale (--policy-clock regime), or 1 (wall: the files' seconds as written).
    policy_clock: float = 1.0

    def policy_for(self, arm: ArmSpec) -> Path | None:
        """The policy file ``arm`` runs with in this regime: told of its host tier, and its
        durations on the regime's clock (``policy_clock``); ``arm.policy`` when neither
        applies (None: the arm's own default)."""
        policy = arm.policy or arm.arm.default_policy
        tier = bool(self.host_blocks and arm.arm.configures_host_tier)
        clock = self.policy_clock != 1 and arm.arm.takes_policy
        if policy is None or not (tier or clock):
            return arm.policy
        if self.work_dir is None:
            raise ValueError("a regime with a host tier or a policy clock needs a work_dir for "
                             "the policies it derives (prepare_regime gives one)")
        out = self.work_dir / arm.folder  # one folder per arm: copies of equal names collide
        if tier:
            policy = policy_with_host_tier(policy, self.host_blocks, out)
        if clock:
            policy = policy_on_clock(policy, self.policy_clock, out,
                                     ours=arm.arm.reads_our_policy)
        return policy

    def check_policies(self, arms: Iterable[ArmSpec]) -> None:
        """Derive the policy of each of ``arms`` now, before any run: a file that cannot be
        read or put on the regime's clock raises ValueError naming it."""
        for arm in arms:
            self.policy_for(arm)

    def router_args_for(self, arm: ArmSpec) -> list[str]:
        """Flags for the router of ``arm`` that put its built-in durations on the regime's
        clock (the arms configured by flags rather than a policy file)."""
        return arm.arm.clock_args(self.policy_clock) if self.policy_clock != 1 else []

    def describe(self) -> dict[str, Any]:
        return {
            "setup": self.setup.describe(),
            "sweep": self.sweep.describe(),
            "mocker_args": self.mocker_args,
            "host_blocks_per_worker": self.host_blocks,
            "policy_clock": self.policy_clock,
            "real_capacity_tokens": round(self.sweep.capacity_tokens / self.setup.token_scale),
        }


def prepare_regime(config: LiveConfig, regime: str, work_dir: Path) -> PreparedRegime:
    """Size the regime and write its mocker profile (calibrated) under ``work_dir``."""
    setup, sweep = config.plan(regime)
    geometry = StackGeometry(sweep.num_gpu_blocks, config.block_size, setup.speedup_ratio)
    spec = REGIMES[regime]
    mocker_args = spec.mocker_args(
        work_dir / f"profile-{regime}", setup.token_scale, setup.time_scale,
        speedup_ratio=setup.speedup_ratio, geometry=geometry,
    )  # fmt: skip
    tier = spec.host_tier
    host_blocks = tier.host_blocks(sweep.num_gpu_blocks) if tier is not None else 0
    if config.policy_clock not in POLICY_CLOCKS:
        raise ValueError(f"policy clock must be one of {', '.join(POLICY_CLOCKS)}, got "
                         f"{config.policy_clock!r}")
    clock = setup.time_scale if config.policy_clock == "regime" else 1.0
    return PreparedRegime(setup, sweep, mocker_args, host_blocks, work_dir / f"policies-{regime}",
                          policy_clock=clock)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        info["ai_dynamo"] = version("ai-dynamo")
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    info["code"] = code_version()
    return info


def code_version() -> str | None:
    """``DTA_CODE_VERSION`` if set (e.g. for a snapshot without git), else the checkout's
    ``git describe --always --dirty``, else None."""
    if os.environ.get("DTA_CODE_VERSION"):
        return os.environ["DTA_CODE_VERSION"]
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=5, check=True,
        )  # fmt: skip
        return done.stdout.strip() or None
    return None


def prepare_all(config: LiveConfig) -> dict[str, PreparedRegime]:
    """Every regime prepared and every arm's policy derived before any run, so that a policy
    that cannot be read or put on the regime's clock stops the command (ValueError naming
    the file) before it spends a run."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    prepared = {r: prepare_regime(config, r, config.out_dir) for r in config.regimes}
    for regime in prepared.values():
        regime.check_policies(config.arms)
    return prepared


def run_live(config: LiveConfig, *, as_json: bool, out: TextIO = sys.stdout,
             err: TextIO = sys.stderr,
             prepared: dict[str, PreparedRegime] | None = None) -> int:  # fmt: skip
    """Run the sweep, write the outputs, print the table (or the JSON report); ``prepared``:
    :func:`prepare_all`'s (made here when not given).

    Returns 0 when every run finished with zero errors, 1 otherwise.
    """
    started_at = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    if prepared is None:
        prepared = prepare_all(config)
    arms = {a.label: a for a in config.arms}
    agents = {r: list(p.sweep.agents) for r, p in prepared.items()}
    schedule = interleave(config.regimes, agents, list(arms), config.repeats)
    per_run = config.window_s + config.drain_s / 2 + 4.0
    view = ProgressView(len(schedule), per_run, err)
    described = config.describe()
    described["regimes"] = {r: p.describe() for r, p in prepared.items()}
    meta: dict[str, Any] = {"machine": machine_info(),
                            "started_at": started_at.isoformat(timespec="seconds")}
    for regime, p in prepared.items():
        view.say(
            f"bench live: {regime}: {config.workers} workers x {p.sweep.num_gpu_blocks} blocks x "
            f"{config.block_size} = {p.sweep.capacity_tokens:,} KV tokens; workload "
            f"{p.setup.workload}, mean peak context {p.sweep.mean_peak_tokens:,.0f} tokens; "
            f"N = {', '.join(str(n) for n in p.sweep.agents)} ("
            + ", ".join(f"{x:.2f}x" for x in p.sweep.pressures) + " capacity)"
            + (f"; note: {p.sweep.note}" if p.sweep.note else "")
        )
    view.say(
        f"bench live: {len(schedule)} runs ({len(arms)} arms x {config.repeats} repeats), about "
        f"{len(schedule) * per_run / 60:.0f} min; writing {config.out_dir}"
    )
    rows: list[dict[str, Any]] = []

    def report(include_samples: bool = True) -> dict[str, Any]:
        extra = dict(meta)
        extra["elapsed_s"] = round(time.monotonic() - t0, 1)
        extra["runs_done"] = len(rows)
        extra["runs_scheduled"] = len(schedule)
        return build_report(
            rows, config=described, arm_order=list(arms), regime_order=list(config.regimes),
            agents=agents, meta=extra, include_samples=include_samples,
        )  # fmt: skip

    try:
        for key in schedule:
            view.begin(key, config.repeats)
            rows.append(_one_run(key, arms[key.arm], prepared[key.regime], config, view.say))
            view.end()
            _write_json(config.out_dir / "results.json", report())
    finally:
        view.close()
    final = report()
    final["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    _write_json(config.out_dir / "results.json", final)
    markdown = render_markdown(final)
    (config.out_dir / "results.md").write_text(markdown, encoding="utf-8")
    if config.plots:
        try:
            from dynamo_thunderagent.bench.plots import write_plots

            written = write_plots(final, config.out_dir)
            view.say("plots: " + ", ".join(str(p) for p in written))
        except ImportError as error:
            view.say(f"plots skipped ({error}); install matplotlib")
    view.say(f"bench live: done in {(time.monotonic() - t0) / 60:.1f} min; {config.out_dir}")
    if as_json:
        stdout_report = report(include_samples=False)
        stdout_report["finished_at"] = final["finished_at"]
        print(json.dumps(stdout_report, indent=1), file=out, flush=True)
    else:
        print(markdown, file=out, flush=True)
    clean = all(r["error"] is None and not r.get("errors") for r in rows)
    return 0 if clean else 1


def _one_run(
    key: RunKey, arm: ArmSpec, prepared: PreparedRegime, config: LiveConfig,
    say: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    setup, sweep = prepared.setup, prepared.sweep
    spec = RunSpec(
        arm=arm.base,
        label=arm.label,
        plans=lambda: (batch_plans if config.rollout else run_plans)(
            setup, config.seed, key.agents),
        agents=key.agents,
        window_s=config.window_s,
        warmup_s=config.warmup_s,
        drain_s=config.drain_s,
        request_timeout_s=config.request_timeout_s,
        num_workers=config.workers,
        num_gpu_blocks=sweep.num_gpu_blocks,
        block_size=config.block_size,
        speedup_ratio=setup.speedup_ratio,
        policy=prepared.policy_for(arm),
        router_args=prepared.router_args_for(arm),
        mocker_args=prepared.mocker_args,
        extra_env=arm.arm.observed_env(),
        job=f"live-{setup.regime}-{config.seed}",
        background=config.background,
        rollout=config.rollout,
    )
    observer = Observer(arm.arm, (config.warmup_s, config.window_s))
    result = run_stack(spec, say, observer)
    return make_row(
        key, result, pressure=sweep.pressure_of(key.agents),
        warmup_s=config.warmup_s, window_s=config.window_s,
    )  # fmt: skip


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
