"""``bench overhead``: the cost of one admission decision and one tick at fleet scale.

A fleet of ``workers x dp_ranks`` KV pools holds ``programs`` agent programs of
realistic sizes (2k-60k tokens) at about 70% of capacity, a quarter of them
REASONING. We then time, on the pure scheduler core:

* admission of a continuing program's next turn (the common, sticky path);
* admission of a new program (a placement search over every rank);
* one scheduler tick (expiry, unassignment, resume, pressure) after a random
  share of programs changed phase.

Times are wall-clock per call (``time.perf_counter_ns``), so they include the
machine's noise; p50 and p99 over many calls are reported.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.catalog import default_catalog, load_policy
from dynamo_thunderagent.config import PolicyError
from dynamo_thunderagent.costs import EngineCosts
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.policy_files import EXTENDED_POLICY
from dynamo_thunderagent.program import Phase, WorkerKey
from dynamo_thunderagent.quantile import percentile
from dynamo_thunderagent.scheduler import Release, Scheduler

BLOCK_SIZE = 16
# Fleet fill after warm-up: below the pause threshold, so new programs take the
# placement search (the expensive admission path) instead of queueing.
FILL = 0.70


def policy_parameters(policy: str | Path | None) -> ThunderAgentParameters:
    """The ``thunderagent`` parameters of a router-policy file (None: the shipped default,
    the extended policy, with event-driven resume and every other mechanism it turns on)."""
    path = Path(policy) if policy is not None else EXTENDED_POLICY
    resolved = load_policy(path, default_catalog())
    if resolved.classifier is None:
        raise PolicyError(f"{path}: bench overhead needs a request_classifier")
    params = resolved.classifier.parameters
    if not isinstance(params, ThunderAgentParameters):
        raise PolicyError(f"{path}: bench overhead times the thunderagent classifier, not "
                          f"{resolved.classifier.type!r}")
    return params


def build_fleet(workers: int, dp_ranks: int, programs: int, seed: int,
                params: ThunderAgentParameters | None = None) -> tuple[Scheduler, float]:
    """A scheduler with ``programs`` placed programs at about FILL of fleet capacity."""
    rng = random.Random(seed)
    sizes = [rng.randint(2_000, 60_000) for _ in range(programs)]
    ranks = [WorkerKey(w, r) for w in range(workers) for r in range(dp_ranks)]
    per_rank_tokens = int(sum(sizes) / len(ranks) / FILL)
    blocks = per_rank_tokens // BLOCK_SIZE + 1
    scheduler = Scheduler(params or ThunderAgentParameters())
    # Engine costs as the router would have measured them on the calibrated GPU (re-prefill
    # 45.6 us a token, a 3 s turn decode), so that a policy that pauses only where it pays
    # pauses here too and the tick is timed doing its work.
    scheduler.observe_costs(EngineCosts(prefill_seconds_per_token=45.6e-6, decode_seconds=3.0))
    scheduler.set_workers(
        frozenset(range(workers)), {k: CapacityCard(blocks, BLOCK_SIZE) for k in ranks}
    )
    now = 0.0
    for i, size in enumerate(sizes):
        rid, session = f"warm-{i}", f"agent-{i}"
        decisions = scheduler.submit(rid, session, size, now)
        outcome = decisions.outcome(rid)
        if isinstance(outcome, Release):
            scheduler.sent(rid, outcome.worker or ranks[i % len(ranks)], now)
            if rng.random() < 0.75:
                scheduler.completed(rid, size + 80, now)
        now += 0.001
    return scheduler, now


def run_benchmark(workers: int, dp_ranks: int, programs: int, ticks: int, admissions: int,
                  seed: int, params: ThunderAgentParameters | None = None) -> dict[str, Any]:
    scheduler, now = build_fleet(workers, dp_ranks, programs, seed, params)
    rng = random.Random(seed + 1)
    sessions = list(scheduler.table.programs)

    continuing: list[float] = []
    new: list[float] = []
    for i in range(admissions):
        now += 0.01
        session = rng.choice(sessions)
        program = scheduler.table.programs.get(session)
        if program is not None and program.current is None and program.phase is Phase.ACTING:
            rid = f"turn-{i}"
            t0 = time.perf_counter_ns()
            decisions = scheduler.submit(rid, session, program.tokens + 300, now)
            continuing.append((time.perf_counter_ns() - t0) / 1e6)
            if isinstance(decisions.outcome(rid), Release):
                scheduler.completed(rid, program.tokens + 380, now)
            else:
                scheduler.aborted(rid, now)
        rid = f"new-{i}"
        t0 = time.perf_counter_ns()
        decisions = scheduler.submit(rid, f"fresh-{i}", rng.randint(2_000, 8_000), now)
        new.append((time.perf_counter_ns() - t0) / 1e6)
        scheduler.aborted(rid, now)  # roll the new program back: the fleet stays the same

    tick_ms: list[float] = []
    for _ in range(ticks):
        now += 0.5
        for session in rng.sample(sessions, k=min(len(sessions), 40)):
            program = scheduler.table.programs.get(session)
            if program is None or program.current is not None:
                continue
            rid = f"tick-turn-{now}-{session}"
            # Contexts grow by up to a few thousand tokens a turn, so pressure
            # builds over the run and ticks pause and resume programs.
            growth = rng.randint(200, 3_000)
            decisions = scheduler.submit(rid, session, program.tokens + growth, now)
            if isinstance(decisions.outcome(rid), Release) and rng.random() < 0.5:
                scheduler.completed(rid, program.tokens + 80, now)
        t0 = time.perf_counter_ns()
        scheduler.tick(now)
        tick_ms.append((time.perf_counter_ns() - t0) / 1e6)

    admit = continuing + new
    return {
        "workers": workers,
        "dp_ranks": dp_ranks,
        "programs": programs,
        "admit_p50_ms": percentile(admit, 0.50),
        "admit_p99_ms": percentile(admit, 0.99),
        "admit_continuing_p99_ms": percentile(continuing, 0.99),
        "admit_new_p99_ms": percentile(new, 0.99),
        "tick_p50_ms": percentile(tick_ms, 0.50),
        "tick_p99_ms": percentile(tick_ms, 0.99),
        "tick_mean_ms": statistics.fmean(tick_ms),
        "admissions_timed": len(admit),
        "ticks_timed": len(tick_ms),
        "paused_at_end": len(scheduler.table.paused()),
        "pauses": scheduler.counters["pauses"],
        "resumes": scheduler.counters["resumes"],
    }


# Each count's allowed range: at least one of each, at most far past any real fleet.
_COUNT_LIMITS = {"workers": 4096, "dp_ranks": 64, "programs": 1_000_000, "ticks": 100_000,
                 "admissions": 1_000_000}


def _ms(value: float | None, digits: int) -> str:
    """A timing in ms, or "-" where nothing of that kind was timed."""
    return "-" if value is None else f"{value:.{digits}f} ms"


def run_overhead(args: argparse.Namespace) -> int:
    for name, most in _COUNT_LIMITS.items():
        value = getattr(args, name)
        if not 1 <= value <= most:
            print(f"error: --{name.replace('_', '-')} must be in 1..{most:,}, got {value}",
                  file=sys.stderr)
            return 2
    try:
        params = policy_parameters(getattr(args, "policy", None))
    except PolicyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = run_benchmark(args.workers, args.dp_ranks, args.programs, args.ticks,
                           args.admissions, args.seed, params)
    result["policy"] = str(getattr(args, "policy", None) or EXTENDED_POLICY.name)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"fleet: {result['workers']} workers x {result['dp_ranks']} dp ranks, "
          f"{result['programs']} programs")
    print(f"admission  p50 {_ms(result['admit_p50_ms'], 4)}  p99 {_ms(result['admit_p99_ms'], 4)}"
          f"  (continuing p99 {_ms(result['admit_continuing_p99_ms'], 4)},"
          f" new program p99 {_ms(result['admit_new_p99_ms'], 4)})")
    print(f"tick       p50 {_ms(result['tick_p50_ms'], 3)}  p99 {_ms(result['tick_p99_ms'], 3)}")
    return 0
