"""Agent programs: seeded synthetic plans, scaling, and trace replay."""

from __future__ import annotations

import json
import random
import statistics
from itertools import islice
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.trace import load_trace, read_trace, replay_stream
from dynamo_thunderagent.bench.workload import (
    ToolTimeComponent,
    WorkloadSpec,
    agent_stream,
    default_tool_time,
    make_agents,
    scale_tokens,
)

SMALL = WorkloadSpec(
    turns=(3, 6),
    system_prompt_tokens=200,
    first_turn_tokens=(100, 300),
    tool_output_tokens=(20, 80),
    output_tokens=(5, 15),
)


def test_same_seed_gives_the_same_plans() -> None:
    assert make_agents(SMALL, 20, seed=7) == make_agents(SMALL, 20, seed=7)


def test_different_seeds_give_different_plans() -> None:
    assert make_agents(SMALL, 20, seed=7) != make_agents(SMALL, 20, seed=8)


def test_a_longer_run_extends_a_shorter_one() -> None:
    assert make_agents(SMALL, 30, seed=1)[:10] == make_agents(SMALL, 10, seed=1)
    assert list(islice(agent_stream(SMALL, 1), 10)) == make_agents(SMALL, 10, seed=1)


def test_session_ids_are_unique_within_a_run() -> None:
    plans = make_agents(SMALL, 200, seed=3)
    assert len({p.session_id for p in plans}) == 200


def test_draws_stay_inside_the_spec_ranges() -> None:
    for plan in make_agents(SMALL, 100, seed=5):
        assert plan.system_tokens == 200
        assert 3 <= len(plan.turns) <= 6
        assert 100 <= plan.turns[0].new_tokens <= 300
        for turn in plan.turns[1:]:
            assert 20 <= turn.new_tokens <= 80
        for turn in plan.turns:
            assert 5 <= turn.output_tokens <= 15
            assert 0 <= turn.tool_seconds <= 600
        assert plan.turns[-1].tool_seconds == 0.0


def test_prompt_of_a_turn_extends_the_previous_prompt_and_reply() -> None:
    plan = make_agents(SMALL, 1, seed=2)[0]
    assert plan.prompt_tokens(0) == plan.system_tokens + plan.turns[0].new_tokens
    for k in range(1, len(plan.turns)):
        expected = plan.prompt_tokens(k - 1) + plan.turns[k - 1].output_tokens
        assert plan.prompt_tokens(k) == expected + plan.turns[k].new_tokens
    last = len(plan.turns) - 1
    assert plan.peak_context_tokens == plan.prompt_tokens(last) + plan.turns[last].output_tokens


def test_token_and_time_scale_shrink_sizes_and_keep_their_ratios() -> None:
    base = make_agents(SMALL, 50, seed=9)
    scaled_spec = WorkloadSpec(**{**SMALL.__dict__, "token_scale": 0.5, "time_scale": 0.1})
    scaled = make_agents(scaled_spec, 50, seed=9)
    for a, b in zip(base, scaled, strict=True):
        assert len(a.turns) == len(b.turns)  # the same draws, only scaled
        assert b.system_tokens == scale_tokens(a.system_tokens, 0.5)
        for ta, tb in zip(a.turns, b.turns, strict=True):
            assert tb.new_tokens == scale_tokens(ta.new_tokens, 0.5)
            assert tb.output_tokens == max(1, scale_tokens(ta.output_tokens, 0.5))
            assert tb.tool_seconds == pytest.approx(ta.tool_seconds * 0.1)


def test_scaled_output_never_drops_to_zero_tokens() -> None:
    tiny = WorkloadSpec(**{**SMALL.__dict__, "token_scale": 0.001})
    assert all(t.output_tokens >= 1 for p in make_agents(tiny, 20, 0) for t in p.turns)


def test_default_tool_mixture_has_a_short_median_and_a_capped_heavy_tail() -> None:
    rng = random.Random(0)
    components = default_tool_time()
    weights = [c.weight for c in components]
    draws = [rng.choices(components, weights)[0].draw(rng) for _ in range(20_000)]
    assert 1.5 < statistics.median(draws) < 4.0
    assert max(draws) <= 600.0
    assert sum(d > 60 for d in draws) / len(draws) > 0.01


