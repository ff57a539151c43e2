"""The trace format beyond one growing history: compaction, subagents, per-session system
prompts, bad rows, and the generated shapes written as traces and read back."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.bench.shapes import ALL_SYNTHETIC
from dynamo_thunderagent.bench.trace import (
    load_trace,
    read_trace,
    replay_stream,
    trace_rows,
    write_trace,
)
from dynamo_thunderagent.bench.workload import make_agents
from dynamo_thunderagent.cli import main


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(session: str, step: int, inp: int, out: int = 10, tool: float = 1.0,
         **extra: Any) -> dict[str, Any]:
    return {"session_id": session, "step": step, "input_tokens": inp, "output_tokens": out,
            "tool_seconds": tool, **extra}


def test_a_prompt_that_falls_below_half_the_previous_one_starts_a_new_history(
    tmp_path: Path,
) -> None:
    trace = _write(tmp_path / "t.jsonl", [
        _row("a", 1, 3000),
        _row("a", 2, 9000),
        _row("a", 3, 2500),                     # a summary: a compaction
        _row("a", 4, 2600),                     # grows from the summary
        _row("a", 5, 2000),                     # a trim, not half: no growth
        _row("a", 6, 500, compaction=False),    # the row says it is no compaction
        _row("a", 7, 7000, compaction=True),    # the row says it is one, though it grew
    ])  # fmt: skip
    (plan,) = load_trace(trace, system_prompt_tokens=1000)
    assert [t.compaction for t in plan.turns] == [False, False, True, False, False, False, True]
    assert [t.new_tokens for t in plan.turns] == [2000, 5990, 1500, 90, 0, 0, 6000]
    assert plan.prompt_tokens(2) == 2500  # system + the summary: a new prefix
    assert plan.prompt_tokens(3) == 2600
    assert plan.prompt_tokens(6) == 7000


def test_subagents_run_inside_the_parent_turn_that_started_them(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.jsonl", [
        _row("p", 1, 2000),
        _row("kid1", 1, 1500, parent_session_id="p", parent_step=2, system_tokens=1200),
        _row("p", 2, 2500, tool=0.5),
        _row("kid2", 1, 1400, parent_session_id="p", parent_step=2),
        _row("kid2", 2, 1600),
        _row("grandkid", 1, 900, parent_session_id="kid2", parent_step=1),
        _row("p", 3, 3500),
        _row("q", 1, 800),
    ])  # fmt: skip
    plans = load_trace(trace, system_prompt_tokens=1000)
    assert [p.session_id for p in plans] == ["p", "q"]
    p = plans[0]
    assert [t.subagents for t in (p.turns[0], p.turns[2])] == [(), ()]
    kid1, kid2 = p.turns[1].subagents
    assert (kid1.session_id, kid2.session_id) == ("kid1", "kid2")
    assert kid1.system_tokens == 1200 and kid1.turns[0].new_tokens == 300
    assert kid2.system_tokens == 1000 and kid2.turns[0].new_tokens == 400
    assert [s.session_id for s in kid2.turns[0].subagents] == ["grandkid"]
    assert p.turns[1].tool_seconds == 0.5  # after the subagents, as the format says
    assert [x.session_id for x in p.programs()] == ["p", "kid1", "kid2", "grandkid"]


def test_batches_keep_the_subagents_of_the_sessions_they_keep(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.jsonl", [
        _row("bs1/p", 1, 2000), _row("bs1/p", 2, 2500),
        _row("sub", 1, 1500, parent_session_id="bs1/p", parent_step=1),
        _row("bs4/q", 1, 2000),
    ])  # fmt: skip
    (plan,) = load_trace(trace, batches=["bs1"])
    assert [s.session_id for s in plan.turns[0].subagents] == ["sub"]


def test_max_turns_drops_the_subagents_of_the_turns_it_drops(tmp_path: Path) -> None:
    trace = _write(tmp_path / "t.jsonl", [
        _row("p", 1, 2000), _row("p", 2, 2500), _row("p", 3, 3000),
        _row("s1", 1, 1500, parent_session_id="p", parent_step=1),
        _row("s2", 1, 1500, parent_session_id="p", parent_step=2),
    ])  # fmt: skip
    (plan,) = load_trace(trace, max_turns=2)
    assert [[s.session_id for s in t.subagents] for t in plan.turns] == [["s1"], []]
    with pytest.raises(ValueError, match=r"max_turns must be >= 1, got 0"):
        load_trace(trace, max_turns=0)


def test_a_subagent_after_the_parent_s_last_step_is_refused_whatever_max_turns(
    tmp_path: Path,
) -> None:
    trace = _write(tmp_path / "t.jsonl", [
        _row("p", 1, 2000), _row("p", 2, 2500),
        _row("s", 1, 1500, parent_session_id="p", parent_step=2),
    ])  # fmt: skip
    with pytest.raises(ValueError, match=r"starts after its parent's last step"):
        load_trace(trace, max_turns=1)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([_row("a", 1, 100), _row("a", 1, 200)], r"session 'a' has step 1 twice"),
        ([_row("a", 1, 100, parent_session_id="x", parent_step=1)],
         r"names parent 'x', which is not in the trace"),
        ([_row("p", 1, 100), _row("p", 2, 200),
          _row("a", 1, 100, parent_session_id="p", parent_step=7)],
         r"parent 'p' has no step 7 \(its steps: 1\.\.2\)"),
        ([_row("p", 1, 100), _row("p", 3, 200), _row("p", 4, 300),
          _row("a", 1, 100, parent_session_id="p", parent_step=2)],
         r"parent 'p' has no step 2 \(its steps: 1, 3, 4\)"),
        ([_row("p", n, 100 * n) for n in range(1, 20, 2)]
         + [_row("a", 1, 100, parent_session_id="p", parent_step=2)],
         r"\(its steps: 1, 3, 5, 7, 9, 11, 13, 15, \.\.\. \(10 steps\)\)"),
        ([_row("p", 1, 100), _row("p", 2, 200),
          _row("a", 1, 100, parent_session_id="p", parent_step=2)],
         r"starts after its parent's last step \(2\)"),
        ([_row("a", 1, 100, parent_session_id="b", parent_step=1), _row("a", 2, 200),
          _row("b", 1, 100, parent_session_id="a", parent_step=1), _row("b", 2, 200)],
         r"is its own ancestor"),
        ([_row("a", 1, 100, parent_session_id="b")],
         r"needs parent_session_id and parent_step together"),
        ([_row("a", 1, 100, system_tokens=10), _row("a", 2, 200, system_tokens=20)],
         r"gives system_tokens as \[10, 20\]; give one value"),
        ([_row("a", 1, 100, system_tokens=150)],
         r"system_tokens 150, more than its first prompt \(100 tokens\)"),
    ],
)
def test_an_inconsistent_trace_names_the_session_and_what_is_wrong(
    tmp_path: Path, rows: list[dict[str, Any]], message: str,
) -> None:
    trace = _write(tmp_path / "t.jsonl", rows)
    with pytest.raises(ValueError, match=message):
        load_trace(trace)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([1, 2], r"a row must be a JSON object, got list"),
        ({"step": 1, "input_tokens": 1, "output_tokens": 1}, r"missing field 'session_id'"),
        (_row(["a"], 1, 10), r"session_id must be a non-empty string, got \['a'\]"),
        (_row("a", 1, -5), r"input_tokens must be a whole number >= 0, got -5"),
        (_row("a", 1.5, 10), r"step must be a whole number >= 0, got 1\.5"),
        (_row("a", 1, True), r"input_tokens must be a whole number >= 0, got True"),
        (_row("a", 1, 10, tool=-1), r"tool_seconds must be a number of seconds >= 0"),
        (_row("a", 1, 10, tool="slow"), r"tool_seconds must be a number of seconds >= 0"),
        (_row("a", 1, 10, tool=10**400), r"tool_seconds must be a number of seconds >= 0"),
        (_row("a", 1, 10, compaction="yes"), r"compaction must be true or false"),
        (_row("a", 1, 10, parent_session_id=""), r"parent_session_id must be a non-empty"),
        (_row("a", 1, 10, parent_session_id=True), r"parent_session_id must be a non-empty"),
    ],
)
def test_a_bad_row_names_the_line_and_the_field(
    tmp_path: Path, row: Any, message: str,
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps(_row("ok", 1, 10)) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: bad trace row \(" + message):
        read_trace(trace)


def test_a_row_that_is_not_json_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps(_row("ok", 1, 10)) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: bad trace row"):
        read_trace(trace)


@pytest.mark.parametrize("workload", sorted(ALL_SYNTHETIC))
def test_every_generated_shape_written_as_a_trace_reads_back_the_same(
    tmp_path: Path, workload: str,
) -> None:
    plans = make_agents(ALL_SYNTHETIC[workload], 8, seed=3)
    path = tmp_path / f"{workload}.jsonl"
    rows = write_trace(path, trace_rows(plans))
    assert rows == sum(len(p.turns) for plan in plans for p in plan.programs())
    assert load_trace(path) == plans


def test_the_shapes_that_need_them_write_compactions_and_subagents(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, trace_rows(make_agents(ALL_SYNTHETIC["long"], 4, seed=0)
                                 + make_agents(ALL_SYNTHETIC["fanout"], 4, seed=0)))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert any(r.get("compaction") for r in rows)
    assert any("parent_session_id" in r for r in rows)


def test_a_replay_renames_subagents_too_so_no_two_programs_share_a_session(
    tmp_path: Path,
) -> None:
    plans = make_agents(ALL_SYNTHETIC["fanout"], 2, seed=1)
    replayed = list(islice(replay_stream(plans, seed=0), 6))
    ids = [p.session_id for plan in replayed for p in plan.programs()]
    assert len(ids) == len(set(ids))
    assert all("#" in i for i in ids)


def test_bench_trace_writes_a_trace_that_bench_sim_can_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "fanout.jsonl"
    assert main(["bench", "trace", "--workload", "fanout", "--agents", "3",
                 "--out", str(out)]) == 0
    assert "3 fanout agents" in capsys.readouterr().err
    assert load_trace(out) == make_agents(ALL_SYNTHETIC["fanout"], 3, seed=0)


def test_bench_trace_refuses_no_agents_and_an_unwritable_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "trace", "--workload", "long", "--agents", "0",
                 "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--agents must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", "trace", "--workload", "long", "--agents", "1",
                 "--out", str(tmp_path / "no" / "such" / "dir.jsonl")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
