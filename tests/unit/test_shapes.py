"""The long-session and fan-out shapes: generators, prompts, driver, simulator, sweeps."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import random
from itertools import islice
from types import SimpleNamespace
from typing import Any

import pytest

from dynamo_thunderagent import cli
from dynamo_thunderagent.bench import live_cli, live_sweep, workload
from dynamo_thunderagent.bench.driver import _Run
from dynamo_thunderagent.bench.metrics import recomputed_tokens
from dynamo_thunderagent.bench.prompts import History, PromptText, TemplateOverhead
from dynamo_thunderagent.bench.records import TurnRecord
from dynamo_thunderagent.bench.shapes import (
    AGENTIC_CODE_WORKLOAD,
    FANOUT_WORKLOAD,
    LONG_WORKLOAD,
    SHAPE_POOL_TOKENS,
    SHAPES,
    AgenticCodeSpec,
    FanoutSpec,
    LogNormal,
    LongSessionSpec,
    shape_token_factor,
)
from dynamo_thunderagent.bench.sim.arms import build_arm
from dynamo_thunderagent.bench.sim.engine import EngineConfig
from dynamo_thunderagent.bench.sim.kv import SYSTEM_CHAIN, KvPool
from dynamo_thunderagent.bench.sim.simulation import RunConfig, Simulation
from dynamo_thunderagent.bench.sim.timing import TimingModel
from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan, agent_stream, make_agents
from dynamo_thunderagent.cli import build_parser
from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, PARENT_HEADER, SESSION_HEADER

# ---- generators ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shapes_are_seeded_and_a_longer_run_extends_a_shorter_one(name: str) -> None:
    spec = SHAPES[name]
    assert make_agents(spec, 12, seed=3) == make_agents(spec, 12, seed=3)
    assert make_agents(spec, 12, seed=3) != make_agents(spec, 12, seed=4)
    assert make_agents(spec, 30, seed=1)[:8] == make_agents(spec, 8, seed=1)
    assert list(islice(agent_stream(spec, 1), 8)) == make_agents(spec, 8, seed=1)
    ids = [q.session_id for p in make_agents(spec, 40, seed=0) for q in p.programs()]
    assert len(ids) == len(set(ids))
    assert all(i.startswith(f"{name}-0-") for i in ids)


def test_long_sessions_compact_to_the_system_prompt_plus_a_summary() -> None:
    spec = LONG_WORKLOAD
    plans = make_agents(spec, 64, seed=0)
    compactions = 0
    for plan in plans:
        assert spec.turns[0] <= len(plan.turns) <= spec.turns[1]
        assert plan.system_tokens == spec.system_prompt_tokens
        contexts = plan.context_tokens()
        for k in range(1, len(plan.turns)):
            turn = plan.turns[k]
            if turn.compaction:
                compactions += 1
                assert spec.summary_tokens[0] <= turn.new_tokens <= spec.summary_tokens[1]
                assert plan.prompt_tokens(k) == plan.system_tokens + turn.new_tokens
                assert plan.history_start(k) == k
            else:
                previous = plan.prompt_tokens(k - 1) + plan.turns[k - 1].output_tokens
                assert plan.prompt_tokens(k) == previous + turn.new_tokens
            assert contexts[k] == plan.prompt_tokens(k) + turn.output_tokens
        # Compaction keeps every context under the session's threshold (56k at most).
        assert plan.peak_context_tokens == max(contexts) <= spec.compaction_at_tokens[1]
        assert plan.peak_footprint_tokens == plan.peak_context_tokens
        assert plan.turns[-1].tool_seconds == 0.0
        assert all(t.tool_seconds <= 60.0 for t in plan.turns)
    assert compactions > 3 * len(plans)  # several a session on average
    peaks = [p.peak_context_tokens for p in plans]
    mean_peak = sum(peaks) / len(peaks)
    assert 5.5 < SHAPE_POOL_TOKENS / mean_peak < 6.5  # about six programs fit a worker
    prompts = [p.prompt_tokens(k) for p in plans for k in range(len(p.turns))]
    assert 0.35 < sum(prompts) / len(prompts) / mean_peak < 0.55


def test_fanout_parents_spawn_short_subagents_that_share_the_system_prompt() -> None:
    spec = FANOUT_WORKLOAD
    plans = make_agents(spec, 64, seed=0)
    fanouts = 0
    for plan in plans:
        assert spec.turns[0] <= len(plan.turns) <= spec.turns[1]
        assert not plan.turns[-1].subagents  # nobody would wait for them
        for k, turn in enumerate(plan.turns):
            if not turn.subagents:
                continue
            fanouts += 1
            assert spec.subagents[0] <= len(turn.subagents) <= spec.subagents[1]
            assert turn.tool_seconds == 0.0  # the wait is the subagents' time
            reports = 0
            for j, sub in enumerate(turn.subagents):
                assert sub.session_id == f"{plan.session_id}-sub{k}.{j}"
                assert sub.system_tokens == plan.system_tokens == spec.system_prompt_tokens
                assert spec.subagent_turns[0] <= len(sub.turns) <= spec.subagent_turns[1]
                assert not any(t.subagents or t.compaction for t in sub.turns)
                report = sub.turns[-1].output_tokens
                assert spec.subagent_report_tokens[0] <= report <= spec.subagent_report_tokens[1]
                reports += report
            assert plan.turns[k + 1].new_tokens == reports  # the parent reads the reports
        assert plan.peak_footprint_tokens > plan.peak_context_tokens - 1
    assert fanouts > 2 * len(plans)


def test_agentic_code_sessions_grow_by_a_tool_result_and_the_reply_until_reset_or_limit() -> None:
    spec = AGENTIC_CODE_WORKLOAD
    plans = make_agents(spec, 400, seed=0)
    limited = 0
    for plan in plans:
        assert plan.system_tokens == spec.system_prompt_tokens
        first = plan.turns[0].new_tokens - spec.project_tokens  # the session's own start
        assert 0 < first <= spec.session_tokens.cap
        for turn in plan.turns[1:]:  # each appends to the last prompt and reply
            assert not turn.compaction and not turn.subagents
            assert 0 <= turn.new_tokens <= spec.new_tokens.cap
        assert all(1 <= t.output_tokens <= spec.generated_tokens.cap for t in plan.turns)
        assert max(plan.prompt_tokens(k) for k in range(len(plan.turns))) <= spec.max_prompt_tokens
        assert len(plan.turns) <= spec.max_turns
        assert plan.turns[-1].tool_seconds == 0.0
        # Near the limit (within the largest tool result): retired there, or reset late.
        if plan.context_tokens()[-1] > spec.max_prompt_tokens - spec.new_tokens.cap:
            limited += 1
    assert 0.1 * len(plans) < limited < 0.6 * len(plans)  # resets end the others early
    # aiperf's means, within sampling error over about 4,000 draws.
    outputs = [t.output_tokens for p in plans for t in p.turns]
    assert 900 < sum(outputs) / len(outputs) < 1100
    news = [t.new_tokens for p in plans for t in p.turns[1:]]
    assert 5000 < sum(news) / len(news) < 7000
    gaps = [t.tool_seconds for p in plans for t in p.turns[:-1]]
    assert 0.6 < sum(g < 10.0 for g in gaps) / len(gaps) < 0.9  # mostly tool calls


def test_agentic_code_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="new_tokens must have 0 < median < mean"):
        dataclasses.replace(AGENTIC_CODE_WORKLOAD,
                            new_tokens=LogNormal(4000, 6000, 50000)).validate()
    # 32k + 10k + a 50k start fit 92k, not 50k: the first prompt would pass the limit.
    with pytest.raises(ValueError, match="max_prompt_tokens must hold the largest first "
                                         r"prompt .* = 92000\), got 50000"):
        AgenticCodeSpec(max_prompt_tokens=50_000).validate()
    with pytest.raises(ValueError, match=r"reset_probability must be in \[0, 1\], got 1.5"):
        AgenticCodeSpec(reset_probability=1.5).validate()
    with pytest.raises(ValueError, match="reset_context_scaling must be >= 0, got -1"):
        AgenticCodeSpec(reset_context_scaling=-1).validate()
    with pytest.raises(ValueError, match="project_tokens must be >= 0, got -1"):
        AgenticCodeSpec(project_tokens=-1).validate()
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        AgenticCodeSpec(max_turns=0).validate()
    spec = AGENTIC_CODE_WORKLOAD
    assert spec.reset_chance(0) == pytest.approx(0.05)
    assert spec.reset_chance(spec.max_prompt_tokens) == pytest.approx(0.05 * 2.5)
    # With a flat chance and no limit in reach, sessions last 1/p turns on average.
    flat = AgenticCodeSpec(reset_probability=0.1, reset_context_scaling=0.0,
                           max_prompt_tokens=10**12)
    lengths = [len(p.turns) for p in make_agents(flat, 1000, seed=0)]
    assert 9.0 < sum(lengths) / len(lengths) < 11.0
    # The chance grows with the prompt the session has reached: far fewer turns.
    growing = dataclasses.replace(flat, reset_context_scaling=10**11)
    grown = [len(p.turns) for p in make_agents(growing, 200, seed=0)]
    assert sum(grown) / len(grown) < 2.0
    never = AgenticCodeSpec(reset_probability=0.0)  # only the limit or the turn bound ends it
    for plan in make_agents(never, 50, seed=0):
        assert plan.context_tokens()[-1] > never.max_prompt_tokens - never.new_tokens.cap or (
            len(plan.turns) == never.max_turns)
    assert all(LogNormal(1000, 800, 10).draw(random.Random(i)) <= 10 for i in range(20))


def test_footprint_counts_the_shared_system_prompt_once() -> None:
    sub = AgentPlan("p-sub", 100, (TurnPlan(40, 10, 0.0),))  # own part: 50 tokens
    parent = AgentPlan("p", 100, (
        TurnPlan(200, 20, 0.0, subagents=(sub, sub)),
        TurnPlan(20, 10, 0.0),
    ))  # fmt: skip
    assert parent.peak_context_tokens == 100 + 200 + 20 + 20 + 10
    assert parent.peak_footprint_tokens == 100 + 200 + 20 + 2 * 50
    assert [p.session_id for p in parent.programs()] == ["p", "p-sub", "p-sub"]


def test_scaling_and_validation() -> None:
    assert shape_token_factor(SHAPE_POOL_TOKENS) == 1.0
    small = dataclasses.replace(LONG_WORKLOAD, token_scale=0.1, time_scale=0.25)
    plan, base = small.agent(0, 0), LONG_WORKLOAD.agent(0, 0)
    assert [t.compaction for t in plan.turns] == [t.compaction for t in base.turns]
    assert plan.peak_context_tokens == pytest.approx(base.peak_context_tokens * 0.1, rel=0.05)
    assert plan.turns[0].tool_seconds == pytest.approx(base.turns[0].tool_seconds * 0.25)
    with pytest.raises(ValueError, match="compaction_at_tokens"):
        LongSessionSpec(compaction_at_tokens=(1000, 2000)).validate()
    with pytest.raises(ValueError, match="subagents"):
        FanoutSpec(subagents=(0, 3)).validate()
    with pytest.raises(ValueError, match="fanout_probability"):
        FanoutSpec(fanout_probability=1.5).validate()


# ---- live prompts and driver ----------------------------------------------------------------


def _compacting_plan() -> AgentPlan:
    return AgentPlan("s", 30, (
        TurnPlan(50, 5, 0.0),
        TurnPlan(40, 5, 0.0),
        TurnPlan(20, 5, 0.0, compaction=True),
        TurnPlan(40, 5, 0.0),
    ))  # fmt: skip


def _tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


def test_a_compaction_prompt_shares_only_the_system_prompt_with_the_last_one() -> None:
    plan = _compacting_plan()
    history = History(plan, PromptText(), TemplateOverhead(), "job")
    prompts = []
    for k in range(len(plan.turns)):
        history.before_turn(k)
        prompts.append(list(history.messages))
        assert _tokens(history.messages) == plan.prompt_tokens(k)
    assert prompts[1][: len(prompts[0])] == prompts[0]  # an ordinary turn extends
    assert prompts[2][0] == prompts[1][0]  # the compaction keeps the system prompt
    assert len(prompts[2]) == 2 and prompts[2][1] not in prompts[1]
    assert prompts[3][:2] == prompts[2]  # and the new history grows from there
    assert plan.prompt_tokens(2) == 30 + 20


class _FakeCompletions:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        await asyncio.sleep(0)
        prompt = _tokens(kwargs["messages"])
        usage = SimpleNamespace(prompt_tokens=prompt, completion_tokens=kwargs["max_tokens"],
                                prompt_tokens_details=SimpleNamespace(cached_tokens=0))
        return SimpleNamespace(usage=usage)


def test_driver_runs_subagents_with_the_parent_header_and_their_own_finals() -> None:
    sub = AgentPlan("p-sub0", 30, (TurnPlan(10, 3, 0.0), TurnPlan(10, 4, 0.0)))
    plan = AgentPlan("p", 30, (
        TurnPlan(50, 5, 0.0, subagents=(sub, dataclasses.replace(sub, session_id="p-sub1"))),
        TurnPlan(8, 5, 0.0),
    ))  # fmt: skip
    completions = _FakeCompletions()
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))

    async def main() -> tuple[bool, _Run]:
        run = _Run(client, "m", iter(()), PromptText(), TemplateOverhead(), window_s=60.0,
                   drain_s=1.0, request_timeout_s=5.0, job="job", release_unfinished=True)
        finished = await run.run_agent(0, plan)
        await run.settle_finals(1.0)  # the subagents' finals, which nobody waited for
        return finished, run

    finished, run = asyncio.run(main())
    assert finished
    headers = [c["extra_headers"] for c in completions.calls]
    assert headers[0] == {SESSION_HEADER: "p"}
    subagent_calls = [h for h in headers if PARENT_HEADER in h]
    assert len(subagent_calls) == 2 * (2 + 1)  # two turns and a session-final each
    assert all(h[PARENT_HEADER] == "p" for h in subagent_calls)
    assert sum(1 for h in subagent_calls if h.get(FINAL_HEADER) == "true") == 2
    parent_calls = [k for k, h in enumerate(headers) if h == {SESSION_HEADER: "p"}]
    subagent_turns = [k for k, h in enumerate(headers) if PARENT_HEADER in h
                      and FINAL_HEADER not in h]
    assert len(parent_calls) == 2  # the parent goes on after both subagents' last turns
    assert parent_calls[1] > max(subagent_turns)
    assert {r.parent_session_id for r in run.records if r.session_id != "p"} == {"p"}
    # The parent's second turn appends its first reply: the fan-out did not break its prefix.
    assert completions.calls[-1]["messages"][:2] == completions.calls[0]["messages"]


def test_live_recomputed_tokens_count_nothing_reusable_at_a_compaction() -> None:
    def record(turn: int, prompt: int, cached: int, compaction: bool = False) -> TurnRecord:
        return TurnRecord("turn", 0, "s", turn, 0.0, 1.0, prompt, 5, prompt_tokens=prompt,
                          cached_tokens=cached, completion_tokens=5, compaction=compaction)

    records = [record(0, 100, 0), record(1, 140, 96), record(2, 50, 32, compaction=True)]
    assert recomputed_tokens(records, block_size=16, reuse_completion=False) == (0, 96)


# ---- simulator --------------------------------------------------------------------------------

FLAT = TimingModel("test", prefill_pass_s=0.0, prefill_per_token_s=0.0001, decode_base_s=0.001)


def _simulate(plans: list[AgentPlan], agents: int = 1) -> Simulation:
    config = RunConfig(agents=agents, workers=1, engine=EngineConfig(512, 16, FLAT),
                       warmup_s=0.0, window_s=50.0)
    sim: Simulation | None = None
    arm = build_arm("stock", policy=None, ttl_s=1.0,
                    clock=lambda: sim.now() if sim is not None else 0.0)
    # Idle agents after the ones under test (same system prompt: the pool shares one).
    system = plans[0].system_tokens
    filler = (AgentPlan(f"z{i}", system, (TurnPlan(10, 1, 1000.0), TurnPlan(1, 1, 0.0)))
              for i in range(10**6))
    sim = Simulation(config, arm, iter([*plans, *filler]))
    sim.run()
    return sim


def test_kv_retire_makes_the_old_chain_unreachable_garbage_in_its_lru_place() -> None:
    kv = KvPool(20, 16)
    kv.acquire(2, "a", 4)
    kv.release(2, "a", 4)
    kv.acquire(2, "b", 4)
    kv.release(2, "b", 4)
    assert kv.retire("a") == 4
    assert kv.hit(2, "a") == (2, 0)  # only the system prompt is left to hit
    assert kv.idle_blocks == 4 + 4 + 2  # garbage is still cached
    kv.acquire(0, "c", 10 + 4)  # 10 free, then the oldest idle: a's garbage, not b
    assert kv.resident("b") == 4 and kv.resident(SYSTEM_CHAIN) == 2
    kv.check()


def test_simulated_compaction_hits_only_the_system_prompt() -> None:
    plan = AgentPlan("s", 64, (
        TurnPlan(200, 20, 1.0),
        TurnPlan(100, 20, 1.0),
        TurnPlan(150, 20, 1.0, compaction=True),
        TurnPlan(100, 20, 0.0),
    ))  # fmt: skip
    sim = _simulate([plan])
    turns = sorted((r for r in sim.records if r.session_id == "s"), key=lambda r: r.turn)
    assert [r.prompt_tokens for r in turns] == [264, 384, 214, 334]
    assert turns[1].cached_tokens == (264 + 20) // 16 * 16  # extends turn 0
    assert turns[2].cached_tokens == 64  # the system prompt only
    assert turns[2].compaction and turns[2].reusable_tokens == 0
    assert turns[3].cached_tokens == (214 + 20) // 16 * 16  # the new history extends
    worker = sim.cluster[0]
    worker.kv.check()
    assert sim.records and not sim.errors


def test_simulated_parent_waits_for_all_its_subagents() -> None:
    subs = tuple(AgentPlan(f"p-sub{j}", 64, tuple(TurnPlan(30, 10, 2.0 * (j + 1))
                                                 for _ in range(2 + j)))
                 for j in range(3))  # fmt: skip
    plan = AgentPlan("p", 64, (
        TurnPlan(100, 10, 0.0, subagents=subs),
        TurnPlan(30, 10, 0.0),
    ))  # fmt: skip
    sim = _simulate([plan])
    by_session: dict[str, list[TurnRecord]] = {}
    for r in sim.records:
        by_session.setdefault(r.session_id, []).append(r)
    last_sub_end = max(r.end for s in subs for r in by_session[s.session_id])
    parent = sorted(by_session["p"], key=lambda r: r.turn)
    assert parent[1].start >= last_sub_end  # sent only once the slowest subagent ended
    assert parent[0].end <= min(r.start for s in subs for r in by_session[s.session_id])
    assert {r.parent_session_id for s in subs for r in by_session[s.session_id]} == {"p"}
    assert len(by_session["p-sub2"]) == 4
    assert sim.agents_completed == 1  # the parent; subagents are not agents


@pytest.mark.parametrize("workload", ["long", "fanout", "agentic-code"])
def test_bench_sim_runs_each_shape_on_a_small_n(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--workload", workload,
                     "--agents", "2,6", "--window-s", "60", "--warmup-s", "20", "--jobs", "1",
                     "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scenario"]["workload"]["session_prefix"] == workload
    assert data["scenario"]["workload"]["token_scale"] == shape_token_factor(1408 * 16)
    for result in data["results"]:
        assert result["steady_turns"] > 0 and result["errors"] == 0
        assert result["drained"] and not result["problems"]


def test_bench_sim_markdown_names_the_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "sim", "--regime", "cheap-recompute", "--workload", "long",
                     "--agents", "2", "--arms", "stock", "--window-s", "30",
                     "--warmup-s", "5", "--jobs", "1"])
    assert code == 0
    assert "- workload: long sessions, 60-200 turns" in capsys.readouterr().out


# ---- live sizing --------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["long", "fanout", "agentic-code"])
def test_live_dry_run_sizes_the_sweep_by_mean_peak_footprint(workload: str) -> None:
    args = build_parser().parse_args(
        ["bench", "live", "--regime", "all", "--workload", workload, "--repeats", "1"])
    config = live_cli.config_from_args(args)
    out = io.StringIO()
    assert live_cli.dry_run(config, out) == 0
    plan = json.loads(out.getvalue())
    for regime, data in plan["regimes"].items():
        setup, sweep = data["setup"], data["sweep"]
        assert setup["workload"] == workload
        if regime == "calibrated":
            assert sweep["agents"] == [4, 8, 16, 24]
        assert sweep["pressures"][-1] == pytest.approx(3.0, rel=0.05)
        assert sweep["note"] is None  # the largest program fits one worker
    calibrated = plan["regimes"]["calibrated"]["setup"]
    cheap = plan["regimes"]["cheap-recompute"]["setup"]
    assert calibrated["token_scale"] == pytest.approx(0.1)
    assert cheap["token_scale"] == pytest.approx(shape_token_factor(1408 * 16))


def test_live_plans_keep_subagents_and_compactions_through_overhead_and_warm_start() -> None:
    setup = dataclasses.replace(live_sweep.default_setup("calibrated"), workload="fanout")
    plans = list(islice(live_sweep.run_plans(setup, 0, 4), 8))
    fanned = [t for p in plans for t in p.turns if t.subagents]
    assert fanned
    overhead = setup.client_overhead_s * setup.time_scale
    sub = fanned[0].subagents[0]
    assert sub.turns[0].tool_seconds >= overhead  # subagents are clients too
    long_plan = make_agents(LONG_WORKLOAD, 1, 0)[0]
    k = next(i for i, t in enumerate(long_plan.turns) if i > 0 and t.compaction)
    joined = workload.start_at(long_plan, k)
    assert not joined.turns[0].compaction
    assert all(joined.prompt_tokens(j) == long_plan.prompt_tokens(k + j)
               for j in range(len(joined.turns)))


def test_bench_sim_tables_keep_a_decimal_where_a_shape_runs_few_steps_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["bench", "sim", "--regime", "calibrated", "--workload", "agentic-code",
                     "--agents", "2", "--arms", "stock", "--window-s", "600",
                     "--warmup-s", "60", "--jobs", "1"])
    assert code == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 2 | stock | "))
    steps = row.split(" | ")[2]
    assert float(steps) < 100 and "." in steps  # whole steps would hide a tenth of it
