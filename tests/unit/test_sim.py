"""The simulator: its KV pool, its engine, its arms and the ``bench sim`` command."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent import cli
from dynamo_thunderagent.bench.ablations import ABLATION_DIR
from dynamo_thunderagent.bench.regimes import regime_named
from dynamo_thunderagent.bench.sim import command as sim_command
from dynamo_thunderagent.bench.sim.arms import (
    UPSTREAM_PARAMETERS,
    ProgramArm,
    StockArm,
    build_arm,
    potential_loads,
)
from dynamo_thunderagent.bench.sim.command import add_arguments, run_case, spec_from_args
from dynamo_thunderagent.bench.sim.contract import kv_route
from dynamo_thunderagent.bench.sim.engine import (
    Cluster,
    EngineConfig,
    EventLoop,
    SimRequest,
    Worker,
)
from dynamo_thunderagent.bench.sim.kv import SYSTEM_CHAIN, KvPool
from dynamo_thunderagent.bench.sim.run import (
    Scenario,
    SweepSpec,
    markdown,
    regime_scenario,
    run_sweep,
    to_json,
)
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation
from dynamo_thunderagent.bench.sim.timing import TimingModel
from dynamo_thunderagent.bench.workload import Background, warm_start
from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.catalog import load_policy
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.policy_files import EXTENDED_POLICY, PARITY_POLICY
from dynamo_thunderagent.program import Phase, WorkerKey
from dynamo_thunderagent.scheduler import Scheduler

# ---- KV pool ------------------------------------------------------------------------------


def test_prefix_hit_is_the_shared_system_prompt_plus_the_programs_own_history() -> None:
    kv = KvPool(100, 16)
    kv.acquire(2, "a", 5)
    kv.release(2, "a", keep_blocks=4)  # the partial last block is not cached
    assert kv.hit(2, "a") == (2, 4)
    assert kv.hit(2, "b") == (2, 0)  # another program shares only the system prompt
    kv.check()


def test_system_prompts_of_different_lengths_share_one_prefix_and_lose_no_block() -> None:
    # Sessions of an imported trace each bring their own system prompt length; the shorter
    # is a prefix of the longer (as the live driver writes them). Taking a longer idle
    # system chain for a shorter prompt lost the difference from the ledger.
    kv = KvPool(100, 16)
    kv.acquire(6, "long", 2)
    kv.release(6, "long", 2)
    plan = kv.acquire(4, "short", 2)  # the idle 6-block chain serves a 4-block prompt
    assert (plan.system_hit, plan.new_blocks) == (4, 2)
    kv.check()
    grown = kv.acquire(8, "longer", 1)  # held by "short": grows to 8 blocks, 2 of them new
    assert (grown.system_hit, grown.new_blocks) == (6, 3)
    kv.release(4, "short", 2)
    kv.release(8, "longer", 1)
    assert kv.resident(SYSTEM_CHAIN) == 8
    assert kv.hit(6, "long") == (6, 2)
    kv.check()


@pytest.mark.parametrize("host_blocks", [0, 40])
def test_the_ledger_adds_up_through_mixed_system_prompts_evictions_and_pins(
    host_blocks: int,
) -> None:
    rng = random.Random(7)
    kv = KvPool(60, 16, host_blocks=host_blocks)
    running: dict[str, int] = {}  # chain -> its request's system blocks
    for _ in range(3000):
        chain = f"p{rng.randrange(12)}"
        op = rng.random()
        if chain in running:
            if op < 0.8:
                kv.release(running.pop(chain), chain, keep_blocks=rng.randrange(12),
                           pin=rng.random() < 0.2)
        elif op < 0.6:
            system = rng.choice([0, 2, 4, 6])
            blocks = rng.randrange(1, 12)
            if kv.plan(system, chain, blocks).fits:
                kv.acquire(system, chain, blocks)
                running[chain] = system
        elif op < 0.7:
            kv.retire(chain)
        elif op < 0.85:
            kv.unpin(chain)
        else:
            kv.pin(chain)
        kv.check()


def test_lru_evicts_the_least_recently_released_chain_first_and_from_its_tail() -> None:
    kv = KvPool(10, 16)
    kv.acquire(0, "a", 4)
    kv.release(0, "a", 4)
    kv.acquire(0, "b", 4)
    kv.release(0, "b", 4)
    kv.acquire(0, "c", 5)  # 2 free blocks, so 3 are evicted: a's last three
    assert (kv.resident("a"), kv.resident("b")) == (1, 4)
    assert kv.hit(0, "a") == (0, 1)  # what is left of a is still a usable prefix
    kv.check()


def test_system_prompt_is_evicted_after_the_histories_that_extend_it() -> None:
    kv = KvPool(8, 16)
    kv.acquire(2, "a", 2)
    kv.release(2, "a", 2)
    kv.acquire(0, "x", 6)  # 4 free: evicts a's 2 blocks before the shared prompt
    assert kv.resident("a") == 0 and kv.resident(SYSTEM_CHAIN) == 2
    kv.check()


def test_own_history_is_unreachable_once_the_shared_prefix_is_trimmed() -> None:
    kv = KvPool(8, 16)
    kv.acquire(2, "a", 2)
    kv.release(2, "a", 2, pin=True)
    kv.acquire(0, "x", 5)  # 4 free, a pinned: one system block goes
    assert kv.resident("a") == 2
    assert kv.hit(2, "a") == (1, 0)
    kv.check()


def test_pinned_chain_is_never_evicted_and_evicted_first_once_unpinned() -> None:
    kv = KvPool(10, 16)
    kv.acquire(0, "a", 4)
    kv.release(0, "a", 4, pin=True)
    kv.acquire(0, "b", 4)
    kv.release(0, "b", 4)
    assert kv.plan(0, "c", 6).fits  # 2 free + b's 4
    assert not kv.plan(0, "c", 7).fits  # a's 4 are pinned
    kv.acquire(0, "c", 6)
    assert (kv.resident("a"), kv.resident("b")) == (4, 0)
    kv.release(0, "c", 6)
    assert kv.unpin("a")
    kv.acquire(0, "d", 2)
    assert (kv.resident("a"), kv.resident("c")) == (2, 6)
    kv.check()


# ---- engine -------------------------------------------------------------------------------

LINEAR = TimingModel("test", prefill_pass_s=0.0, prefill_per_token_s=0.001, decode_base_s=0.01)


def _worker(blocks: int = 64, *, jumps: bool = True,
            timing: TimingModel = LINEAR) -> tuple[EventLoop, Worker, list[SimRequest]]:
    loop = EventLoop()
    done: list[SimRequest] = []
    worker = Worker(0, EngineConfig(blocks, 16, timing), loop, lambda r: None, done.append,
                    jumps=jumps)
    return loop, worker, done


def _request(session: str, turn: int, prompt: int, output: int, now: float = 0.0,
             system: int = 32) -> SimRequest:
    return SimRequest(f"{session}/{turn}", session, turn, prompt, output, system, now)


def test_next_turn_is_served_from_the_previous_turns_prompt_and_reply() -> None:
    loop, worker, done = _worker()
    worker.submit(_request("a", 0, 100, 20))
    loop.run(10.0)
    assert done[0].finished_at == pytest.approx(0.1 + 19 * 0.01)  # prefill, then 19 decodes
    worker.submit(_request("a", 1, 150, 5, now=loop.now))
    loop.run(20.0)
    assert done[1].cached_tokens == 120 // 16 * 16  # whole blocks of 100 + 20 tokens
    assert done[1].prefill_left == 0 and done[1].generated == 5


def test_the_selector_sees_each_workers_load_as_the_kv_router_predicts_it_for_the_turn() -> None:
    loop = EventLoop()
    workers = [Worker(i, EngineConfig(64, 16, LINEAR), loop, lambda r: None, lambda r: None)
               for i in range(2)]
    workers[0].submit(_request("a", 0, 100, 20))
    loop.run(10.0)  # a's 100 + 20 tokens are cached on worker 0, nothing runs
    follow = _request("a", 1, 150, 5, now=loop.now)
    home, other = potential_loads(Cluster(workers), follow)
    # the uncached rest of its own prompt (150 - 7 cached blocks), and its 10 blocks
    assert (home.prefill_tokens, home.decode_blocks) == (150 - 112, 10)
    assert (other.prefill_tokens, other.decode_blocks) == (150, 10)  # a re-prefill there
    workers[1].submit(_request("b", 0, 300, 50, system=0))  # queued or running there
    _, busier = potential_loads(Cluster(workers), follow)
    assert busier.prefill_tokens > 150 and busier.decode_blocks > 10


def test_stock_keeps_a_session_on_its_worker_however_busy_as_dynamos_soft_affinity_does(
        ) -> None:
    """Live, Dynamo 1.6.1's soft affinity never moves a session off a serving worker
    (tests/e2e/test_stack_smoke.py); a slack models an affinity that weighs load."""
    loop = EventLoop()
    workers = [Worker(i, EngineConfig(64, 16, LINEAR), loop, lambda r: None, lambda r: None)
               for i in range(2)]
    for n in range(3):
        workers[0].submit(_request(f"busy{n}", 0, 200, 100, system=0))  # worker 0 decodes
    follow = _request("a", 1, 40, 5, now=loop.now)
    cluster = Cluster(workers)
    assert kv_route(cluster, follow, None) == 1  # unbound: the cheaper worker
    assert kv_route(cluster, follow, 0) == 0  # bound: its worker, however busy
    assert kv_route(cluster, follow, 0, affinity_slack=0.1) == 1


def test_request_waits_in_the_queue_until_its_blocks_fit() -> None:
    loop, worker, done = _worker(blocks=10)
    worker.submit(_request("a", 0, 100, 20, system=0))  # 8 blocks
    worker.submit(_request("b", 0, 60, 10, system=0))  # 5 blocks: waits for a
    loop.run(10.0)
    a, b = sorted(done, key=lambda r: r.session_id)
    assert b.scheduled_at == a.finished_at


def test_decode_jumps_give_the_same_times_as_pass_by_pass_simulation() -> None:
    rng = random.Random(7)
    arrivals = [(rng.uniform(0, 2.0), f"s{i}", rng.randint(20, 400), rng.randint(1, 80))
                for i in range(30)]

    def simulate(jumps: bool) -> list[tuple[str, float, int]]:
        loop, worker, done = _worker(blocks=60, jumps=jumps)
        for when, session, prompt, output in sorted(arrivals):
            request = _request(session, 0, prompt, output, now=when)
            loop.at(when, partial(worker.submit, request))
        loop.run(100.0)
        assert len(done) == len(arrivals)
        worker.kv.check()
        return sorted((r.session_id, r.finished_at or 0.0, r.cached_tokens) for r in done)

    fast, slow = simulate(True), simulate(False)
    assert [(s, c) for s, _, c in fast] == [(s, c) for s, _, c in slow]
    assert [t for _, t, _ in fast] == pytest.approx([t for _, t, _ in slow], abs=1e-9)


# ---- runs and sweeps ------------------------------------------------------------------------


def _small(window_s: float = 90.0) -> Scenario:
    return replace(regime_scenario("cheap-recompute"), warmup_s=30.0, window_s=window_s)


def test_same_seed_gives_identical_output() -> None:
    spec = SweepSpec(scenario=_small(40.0), arms=("ours", "stock", "ttl-pinning",
                                                  "upstream"), agents=(4, 16), seed=3, ttl_s=1.0)
    first, second = run_sweep(spec), run_sweep(spec)
    assert json.dumps(to_json(spec, first)) == json.dumps(to_json(spec, second))
    assert markdown(spec, first) == markdown(spec, second)
    other = run_sweep(replace(spec, seed=4))
    assert to_json(spec, other) != to_json(spec, first)


def test_stock_routing_thrashes_past_the_capacity_while_ours_keeps_its_cache() -> None:
    # The parity policy: program-aware admission without the extensions, some of which
    # trade hit rate for throughput where recompute is cheap (docs/benchmarks.md).
    spec = SweepSpec(scenario=_small(), arms=("ours", "stock"), agents=(5, 30),
                     policy=str(PARITY_POLICY))
    hit = {(r.arm, r.agents): r.hit_rate or 0.0 for r in run_sweep(spec)}
    assert hit[("stock", 5)] > 0.8
    assert hit[("stock", 30)] < 0.5  # caches evicted during tool calls
    assert hit[("ours", 30)] > 0.85
    assert hit[("ours", 30)] > hit[("stock", 30)] + 0.3


@pytest.mark.parametrize("arm_name", ["ours", "upstream"])
def test_program_arms_release_every_program_after_the_session_finals(arm_name: str) -> None:
    scenario = _small()
    config = RunConfig(agents=30, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s)
    sim: Simulation | None = None
    # The parity policy: the extended one pauses nothing where recompute is this cheap.
    policy = str(PARITY_POLICY) if arm_name == "ours" else None
    arm = build_arm(arm_name, policy=policy, ttl_s=1.0,
                    clock=lambda: sim.now() if sim is not None else 0.0)
    sim = Simulation(config, arm, scenario.plans(0))
    result = sim.run()
    assert result.pauses > 0  # the gate was exercised
    assert result.drained and result.problems == ()
    assert isinstance(arm, ProgramArm)
    table = arm.scheduler.table
    assert not table.programs and not table.requests
    assert not any(p.phase is Phase.REASONING for p in table.programs.values())


def test_upstream_marks_every_reasoning_program_once_no_acting_one_is_left() -> None:
    def overloaded(scheduler: Scheduler) -> list[str]:
        scheduler.set_workers(frozenset({0}), {})  # cold start: released without a card
        for i in range(3):
            scheduler.submit(f"r{i}", f"s{i}", 400, 0.0)
            scheduler.sent(f"r{i}", WorkerKey(0), 0.0)
        scheduler.set_workers(frozenset({0}), {WorkerKey(0): CapacityCard(1000, 1)})
        return sorted(scheduler.tick(1.0).marked)  # usage 3 x (400 + 100) = 1500

    assert overloaded(Scheduler(UPSTREAM_PARAMETERS)) == ["s0", "s1", "s2"]
    parity_rule = UPSTREAM_PARAMETERS.model_copy(update={"pause_rule": "parity"})
    assert overloaded(Scheduler(parity_rule)) == ["s0"]  # ours stops at the target


# ---- command line ---------------------------------------------------------------------------


def test_bench_sim_prints_json_with_figures_per_arm(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--agents", "3",
                     "--arms", "ours,stock", "--window-s", "20", "--warmup-s", "5",
                     "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["arm"] for r in data["results"]] == ["ours", "stock"]
    assert all("steps_per_min" in r and "hit_rate" in r for r in data["results"])


def test_one_case_runs_as_the_sweep_runs_it_and_names_more_than_one() -> None:
    flags = ["--regime", "cheap-recompute", "--agents", "3", "--window-s", "20",
             "--warmup-s", "5"]
    figures = run_case([*flags, "--arms", "ours"])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert figures == run_sweep(spec_from_args(parser.parse_args([*flags, "--arms", "ours"])))[0]
    with pytest.raises(ValueError, match="one arm at one --agents value, not arms ours,stock"):
        run_case([*flags, "--arms", "ours,stock"])


def test_bench_sim_prints_a_markdown_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--agents", "2,4",
                     "--arms", "stock,upstream", "--window-s", "20", "--warmup-s", "5"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| N | stock | upstream |" in out and "| 4 | upstream |" in out


def test_bench_sim_names_a_bad_policy(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text("request_classifier:\n  type: thunderagent\n  parameters:\n"
                      "    pause_threshold: 2\n")
    code = cli.main(["bench", "sim", "--policy", str(policy), "--agents", "2"])
    assert code == 2
    assert "pause_threshold" in capsys.readouterr().err


# ---- other tenants' traffic (--background) ------------------------------------------------
class _Recording(StockArm):
    """Stock routing that records which hooks hear of which request."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int | None]] = []

    def submit_sessionless(self, request: SimRequest) -> None:
        self.calls.append(("submit", request.request_id, request.worker))
        super().submit_sessionless(request)

    def sessionless_started(self, request: SimRequest) -> None:
        self.calls.append(("started", request.request_id, request.worker))

    def sessionless_ended(self, request: SimRequest) -> None:
        self.calls.append(("ended", request.request_id, request.worker))

    def first_token(self, request: SimRequest) -> None:
        self.calls.append(("turn", request.request_id, request.worker))


