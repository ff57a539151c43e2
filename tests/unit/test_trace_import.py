"""Public agent traces turned into trace rows: kv-cache-tester's Claude Code conversations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.bench.trace import load_trace
from dynamo_thunderagent.bench.trace_import import import_rows, kv_cache_tester_rows
from dynamo_thunderagent.cli import main


def _call(t: float, inp: int, out: int, think: float, hashes: list[int] | None = None,
          api: float = 2.0) -> dict[str, Any]:
    call: dict[str, Any] = {"t": t, "type": "n", "in": inp, "out": out, "api_time": api,
                            "think_time": think}
    if hashes is not None:
        call["hash_ids"] = hashes
    return call


def _conversation(requests: list[dict[str, Any]], cid: str = "c1") -> dict[str, Any]:
    return {"id": cid, "system_tokens": 3000, "tool_tokens": 9000, "requests": requests}


def test_waits_compactions_and_the_shared_prefix_come_from_the_conversation() -> None:
    doc = _conversation([
        _call(0, 20000, 100, 0, [1, 2, 3, 4]),
        _call(10, 21000, 50, 8, [1, 2, 3, 4, 5]),       # extends, after 8 s of tool
        _call(5000, 22000, 70, 4000, [1, 2, 3, 4, 5, 6]),  # a person away: capped
        _call(5010, 13000, 40, 5, [1, 9, 10]),          # keeps 1 of 6 blocks: a compaction
        _call(5020, 14000, 40, 5, [7, 8, 9, 10]),       # grew, but keeps no block: a restart
    ])  # fmt: skip
    rows, notes = kv_cache_tester_rows(doc, max_gap_seconds=60)
    assert [r["tool_seconds"] for r in rows] == [8, 60, 5, 5, 0.0]
    assert [r.get("compaction") for r in rows] == [None, False, False, True, True]
    assert rows[0]["system_tokens"] == 12000
    assert [r["llm_seconds"] for r in rows] == [2.0] * 5
    assert (notes.sessions, notes.rows, notes.capped_gaps) == (1, 5, 1)
    assert (notes.restarts, notes.shrank) == (2, 1)


def test_a_wait_without_think_time_is_the_clock_s_gap_less_the_call() -> None:
    second = _call(30, 21000, 50, 0)
    second["think_time"] = None  # null: as if absent
    rows, _ = kv_cache_tester_rows(_conversation([_call(0, 20000, 100, 0, api=4.0), second]))
    assert rows[0]["tool_seconds"] == 26.0


def test_subagents_follow_the_call_before_them_and_the_parent_waits_beyond_them(
    tmp_path: Path,
) -> None:
    sub = {"type": "subagent", "agent_id": "agent_001", "t": 140, "duration_ms": 120000,
           "system_tokens": 700, "tool_tokens": 8000,
           "requests": [_call(0, 9500, 300, 0), _call(30, 12000, 400, 20)]}
    doc = _conversation([_call(0, 20000, 100, 0), sub, _call(150, 22000, 80, 145),
                         _call(160, 23000, 60, 5)])
    rows, notes = kv_cache_tester_rows(doc)
    parent = [r for r in rows if r["session_id"] == "c1"]
    kid = [r for r in rows if r["session_id"] == "c1/agent_001"]
    assert parent[0]["tool_seconds"] == 25  # 145 s of waiting, 120 s of it the subagent's
    assert (kid[0]["parent_session_id"], kid[0]["parent_step"]) == ("c1", 1)
    assert kid[0]["system_tokens"] == 8700
    assert (notes.sessions, notes.subagents) == (1, 1)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (plan,) = load_trace(path)
    assert [s.session_id for s in plan.turns[0].subagents] == ["c1/agent_001"]


def test_the_context_limit_cuts_a_conversation_and_leaves_out_what_cannot_start() -> None:
    late = {"type": "subagent", "agent_id": "late", "requests": [_call(0, 9000, 10, 0)]}
    doc = _conversation([_call(0, 20000, 100, 0), _call(5, 90000, 10, 3), late,
                         _call(9, 250000, 10, 3)])
    rows, notes = kv_cache_tester_rows(doc, max_context_tokens=200000)
    assert [r["step"] for r in rows] == [1, 2]
    assert (notes.cut_sessions, notes.orphans) == (1, 1)
    rows, notes = kv_cache_tester_rows(_conversation([_call(0, 300000, 1, 0)]))
    assert (rows, notes.too_long) == ([], 1)
    rows, notes = kv_cache_tester_rows(_conversation([]))
    assert (rows, notes.empty, notes.too_long) == ([], 1, 0)


def test_the_parent_waits_only_for_the_subagents_that_run() -> None:
    long_gone = {"type": "subagent", "agent_id": "big", "duration_ms": 100000,
                 "requests": [_call(0, 900000, 10, 0)]}  # above the context limit
    empty = {"type": "subagent", "agent_id": "none", "duration_ms": 90000, "requests": []}
    short = {"type": "subagent", "agent_id": "small", "duration_ms": 20000,
             "requests": [_call(0, 9000, 10, 0)]}
    doc = _conversation([_call(0, 20000, 100, 0), long_gone, empty, short,
                         _call(120, 22000, 80, 110), _call(130, 23000, 60, 5)])
    rows, notes = kv_cache_tester_rows(doc, max_gap_seconds=600)
    assert rows[0]["tool_seconds"] == 90  # 110 s less the 20 s of the one that runs
    assert [r["session_id"] for r in rows if "parent_session_id" in r] == ["c1/small"]
    assert (notes.subagents, notes.too_long, notes.empty) == (1, 1, 1)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1], r"a conversation must be a JSON object, got list"),
        ({"requests": []}, r"the conversation: missing field 'id'"),
        ({"id": "x", "requests": {}}, r"x: requests must be a list"),
        ({"id": "", "requests": []}, r"the conversation's id must be a non-empty string, got ''"),
        ({"id": "x", "requests": [3]}, r"x: every request must be an object"),
        (_conversation([{"t": 0, "out": 5}]), r"c1: missing field 'in'"),
        (_conversation([{"t": 0, "in": None, "out": 5}]), r"c1: missing field 'in'"),
        (_conversation([_call(0, -3, 5, 0)]), r"c1: in must be a whole number of tokens >= 0, "
                                              r"got -3"),
        (_conversation([_call(0, 2.5, 5, 0)]), r"c1: in must be a whole number of tokens >= 0, "
                                               r"got 2\.5"),
        ({"id": ["x"], "requests": []}, r"the conversation's id must be a non-empty string"),
    ],
)
def test_a_bad_conversation_names_its_file_and_field(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=r"^f\.json: " + message):
        import_rows([("f.json", doc)])


def test_the_same_conversation_twice_is_refused() -> None:
    doc = _conversation([_call(0, 20000, 100, 0)])
    with pytest.raises(ValueError, match=r"b\.json: conversation id 'c1' is also a\.json's"):
        import_rows([("a.json", doc), ("b.json", doc)])


def test_a_session_id_made_twice_is_refused() -> None:
    twin = {"type": "subagent", "agent_id": "agent_001", "requests": [_call(0, 9000, 10, 0)]}
    doc = _conversation([_call(0, 20000, 100, 0), twin, twin, _call(5, 21000, 10, 3)])
    with pytest.raises(ValueError, match=r"a\.json: session id 'c1/agent_001' repeats one of "
                       r"a\.json"):
        import_rows([("a.json", doc)])


def test_a_conversation_left_out_still_claims_its_id() -> None:
    gone = _conversation([_call(0, 900000, 10, 0)])
    with pytest.raises(ValueError, match=r"b\.json: conversation id 'c1' is also a\.json's"):
        import_rows([("a.json", gone), ("b.json", _conversation([_call(0, 2000, 10, 0)]))])


def test_bench_trace_imports_a_directory_and_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    source = tmp_path / "traces"
    source.mkdir()
    (source / "trace_0001.json").write_text(json.dumps(_conversation(
        [_call(0, 20000, 100, 0), _call(5, 21000, 10, 3)], "a")))
    (source / "trace_0002.json").write_text(json.dumps(_conversation(
        [_call(0, 900000, 100, 0)], "b")))
    out = tmp_path / "out.jsonl"
    assert main(["bench", "trace", "--from-kv-cache-tester", str(source),
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 conversations" in err and "left out: 1 sessions starting above it" in err
    assert [p.session_id for p in load_trace(out)] == ["a"]


def test_bench_trace_refuses_what_it_cannot_read_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["bench", "trace", "--from-kv-cache-tester", str(bad), "--out", str(out)]) == 2
    assert "bad.json: not a readable JSON file" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["bench", "trace", "--from-kv-cache-tester", str(empty), "--out",
                 str(out)]) == 2
    assert "no *.json files in this directory" in capsys.readouterr().err
    assert main(["bench", "trace", "--from-kv-cache-tester", str(tmp_path / "nope"),
                 "--out", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["bench", "trace", "--from-kv-cache-tester", str(empty), "--out", str(out),
                 "--max-context-tokens", "0"]) == 2
    assert "--max-context-tokens must be >= 1, got 0" in capsys.readouterr().err
    assert main(["bench", "trace", "--from-kv-cache-tester", str(empty), "--out", str(out),
                 "--max-gap-seconds", "-1"]) == 2
    assert "--max-gap-seconds must be >= 0, got -1" in capsys.readouterr().err
    assert main(["bench", "trace", "--from-kv-cache-tester", str(empty), "--out", str(out),
                 "--agents", "5"]) == 2
    assert "--agents applies to --workload only" in capsys.readouterr().err
    assert main(["bench", "trace", "--from-kv-cache-tester", str(empty), "--out", str(out),
                 "--seed", "3"]) == 2
    assert "--seed applies to --workload only" in capsys.readouterr().err
    assert main(["bench", "trace", "--workload", "toy", "--out", str(out),
                 "--max-gap-seconds", "5"]) == 2
    assert "--max-gap-seconds applies to --from-kv-cache-tester only" in (
        capsys.readouterr().err)
    assert main(["bench", "trace", "--workload", "long", "--out", str(out),
                 "--max-context-tokens", "5"]) == 2
    assert "--max-context-tokens applies to --from-kv-cache-tester only" in (
        capsys.readouterr().err)
    assert not out.exists()