def test_pareto_component_is_bounded_by_its_cap() -> None:
    component = ToolTimeComponent(weight=1, kind="pareto", scale=10, shape=0.5, cap_seconds=50)
    rng = random.Random(1)
    draws = [component.draw(rng) for _ in range(2000)]
    assert min(draws) >= 10 and max(draws) == 50


@pytest.mark.parametrize(
    "field, value",
    [("turns", (0, 3)), ("output_tokens", (0, 4)), ("tool_output_tokens", (5, 2))],
)
def test_invalid_spec_names_the_field(field: str, value: tuple[int, int]) -> None:
    spec = WorkloadSpec(**{**SMALL.__dict__, field: value})
    with pytest.raises(ValueError, match=field):
        make_agents(spec, 1, 0)


def _write_trace(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(session: str, step: int, inp: int, out: int, tool: float) -> dict[str, object]:
    return {
        "session_id": session,
        "step": step,
        "input_tokens": inp,
        "output_tokens": out,
        "llm_seconds": 1.0,
        "tool_seconds": tool,
        "batch": session.split("/")[0],
    }


def test_trace_turn_growth_is_input_minus_previous_input_and_output(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "t.jsonl",
        [
            _row("bs1/a", 2, 1500, 50, 0.2),  # out of order on purpose
            _row("bs1/a", 1, 1000, 100, 0.5),
            _row("bs1/a", 3, 1400, 30, 0.0),  # the history shrank: clamp at 0
            _row("bs4/b", 1, 800, 40, 1.0),
        ],
    )
    plans = load_trace(trace)
    assert [p.session_id for p in plans] == ["bs1/a", "bs4/b"]
    a = plans[0]
    assert [t.new_tokens for t in a.turns] == [1000, 400, 0]
    assert [t.output_tokens for t in a.turns] == [100, 50, 30]
    assert [t.tool_seconds for t in a.turns] == [0.5, 0.2, 0.0]


def test_trace_scaling_shared_prompt_and_filters(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "t.jsonl",
        [
            _row("bs1/a", 1, 1000, 100, 2.0),
            _row("bs1/a", 2, 1500, 50, 0.0),
            _row("bs4/b", 1, 800, 40, 1.0),
        ],
    )
    plans = load_trace(
        trace, token_scale=0.1, time_scale=0.5, system_prompt_tokens=600, batches=["bs1"]
    )
    assert [p.session_id for p in plans] == ["bs1/a"]
    a = plans[0]
    assert a.system_tokens == 60
    assert [t.new_tokens for t in a.turns] == [40, 40]  # (1000-600)*0.1, (1500-1100)*0.1
    assert [t.output_tokens for t in a.turns] == [10, 5]
    assert a.turns[0].tool_seconds == pytest.approx(1.0)
    assert load_trace(trace, max_turns=1)[0].turns[-1].tool_seconds == 0.0


def test_a_bad_trace_row_names_the_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps(_row("x", 1, 10, 1, 0)) + "\n" + '{"session_id": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        read_trace(trace)


def test_replay_stream_is_seeded_and_never_repeats_a_session_id(tmp_path: Path) -> None:
    trace = _write_trace(
        tmp_path / "t.jsonl", [_row(f"bs1/{i}", 1, 100 + i, 10, 0.0) for i in range(5)]
    )
    plans = load_trace(trace)
    first = list(islice(replay_stream(plans, seed=4), 12))
    again = list(islice(replay_stream(plans, seed=4), 12))
    assert first == again
    assert len({p.session_id for p in first}) == 12
    assert {p.session_id.split("#")[0] for p in first[:5]} == {p.session_id for p in plans}


def test_the_shared_trace_parses_when_present() -> None:
    path = Path(__file__).resolve().parents[3] / "shared/traces/swe-agent-lite-glm45.jsonl"
    if not path.is_file():
        pytest.skip("shared trace not in this checkout")
    plans = load_trace(path)
    assert len(plans) == 133
    assert sum(len(p.turns) for p in plans) == 5788