def _run_with_background(arm: Any, background: Background, agents: int = 8) -> Any:
    scenario = _small(40.0)
    config = RunConfig(agents=agents, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s,
                       background=background)
    return Simulation(config, arm, scenario.plans(0)).run()


def test_background_requests_run_beside_the_agents_each_heard_of_once_in_order() -> None:
    arm = _Recording()
    result = _run_with_background(arm, Background(3, 500, 20))
    assert result.drained and result.problems == ()
    sessionless = [c for c in arm.calls if c[0] != "turn"]
    ids = {request_id for _, request_id, _ in sessionless}
    assert len(ids) > 3  # the loops went on, back to back
    for request_id in ids:
        seen = [(kind, worker) for kind, rid, worker in sessionless if rid == request_id]
        assert [kind for kind, _ in seen] == ["submit", "started", "ended"], seen
        assert seen[1][1] is not None and seen[1][1] == seen[2][1]  # on one worker
    # They are no agent's: the turn hooks never hear of them, and they are not turns.
    assert not ids & {request_id for kind, request_id, _ in arm.calls if kind == "turn"}
    assert result.background is not None and result.background["completed"] > 0
    assert result.background["latency_p50_s"] > 0
    assert "background" in result.to_dict()


def test_without_background_or_a_rollout_the_figures_read_as_before() -> None:
    scenario = _small(20.0)
    config = RunConfig(agents=2, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s)
    result = Simulation(config, StockArm(), scenario.plans(0)).run()
    for key in ("background", "rollout"):
        assert getattr(result, key) is None and key not in result.to_dict()
        assert key not in scenario.describe()


def test_ours_holds_room_for_running_sessionless_requests_and_gives_it_all_back() -> None:
    sim: Simulation | None = None
    arm = build_arm("ours", policy=str(EXTENDED_POLICY), ttl_s=1.0,
                    clock=lambda: sim.now() if sim is not None else 0.0)
    assert isinstance(arm, ProgramArm)
    assert arm.scheduler.params.sessionless_kv == "reserve"
    held: list[int] = []
    started = arm.sessionless_started

    def spy(request: SimRequest) -> None:
        started(request)
        held.append(sum(arm.scheduler.snapshot(0.0)["sessionless_tokens"].values()))

    arm.sessionless_started = spy  # type: ignore[method-assign]
    scenario = _small(40.0)
    config = RunConfig(agents=8, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s,
                       background=Background(3, 500, 20))
    sim = Simulation(config, arm, scenario.plans(0))
    result = sim.run()
    assert result.drained and result.problems == ()
    assert held and min(held) >= 500  # each start holds at least its own prompt
    assert arm.scheduler.snapshot(sim.now())["sessionless_tokens"] == {}


def test_bench_sim_background_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--agents", "3",
                     "--arms", "ours,stock", "--window-s", "20", "--warmup-s", "5",
                     "--background", "2:300:16"])
    assert code == 0
    out = capsys.readouterr().out
    assert "other tenants: 2 loops of sessionless requests, 300 unique prompt" in out
    assert "- N=3 stock: " in out
    for bad, message in (("0", "needs concurrency"), ("2:300", "CONCURRENCY:PROMPT_TOKENS"),
                         ("2:99999999:1", "exceed a worker's KV pool")):
        assert cli.main(["bench", "sim", "--agents", "2", "--background", bad]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("prompt_less", [-1, 16])
def test_background_requests_larger_than_a_worker_are_refused_up_front(prompt_less: int) -> None:
    # One that never fits would wait at the head of its worker's queue for ever; the prompt
    # may fit while prompt and output do not.
    scenario = _small(20.0)
    pool = scenario.engine().capacity_tokens
    config = RunConfig(agents=2, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=scenario.warmup_s, window_s=scenario.window_s,
                       background=Background(1, pool - prompt_less, 64))
    with pytest.raises(ValueError, match="exceed a worker's KV pool"):
        Simulation(config, StockArm(), scenario.plans(0))


def test_the_extended_policy_bounds_every_wait_at_its_resume_timeout(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The agentic-code shape (aiperf's distributions), 16 agents, about 3.5x the KV: the
    largest programs (up to 75% of a worker) wait for a rank to drain, for minutes with
    parity's 1800 s timeout; the shipped policy releases a turn once it has waited
    ``resume_timeout_seconds`` (plus a tick). (Without the timeout, the comparison also
    leaves out ``pause_min_resume_loss``, which lets waiting turns run on a rank judged to
    keep paused programs, and ``acting_yield_factor``, whose yielded programs free room;
    in this run each shortens the longest wait by itself.)"""
    classifier = load_policy(EXTENDED_POLICY).classifier
    assert classifier is not None
    parameters = classifier.parameters
    assert isinstance(parameters, ThunderAgentParameters)
    bound = parameters.resume_timeout_seconds + parameters.scheduler_interval_seconds
    waits = []
    without_timeout = tmp_path / "without-timeout.yaml"
    text = (ABLATION_DIR / "minus_resume_timeout_seconds.yaml").read_text(encoding="utf-8")
    for line in ("    pause_min_resume_loss: 0.2\n", "    acting_yield_factor: 1\n"):
        assert line in text
        text = text.replace(line, "")
    without_timeout.write_text(text, encoding="utf-8")
    for policy in (EXTENDED_POLICY, without_timeout):
        code = cli.main(["bench", "sim", "--regime", "calibrated", "--workload",
                         "agentic-code", "--agents", "16", "--arms", "ours", "--window-s",
                         "1200", "--policy", str(policy), "--json"])
        assert code == 0
        (ours,) = json.loads(capsys.readouterr().out)["results"]
        waits.append(ours["wait_max_s"])
    shipped, without = waits
    assert parameters.max_wait_seconds is not None
    assert parameters.max_wait_seconds < shipped <= bound < without


# ---- a rollout: one batch run to its end (--rollout) ----------------------------------------
def _rollout(arm_name: str, agents: int = 12, cap_s: float = 3600.0,
             plans: Any = None) -> tuple[Any, Simulation]:
    scenario = replace(_small(), warmup_s=0.0, window_s=cap_s, rollout=True)
    config = RunConfig(agents=agents, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=0.0, window_s=cap_s, rollout=True)
    sim: Simulation | None = None
    arm = build_arm(arm_name, policy=str(PARITY_POLICY), ttl_s=1.0,
                    clock=lambda: sim.now() if sim is not None else 0.0)
    sim = Simulation(config, arm, plans if plans is not None
                     else islice(scenario.plans(0), agents))
    return sim.run(), sim


def test_a_rollout_runs_the_same_agents_to_their_end_in_every_arm() -> None:
    by_arm = {name: _rollout(name) for name in ("stock", "ours")}
    turns = {name: sorted((r.session_id, r.turn) for r in sim.records)
             for name, (_, sim) in by_arm.items()}
    assert turns["stock"] == turns["ours"]  # the same batch, every turn of it
    sessions = {s for s, _ in turns["stock"]}
    assert len(sessions) == 12
    for result, sim in by_arm.values():
        assert result.drained and result.problems == ()
        batch = result.rollout
        assert batch is not None and batch["runs"] == 12 == result.agents_completed
        # The batch ends with its last agent; every turn counts, over that makespan.
        assert batch["makespan_s"] == sim.now() == max(r.end for r in sim.records)
        assert result.steady_turns == len(sim.records)
        assert result.steps_per_min == pytest.approx(
            len(sim.records) / (batch["makespan_s"] / 60.0))
        assert batch["run_mean_s"] <= batch["run_p90_s"] <= batch["makespan_s"]
        assert "rollout" in result.to_dict()


def test_a_rollout_cut_by_its_cap_has_no_makespan_and_counts_the_runs_that_ended() -> None:
    result, sim = _rollout("stock", cap_s=20.0)
    assert result.drained  # the agents still running were released at their next boundary
    batch = result.rollout
    assert batch is not None and batch["makespan_s"] is None
    assert batch["runs"] == result.agents_completed < 12
    assert result.steps_per_min == pytest.approx(
        sum(1 for r in sim.records if r.end < 20.0) / (20.0 / 60.0))


def test_a_rollout_whose_every_agent_is_refused_ends_at_once() -> None:
    scenario = _small()
    huge = [replace(p, system_tokens=scenario.engine().capacity_tokens)
            for p in islice(scenario.plans(0), 3)]
    result, sim = _rollout("stock", agents=3, plans=iter(huge))
    assert result.errors == 3 and result.drained
    assert result.rollout == {"makespan_s": None, "runs": 0, "run_mean_s": None,
                              "run_p90_s": None}  # runs were lost: no makespan, as live
    assert result.steps_per_min == 0.0 and sim.now() == 0.0  # over at once, not at the cap


def test_a_rollout_with_a_warm_up_is_refused() -> None:
    scenario = _small(20.0)
    config = RunConfig(agents=2, workers=scenario.workers, engine=scenario.engine(),
                       warmup_s=5.0, window_s=20.0, rollout=True)
    with pytest.raises(ValueError, match="need warmup_s = 0"):
        config.validate()


def test_bench_sim_rollout_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--agents", "4",
                     "--arms", "stock,ours", "--rollout"])
    assert code == 0
    out = capsys.readouterr().out
    assert "rollout: one batch of N agents started together" in out
    assert "capped at 86400 s" in out and "| N | arm | makespan s | runs |" in out
    assert "| 4 | ours | " in out
    assert cli.main(["bench", "sim", "--agents", "2", "--rollout", "--warmup-s", "5"]) == 2
    assert "--warmup-s does not apply to --rollout" in capsys.readouterr().err


def test_a_rollout_that_lost_a_run_has_no_makespan_but_ends_with_its_batch() -> None:
    scenario = _small()
    plans = list(islice(scenario.plans(0), 3))
    plans[0] = replace(plans[0], system_tokens=scenario.engine().capacity_tokens)  # refused
    result, sim = _rollout("stock", agents=3, plans=iter(plans))
    assert result.errors == 1 and result.rollout is not None
    assert result.rollout["runs"] == 2 and result.rollout["makespan_s"] is None
    end = max(r.end for r in sim.records)
    assert end < 3600.0  # the batch ended long before its cap, and its figures with it
    assert result.steps_per_min == pytest.approx(len(sim.records) / (sim.now() / 60.0))
    assert sim.now() == pytest.approx(end)


def _spec(*flags: str) -> SweepSpec:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return spec_from_args(parser.parse_args(list(flags)))


def test_live_sizing_gives_the_pool_agents_and_window_bench_live_runs_in_real_units() -> None:
    from dynamo_thunderagent.bench import live

    config = live.LiveConfig(regimes=("calibrated",), arms=(), workload="long", seed=2)
    setup, sweep = config.plan("calibrated")
    assert setup.token_scale == 0.1 and setup.time_scale == 0.25  # mocker units, not real
    spec = _spec("--regime", "calibrated", "--workload", "long", "--seed", "2",
                 "--live-sizing")
    s = spec.scenario
    # a mocker token stands for 10 real ones and a mocker second for 4 real ones
    assert s.blocks == round(sweep.num_gpu_blocks / 0.1)
    assert spec.agents == sweep.agents
    assert s.workload.token_scale == pytest.approx(1.0)
    assert s.workload.time_scale == pytest.approx(1.0)
    # live's window includes its warm-up; the simulator's window follows it
    assert (s.window_s, s.warmup_s) == ((config.window_s - config.warmup_s) / 0.25,
                                        config.warmup_s / 0.25)
    assert s.warm_start and s.describe()["warm_start"] is True
    # the agents bench live starts, joined at the same turns, their prompts in real tokens
    n = sweep.agents[-1]
    sim_plans = list(islice(warm_start(s.plans(2), n, 2), n))
    live_plans = list(islice(live.run_plans(setup, 2, n), n))
    assert [p.joined_at for p in sim_plans] == [p.joined_at for p in live_plans]
    assert any(p.joined_at > 0 for p in sim_plans)
    assert [p.prompt_tokens(0) for p in sim_plans] == [
        pytest.approx(p.prompt_tokens(0) / 0.1, rel=0.05) for p in live_plans]


def test_live_sizing_in_the_cheap_recompute_regime_keeps_the_mockers_units() -> None:
    from dynamo_thunderagent.bench import live

    config = live.LiveConfig(regimes=("cheap-recompute",), arms=(), workload="long")
    setup, sweep = config.plan("cheap-recompute")
    assert setup.token_scale < 1.0  # the shape shrunk to the mocker's small pool
    spec = _spec("--regime", "cheap-recompute", "--workload", "long", "--live-sizing",
                 "--agents", "5", "--window-s", "30")
    assert spec.scenario.blocks == sweep.num_gpu_blocks
    assert spec.scenario.workload.token_scale == setup.token_scale
    assert spec.agents == (5,)
    assert (spec.scenario.window_s, spec.scenario.warmup_s) == (30.0, config.warmup_s)


def test_live_sizing_refuses_the_flags_it_sets(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--blocks", "--token-scale", "--time-scale"):
        assert cli.main(["bench", "sim", "--live-sizing", flag, "2"]) == 2
        assert f"--live-sizing sizes the pool and the scales as bench live does; leave out " \
               f"{flag}" in capsys.readouterr().err


def test_a_warm_started_run_joins_its_first_agents_mid_program() -> None:
    scenario = replace(_small(20.0), warm_start=True)
    seen: list[Any] = []

    class Recording(Simulation):
        def __init__(self, config: RunConfig, arm: Any, plans: Any) -> None:
            def recorded() -> Any:
                for plan in plans:
                    seen.append(plan)
                    yield plan

            super().__init__(config, arm, recorded())

    import dynamo_thunderagent.bench.sim.run as run_module

    original = run_module.Simulation
    run_module.Simulation = Recording  # type: ignore[misc]
    try:
        run_module.run_one(scenario, "stock", 4, 0, None, 1.0)
    finally:
        run_module.Simulation = original  # type: ignore[misc]
    assert len(seen) > 4
    assert any(p.joined_at > 0 for p in seen[:4])
    assert all(p.joined_at == 0 for p in seen[4:])


def test_live_sizing_sizes_a_host_tier_from_the_pool_it_sets() -> None:
    s = _spec("--regime", "tiered", "--live-sizing", "--agents", "4").scenario
    tier = regime_named("tiered").host_tier
    assert tier is not None and s.blocks != regime_scenario("tiered").blocks
    assert s.host_blocks == tier.host_blocks(s.blocks)


def test_factors_set_the_agent_counts_and_with_live_sizing_the_pool(
        capsys: pytest.CaptureFixture[str]) -> None:
    preset = _spec("--regime", "cheap-recompute")
    halves = _spec("--regime", "cheap-recompute", "--factors", "1,2")
    assert preset.agents[1] == halves.agents[0] and preset.agents[3] == halves.agents[1]
    # bench live --factors 1: the same 24 agents on three times the pool of --factors 3
    at_1x = _spec("--live-sizing", "--factors", "1", "--agents", "24").scenario
    at_3x = _spec("--live-sizing", "--agents", "24").scenario
    assert at_1x.blocks == pytest.approx(3 * at_3x.blocks, rel=0.01)
    for bad in ("1,0", "1,nan", "inf"):
        with pytest.raises(SystemExit):
            cli.main(["bench", "sim", "--factors", bad])
        assert f"expected numbers above 0, at most 100, got '{bad}'" in capsys.readouterr().err


def test_live_sizing_takes_other_tenants_tokens_in_lives_units_and_checks_its_pool() -> None:
    # bench live --background counts mocker tokens: one stands for 10 real ones when calibrated
    s = _spec("--live-sizing", "--background", "3:800:64", "--agents", "2").scenario
    assert s.background == Background(3, 8000, 640)
    cheap = _spec("--regime", "cheap-recompute", "--live-sizing", "--background", "3:800:64",
                  "--agents", "2").scenario
    assert cheap.background == Background(3, 800, 64)
    # 200k real tokens fit the preset worker (262k tokens) but not the SWE trace's live pool
    live_pool = _spec("--live-sizing", "--agents", "2").scenario.capacity_tokens // 2
    assert live_pool < 200_000 < regime_scenario("calibrated").capacity_tokens // 2
    _spec("--background", "1:200000:8", "--agents", "2")
    with pytest.raises(ValueError, match="--background: background requests of 200000 prompt"):
        _spec("--live-sizing", "--background", "1:20000:8", "--agents", "2")


def test_live_sizing_caps_a_rollout_at_lives_cap_and_says_it_was_live_sized() -> None:
    from dynamo_thunderagent.bench.live_sweep import ROLLOUT_CAP_S

    spec = _spec("--live-sizing", "--rollout", "--agents", "2")
    s = spec.scenario
    assert s.window_s == ROLLOUT_CAP_S / 0.25 and s.warmup_s == 0.0 and not s.warm_start
    assert s.describe()["live_sized"] is True and "warm_start" not in s.describe()
    assert "live_sized" not in regime_scenario("calibrated").describe()
    text = markdown(replace(spec, agents=()), [])
    assert "- sized as bench live sizes it (--live-sizing)\n" in text
    assert "join their programs" not in text
    assert _spec("--rollout", "--agents", "2").scenario.window_s == sim_command.ROLLOUT_CAP_S


def test_factors_and_agents_together_are_refused_without_live_sizing(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--factors picks the agent counts and --agents"):
        _spec("--factors", "1,2", "--agents", "4")
    assert cli.main(["bench", "sim", "--factors", "1", "--agents", "4"]) == 2
    assert "error: --factors picks the agent counts" in capsys.readouterr().err
