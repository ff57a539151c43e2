"""Unit tests for ``bench live``'s pure parts: arms, sweep, schedule, rows, aggregation, output."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.bench import live, live_cli, live_report, live_sweep, workload
from dynamo_thunderagent.bench.metrics import summarize
from dynamo_thunderagent.bench.records import RunResult, TurnRecord
from dynamo_thunderagent.bench.runner import ArmResult
from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan
from dynamo_thunderagent.cli import build_parser
from dynamo_thunderagent.policy_files import PARITY_POLICY
from dynamo_thunderagent.stack import figures

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "thunderagent.yaml"


# ----- arms ----------------------------------------------------------------------------------


def test_parse_arm_bases_and_ablations(tmp_path: Path) -> None:
    assert live_sweep.parse_arm("stock") == live_sweep.ArmSpec("stock", "stock", None)
    assert live_sweep.parse_arm("ours", ours_policy=POLICY).policy == POLICY
    assert live_sweep.parse_arm("builtin").policy == PARITY_POLICY
    spec = live_sweep.parse_arm(f"ours:parity={POLICY}")
    assert (spec.label, spec.base, spec.policy) == ("ours:parity", "ours", POLICY)
    assert live_sweep.parse_arm(f"builtin:x={POLICY}").base == "builtin"
    for bad in ("vllm", "stock:x=y", "ours:=p.yaml", "ours:lab", "ours:a b=p.yaml"):
        with pytest.raises(ValueError):
            live_sweep.parse_arm(bad)


def test_parse_arms_adds_arm_policies_and_checks_them(tmp_path: Path) -> None:
    arms = live_sweep.parse_arms("stock,ours", [f"parity={POLICY}"])
    assert [a.label for a in arms] == ["stock", "ours", "ours:parity"]
    with pytest.raises(ValueError, match="unique"):
        live_sweep.parse_arms("stock,stock")
    with pytest.raises(ValueError, match="not found"):
        live_sweep.parse_arms("stock", [f"x={tmp_path / 'missing.yaml'}"])
    with pytest.raises(ValueError):
        live_sweep.parse_arms(" , ")


# ----- workload transforms -----------------------------------------------------------------


def _plan(turns: int = 5, sid: str = "a") -> AgentPlan:
    return AgentPlan(
        sid, 10,
        tuple(TurnPlan(new_tokens=100 + k, output_tokens=7, tool_seconds=0.5 if k < turns - 1
                       else 0.0) for k in range(turns)),
    )  # fmt: skip


def test_start_at_keeps_prompt_sizes_of_the_remaining_turns() -> None:
    plan = _plan(6)
    for k in range(6):
        joined = workload.start_at(plan, k)
        assert len(joined.turns) == 6 - k
        for j in range(len(joined.turns)):
            assert joined.prompt_tokens(j) == plan.prompt_tokens(k + j)
        assert joined.peak_context_tokens == plan.peak_context_tokens
    assert workload.start_at(plan, 0) is plan
    assert workload.start_at(plan, 3).session_id == "a@3"
    with pytest.raises(ValueError):
        workload.start_at(plan, 6)


def test_warm_start_only_touches_the_first_agents_and_is_seeded() -> None:
    plans = [_plan(8, f"s{i}") for i in range(10)]
    one = list(workload.warm_start(iter(plans), 4, seed=1))
    two = list(workload.warm_start(iter(plans), 4, seed=1))
    assert one == two
    assert one[4:] == plans[4:]
    assert all(p.session_id.startswith(f"s{i}") for i, p in enumerate(one))


def test_with_overhead_adds_to_every_tool_gap_but_the_last() -> None:
    plan = live_sweep.with_overhead(_plan(3), 0.25)
    assert [t.tool_seconds for t in plan.turns] == [0.75, 0.75, 0.0]
    assert live_sweep.with_overhead(_plan(3), 0.0) == _plan(3)


def test_run_plans_calibrated_trace_is_scaled_like_real_agents() -> None:
    setup = live_sweep.default_setup("calibrated")
    if setup.workload != "trace":
        pytest.skip("shared trace not present")
    plans = [p for _, p in zip(range(40), live.run_plans(setup, 0, 8), strict=False)]
    outputs = sorted(t.output_tokens for p in plans for t in p.turns)
    assert 5 <= outputs[len(outputs) // 2] <= 10  # ~77 trace tokens x 0.1
    shape = live.workload_shape(setup, 0)
    assert 3000 < shape.mean_peak_tokens < 6000  # tens of thousands of real tokens x 0.1


# ----- sweep and schedule --------------------------------------------------------------------


def test_plan_sweep_fixes_capacity_for_the_largest_n() -> None:
    shape = live_sweep.WorkloadShape(mean_peak_tokens=1000.0, max_peak_tokens=2000,
                                     sampled_agents=9)
    sweep = live.plan_sweep(shape, max_agents=24, factors=(0.5, 1, 2, 3), num_workers=2,
                            block_size=16)  # fmt: skip
    assert sweep.agents == (4, 8, 16, 24)
    assert sweep.num_gpu_blocks == 250  # 24 x 1000 / 3 / (2 x 16)
    assert sweep.capacity_tokens == 8000
    assert [round(p, 2) for p in sweep.pressures] == [0.5, 1.0, 2.0, 3.0]
    assert sweep.note is None
    assert sweep.pressure_of(16) == pytest.approx(2.0)


def test_plan_sweep_keeps_the_largest_program_on_one_worker() -> None:
    shape = live_sweep.WorkloadShape(mean_peak_tokens=1000.0, max_peak_tokens=8000,
                                     sampled_agents=9)
    sweep = live.plan_sweep(shape, max_agents=6, factors=(1, 3), num_workers=2, block_size=16)
    assert sweep.num_gpu_blocks == 500
    assert sweep.note is not None and "fits one worker" in sweep.note
    assert sweep.pressures[-1] < 3.0


def test_plan_sweep_explicit_agents_and_blocks() -> None:
    shape = live_sweep.WorkloadShape(mean_peak_tokens=1000.0, max_peak_tokens=900, sampled_agents=9)
    sweep = live.plan_sweep(shape, max_agents=24, agents=[12, 3, 3], num_gpu_blocks=100)
    assert sweep.agents == (3, 12)
    assert sweep.capacity_tokens == 100 * 16 * 2
    with pytest.raises(ValueError):
        live.plan_sweep(shape, max_agents=4, factors=())
    with pytest.raises(ValueError):
        live.plan_sweep(shape, max_agents=4, agents=[0])


def test_interleave_rotates_the_arms_and_covers_every_cell() -> None:
    arms = ["stock", "builtin", "ours"]
    keys = live.interleave(["calibrated"], {"calibrated": [4, 8]}, arms, repeats=3)
    assert len(keys) == 3 * 2 * 3
    assert [k.index for k in keys] == list(range(len(keys)))
    groups = [keys[i : i + 3] for i in range(0, len(keys), 3)]
    assert [g[0].agents for g in groups] == [4, 8, 4, 8, 4, 8]
    assert [k.arm for k in groups[0]] == ["stock", "builtin", "ours"]
    assert [k.arm for k in groups[1]] == ["builtin", "ours", "stock"]
    assert [k.arm for k in groups[2]] == ["ours", "stock", "builtin"]
    for g in groups:
        assert sorted(k.arm for k in g) == sorted(arms)
        assert len({(k.repeat, k.agents) for k in g}) == 1
    # every arm takes every position equally often
    assert Counter((k.arm, k.position) for k in keys) == {
        (a, p): 2 for a in arms for p in range(3)
    }
    two = live.interleave(["calibrated", "cheap-recompute"],
                          {"calibrated": [4], "cheap-recompute": [5, 10]}, arms, 1)
    assert [k.regime for k in two] == ["calibrated"] * 3 + ["cheap-recompute"] * 6
    with pytest.raises(ValueError):
        live.interleave(["calibrated"], {"calibrated": [4]}, arms, 0)


# ----- observers' parsing ------------------------------------------------------------------


def test_time_weighted_step_function() -> None:
    samples = [(1.0, 2.0), (3.0, 4.0), (6.0, 0.0)]
    mean, peak = live_report.time_weighted(samples, 0.0, 8.0)
    assert mean == pytest.approx((0 * 1 + 2 * 2 + 4 * 3 + 0 * 2) / 8)
    assert peak == 4.0
    assert live_report.time_weighted(samples, 4.0, 5.0) == (4.0, 4.0)
    assert live_report.time_weighted([], 0.0, 2.0) == (0.0, 0.0)
    assert live_report.time_weighted(samples, 2.0, 2.0) == (None, None)


def test_parse_python_router_log() -> None:
    text = "\n".join([
        "\x1b[2m2026-11-30T09:43:08.600039Z\x1b[0m \x1b[32m INFO\x1b[0m router: "
        "thunderagent.program paused program=a reason=admission_full tokens=1680 paused=1",
        "2026-11-30T09:43:09.000000Z  INFO router: thunderagent.program paused program=b "
        "reason=pressure tokens=10 paused=2",
        "2026-11-30T09:43:12.807561Z  INFO router: scheduler.tick worker=5 dp_rank=0 paused=2 "
        "marked=7",
        "2026-11-30T09:43:17.808460Z  INFO router: thunderagent.program resumed program=a "
        "worker=3 dp_rank=0 tokens=5 paused=1",
    ])  # fmt: skip
    parsed = figures.parse_python_router_log(text)
    assert (parsed["pauses"], parsed["resumes"]) == (2, 1)
    assert [v for _, v in parsed["samples"]] == [1.0, 2.0, 1.0]
    assert parsed["samples"][2][0] - parsed["samples"][0][0] == pytest.approx(9.208421)


def test_parse_builtin_log() -> None:
    text = "\n".join([
        "\x1b[2m2026-11-30T09:45:48.667371Z\x1b[0m \x1b[34mDEBUG\x1b[0m thunderagent: ThunderAgent "
        "scheduler state changed programs=24 active_programs=16 paused_programs=8 "
        "marked_for_pause=16",
        "2026-11-30T09:45:53.669203Z DEBUG thunderagent: ThunderAgent scheduler state changed "
        "programs=24 active_programs=14 paused_programs=10",
        "2026-11-30T09:45:54.0Z  WARN thunderagent: ThunderAgent deferral timeout forced program "
        "resumes forced_resumes=3",
    ])  # fmt: skip
    parsed = figures.parse_builtin_log(text)
    assert parsed["seen"] and parsed["forced_resumes"] == 3
    assert [v for _, v in parsed["samples"]] == [8.0, 10.0]
    assert figures.parse_builtin_log("nothing here")["seen"] is False


def test_our_routers_figures_carry_the_release_counter_and_the_cache_loss() -> None:
    state = {"scheduler": {"counters": {"pauses": 4, "released_evicting": 3,
                                        "aging_pauses": 2, "aging_marks": 1,
                                        "aging_marks_cleared": 1},
                           "cache_loss": {"0/0": {"cache_loss_ratio": 0.7, "turns": 12}}},
             "router": {}}
    got = figures.scheduler_figures(state)
    assert got["pauses"] == 4 and got["released_evicting"] == 3
    assert (got["aging_pauses"], got["aging_marks"], got["aging_marks_cleared"]) == (2, 1, 1)
    assert got["cache_loss"] == {"0/0": {"cache_loss_ratio": 0.7, "turns": 12}}
    assert got["counters"]["aging_marks_cleared"] == 1  # every counter, as the router has it
    assert figures.scheduler_figures({})["released_evicting"] == 0  # an older router
    assert figures.scheduler_figures({})["aging_pauses"] == 0


# ----- rows, aggregation, report -----------------------------------------------------------


def _rec(sid: str, turn: int, start: float, end: float, prompt: int = 100, cached: int = 80,
         **kw: Any) -> TurnRecord:  # fmt: skip
    return TurnRecord("turn", 0, sid, turn, start, end, prompt, 8, prompt_tokens=prompt,
                      cached_tokens=cached, completion_tokens=8, **kw)  # fmt: skip


def test_steady_figures_window_and_censoring() -> None:
    records = [
        _rec("a", 0, 0.0, 1.0, cached=0),  # warm-up: excluded
        _rec("a", 1, 2.0, 3.0, cached=90),
        _rec("b", 0, 2.5, 5.0, cached=50),
        _rec("c", 0, 4.0, 12.0, cancelled=True),  # cut off: latency lower bound, no hit rate
        _rec("d", 0, 3.0, 4.0, error="APIError: x", error_type="APIError"),  # failed
        _rec("e", 0, 9.0, 11.0, cached=100),  # ends after the window: latency only
    ]
    steady = live_report.steady_figures(records, 2.0, 10.0)
    assert steady["hit_rate"] == pytest.approx(140 / 200)
    assert steady["latencies"] == [1.0, 2.0, 2.5, 8.0]
    assert steady["latency_censored"] == 1
    assert steady["latency_p99_s"] == 8.0
    assert steady["latency_max_s"] == 8.0  # the cut-off turn, with its time so far


def test_a_turn_the_client_gave_up_on_is_in_the_tail_not_dropped() -> None:
    records = [_rec(f"s{i}", 0, 1.0, 2.0) for i in range(9)]
    records.append(_rec("held", 0, 1.0, 301.0, error="APITimeoutError: Request timed out.",
                        error_type="APITimeoutError"))  # held back past the client's timeout
    records.append(_rec("refused", 0, 1.0, 1.01, error="BadRequestError: too long",
                        error_type="BadRequestError"))  # refused at once: says nothing
    steady = live_report.steady_figures(records, 0.0, 400.0)
    assert len(steady["latencies"]) == 10
    assert steady["latency_max_s"] == 300.0 and steady["latency_p99_s"] == 300.0
    assert steady["latency_censored"] == 1


def _result(arm: str, rate_turns: int, *, error: str | None = None,
            scheduler: dict[str, Any] | None = None) -> ArmResult:  # fmt: skip
    if error is not None:
        return ArmResult(arm, error=error, elapsed_s=1.0)
    records = [_rec(f"s{i}", 0, 1.0 + i * 0.1, 2.0 + i * 0.1) for i in range(rate_turns)]
    run = RunResult(records, agents=2, window_s=10.0, drain_s=1.0, elapsed_s=11.0,
                    agents_started=2, agents_completed=0)  # fmt: skip
    metrics = summarize(records, warmup_s=1.0, window_s=10.0, block_size=16,
                        reuse_completion=False)  # fmt: skip
    return ArmResult(arm, metrics=metrics, scheduler=scheduler or {}, elapsed_s=12.0,
                     agents_started=2, run=run)  # fmt: skip


def _row(arm: str, agents: int, repeat: int, turns: int, **kw: Any) -> dict[str, Any]:
    key = live.RunKey("calibrated", repeat, agents, arm, 0, 0)
    return live.make_row(key, _result(arm, turns, **kw), pressure=agents / 4, warmup_s=1.0,
                         window_s=10.0)  # fmt: skip


def test_make_row_has_every_figure() -> None:
    sched = {"pauses": 3, "resumes": 2, "moves": 1, "admission_wait_max_s": 4.0,
             "paused_mean": 1.5, "rejected": 0, "state_error": None}  # fmt: skip
    row = _row("ours", 8, 0, 6, scheduler=sched)
    for name in live_report.ROW_METRICS:
        assert name in row
    assert row["steps_per_min"] == pytest.approx(6 / (9 / 60))
    assert row["hit_rate"] == pytest.approx(0.8)
    assert row["pauses"] == 3 and row["admission_wait_max_s"] == 4.0
    assert row["scheduler"]["rejected"] == 0
    assert row["error"] is None and len(row["turn_latencies_s"]) == 6
    assert row["latency_max_s"] == pytest.approx(1.0)  # every arm's, stock's too
    failed = _row("ours", 8, 0, 0, error="StackError: boom")
    assert failed["error"] == "StackError: boom" and failed["steps_per_min"] is None


def test_aggregate_cell_mean_min_max_and_failures() -> None:
    rows = [_row("stock", 8, r, t) for r, t in enumerate((6, 9, 12))]
    rows[1]["errors"] = 2
    rows[2]["admission_wait_max_s"] = 7.0
    rows[0]["latency_max_s"] = 9.0
    rows.append(_row("stock", 8, 3, 0, error="StackError: boom"))
    cell = live_report.aggregate_cell(rows)
    assert (cell["runs"], cell["failed_runs"]) == (4, 1)
    assert cell["run_errors"] == ["StackError: boom"]
    spread = cell["spread"]["steps_per_min"]
    assert spread["values"] == pytest.approx([40.0, 60.0, 80.0])
    assert (spread["min"], spread["max"]) == pytest.approx((40.0, 80.0))
    assert cell["steps_per_min"] == pytest.approx(60.0)
    assert cell["errors"] == 2  # summed
    assert cell["admission_wait_max_s"] == 7.0  # max of the runs that have it
    assert cell["latency_max_s"] == 9.0  # the longest turn of any run, not their mean
    assert cell["pauses"] is None  # no run measured it
    with pytest.raises(ValueError):
        live_report.aggregate_cell([])


def _rows() -> list[dict[str, Any]]:
    rows = []
    for r in range(2):
        for n, base in ((4, 6), (8, 8)):
            rows.append(_row("stock", n, r, base))
            rows.append(_row("ours", n, r, base + 4))
    return rows


def test_aggregate_ratios_to_stock() -> None:
    cells = live_report.aggregate(_rows())
    assert list(cells) == ["calibrated"]
    assert list(cells["calibrated"]) == ["stock", "ours"]
    assert cells["calibrated"]["ours"][8]["steps_per_min_vs_stock"] == pytest.approx(12 / 8)
    assert cells["calibrated"]["stock"][4]["steps_per_min_vs_stock"] == pytest.approx(1.0)


def test_a_ratio_to_stock_covers_only_the_repeats_both_arms_ran() -> None:
    # Ours lost repeat 1 at N=4; stock's repeat 1 was slow. Before, ours' one repeat was
    # divided by stock's mean over both, flattering ours by stock's spread.
    rows = [_row("stock", 4, 0, 8), _row("ours", 4, 0, 12),
            _row("stock", 4, 1, 4), _row("ours", 4, 1, 0, error="StackError: boom")]
    cell = live_report.aggregate(rows)["calibrated"]["ours"][4]
    assert cell["steps_per_min_vs_stock"] == pytest.approx(12 / 8)
    lost = [_row("stock", 4, 0, 8, error="StackError: boom"), _row("ours", 4, 1, 12)]
    assert live_report.aggregate(lost)["calibrated"]["ours"][4]["steps_per_min_vs_stock"] is None


def _report(include_samples: bool = True,
            rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    config = {
        "workers": 2, "block_size": 16, "window_s": 10.0, "warmup_s": 1.0, "repeats": 2,
        "regimes": {"calibrated": {
            "setup": {"workload": "trace", "token_scale": 0.1, "time_scale": 0.25},
            "sweep": {"agents": [4, 8], "pressures": [1.0, 2.0], "num_gpu_blocks": 100,
                      "capacity_tokens": 3200, "mean_peak_tokens": 800.0},
        }},
    }  # fmt: skip
    rows = _rows() if rows is None else rows
    rows.append(_row("dynamo-python", 8, 0, 0, error="StackError: no model"))
    return live.build_report(
        rows, config=config, arm_order=["stock", "ours", "dynamo-python"],
        regime_order=["calibrated"], agents={"calibrated": [4, 8]},
        meta={"started_at": "x"}, include_samples=include_samples,
    )  # fmt: skip


def test_report_shape_per_arm_at_the_largest_n() -> None:
    report = json.loads(json.dumps(_report()))  # JSON-serialisable
    assert report["schema"] == live_report.SCHEMA and report["regime"] == "calibrated"
    assert set(report["arms"]) == {"stock", "ours", "dynamo-python"}
    for arm in ("stock", "ours"):
        entry = report["arms"][arm]
        assert entry["agents"] == 8
        assert isinstance(entry["steps_per_min"], float)
        assert isinstance(entry["hit_rate"], float)
        assert set(entry["by_n"]) == {"4", "8"}
        assert entry["by_n"]["4"]["agents"] == 4
    assert report["arms"]["ours"]["steps_per_min"] == pytest.approx(12 / (9 / 60))
    assert report["arms"]["dynamo-python"]["steps_per_min"] is None
    assert report["arms"]["dynamo-python"]["failed_runs"] == 1
    assert report["regimes"]["calibrated"]["largest_agents"] == 8
    assert report["failures"] == [{"regime": "calibrated", "repeat": 0, "agents": 8,
                                   "arm": "dynamo-python", "error": "StackError: no model"}]
    assert len(report["runs"]) == 9 and "turn_latencies_s" in report["runs"][0]
    assert "turn_latencies_s" not in _report(include_samples=False)["runs"][0]


def test_render_markdown_tables() -> None:
    text = live.render_markdown(_report())
    assert "### Regime `calibrated`" in text
    assert "| arm | N=4 (1.0x) | N=8 (2.0x) |" in text
    assert "| stock | 53 (53-53) | 53 (53-53) |" not in text  # stock: 6 turns -> 40/min
    assert "| stock | 40 (40-40) | 53 (53-53) |" in text
    assert "| ours | 1.67x | 1.50x |" in text
    assert "| dynamo-python | not run | failed (1/1 runs) |" in text
    assert "At N=8 (2.0x capacity):" in text
    assert "- failed: dynamo-python at N=8 (repeat 1): StackError: no model" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("| ours | 80")]
    assert lines and lines[0].count("|") == 13  # 12 columns: the header has as many
    assert "| turn p50 / p99 / max (s) |" in text
    assert "| 1.00 / 1.00 / 1.00 |" in lines[0]  # every turn took 1 s: p50, p99 and the longest


def test_errors_by_type_are_summed_per_cell_and_named_under_the_table() -> None:
    # Stock's errors on agentic-code were session-finals past the driver's 10 s; the table's
    # errors column alone read as lost turns.
    rows = [_row("stock", 8, r, 6) for r in range(2)]
    rows[0]["errors"], rows[0]["errors_by_type"] = 3, {"APITimeoutError (session-final)": 3}
    rows[1]["errors"], rows[1]["errors_by_type"] = 2, {"APITimeoutError (session-final)": 1,
                                                       "APITimeoutError": 1}  # fmt: skip
    lost = _row("stock", 8, 2, 6, error="StackError: boom")  # a lost run counts in neither
    lost["errors"], lost["errors_by_type"] = 1, {"APIConnectionError": 1}
    cell = live_report.aggregate_cell([*rows, lost])
    assert cell["errors"] == 5
    assert cell["errors_by_type"] == {"APITimeoutError (session-final)": 4, "APITimeoutError": 1}
    # From the runs' rows to results.md, through the report's aggregation.
    others = [r for r in _rows() if not (r["arm"] == "stock" and r["agents"] == 8)]
    text = live.render_markdown(_report(rows=others + rows))
    assert ("- errors, stock (summed over repeats): 1 APITimeoutError, "
            "4 APITimeoutError (session-final)") in text  # fmt: skip
    assert "- errors, ours" not in text  # no line for an arm without errors
    assert "- errors," not in live.render_markdown(_report())


def test_render_markdown_arm_not_run_at_the_largest_n_keeps_the_columns() -> None:
    report = _report()
    del report["regimes"]["calibrated"]["arms"]["ours"]["by_n"]["8"]
    text = live.render_markdown(report)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ours | not run")]
    assert rows and rows[0].count("|") == 13  # as many cells as the header's 12 columns


def test_write_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from dynamo_thunderagent.bench.plots import write_plots

    written = write_plots(_report(), tmp_path)
    assert [p.name for p in written] == [
        "steps_per_min_calibrated.png", "hit_rate_calibrated.png", "latency_cdf_calibrated.png"
    ]  # fmt: skip
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----- command line --------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "live", *argv])


def test_quick_defaults_and_overrides(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--quick", "--out", str(tmp_path)))
    assert config.quick and config.repeats == 1 and config.factors == live_cli.QUICK_FACTORS
    assert [a.label for a in config.arms] == ["stock", "ours"]
    assert config.regimes == ("calibrated",) and config.window_s == 30.0
    config = live_cli.config_from_args(_args("--quick", "--window", "10", "--warmup", "3",
                                         "--repeats", "2", "--regime", "all"))  # fmt: skip
    assert (config.window_s, config.warmup_s, config.repeats) == (10.0, 3.0, 2)
    assert config.regimes == live_cli.REGIME_NAMES
    full = live_cli.config_from_args(_args("--arm-policy", f"parity={POLICY}"))
    assert [a.label for a in full.arms] == [*live_cli.DEFAULT_ARMS, "ours:parity"]
    assert full.repeats == 3 and full.factors == live.DEFAULT_FACTORS


@pytest.mark.parametrize("argv", [
    ("--repeats", "0"), ("--window", "5", "--warmup", "5"), ("--factors", "1,-2"),
    ("--arms", "nope"), ("--agents", "0,4"), ("--max-agents", "0"),
    ("--workload", "trace", "--trace", "/nonexistent.jsonl"),
])  # fmt: skip
def test_bad_options_are_refused(argv: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        live_cli.config_from_args(_args(*argv))


@pytest.mark.parametrize(("argv", "message"), [
    (("--agents", "2.5"), "--agents: expected comma-separated integers, got '2.5'"),
    (("--factors", "1,nan"), "--factors: expected numbers above 0, at most 100, got '1,nan'"),
    (("--factors", "inf"), "--factors: expected numbers above 0, at most 100, got 'inf'"),
    (("--factors", ","), "got ',' (an empty item)"),
    (("--agents", "1,,2"), "got '1,,2' (an empty item)"),
    (("--agents", "2,2"), "from 1 to 10,000, each once, got '2,2'"),
    (("--agents", "99999999999"), "from 1 to 10,000, got '99999999999'"),
])  # fmt: skip
def test_agent_counts_and_factors_are_whole_and_finite_or_refused(
        argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        live_cli.config_from_args(_args(*argv))


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert live_cli.run_live_cli(_args("--repeats", "0")) == 2
    assert "error:" in capsys.readouterr().err


def test_dry_run_prints_the_schedule() -> None:
    config = live_cli.config_from_args(
        _args("--regime", "all", "--workload", "toy", "--repeats", "2"))
    out = io.StringIO()
    assert live_cli.dry_run(config, out) == 0
    plan = json.loads(out.getvalue())
    assert set(plan["regimes"]) == {"calibrated", "cheap-recompute", "tiered"}
    calibrated = plan["regimes"]["calibrated"]["sweep"]
    assert len(calibrated["agents"]) == 4 and calibrated["agents"][-1] == 24
    total = sum(len(r["sweep"]["agents"]) for r in plan["regimes"].values()) * 2 * 4
    assert len(plan["schedule"]) == total


# ----- a rollout: one batch run to its end (--rollout) ---------------------------------------


def test_a_rollouts_batch_is_the_streams_first_plans_from_their_first_turn() -> None:
    setup = live_sweep.default_setup("cheap-recompute")
    batch = list(live_sweep.batch_plans(setup, 0, 5))
    closed = list(zip(range(5), live.run_plans(setup, 0, 5), strict=False))
    assert len(batch) == 5
    # The same agents the closed loop starts with, but none warm-started (whole runs).
    assert [p.session_id for p in batch] == [p.session_id.split("@")[0] for _, p in closed]
    assert all("@" not in p.session_id for p in batch)
    assert list(live_sweep.batch_plans(setup, 0, 5)) == batch  # seeded: every arm the same


def test_rollout_options(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--rollout", "--out", str(tmp_path)))
    assert config.rollout and config.describe()["rollout"] is True
    assert (config.window_s, config.warmup_s) == (live_cli.ROLLOUT_CAP_S, 0.0)
    config = live_cli.config_from_args(_args("--rollout", "--window", "300", "--warmup", "0"))
    assert config.window_s == 300.0
    with pytest.raises(ValueError, match="--warmup does not apply to --rollout"):
        live_cli.config_from_args(_args("--rollout", "--warmup", "5"))
    assert not live_cli.config_from_args(_args()).rollout


def _batch_result(arm: str, *, finished: int) -> ArmResult:
    """A batch of 2 agents of 2 turns each; ``finished`` of them sent their session-final."""
    records = []
    for i in range(2):
        sid = f"s{i}"
        records += [_rec(sid, 0, 0.0, 2.0 + i), _rec(sid, 1, 4.0 + i, 6.0 + 2 * i)]
        if i < finished:
            records.append(TurnRecord("final", 0, sid, 2, 6.5 + 2 * i, 7.0 + 2 * i, 0, 1))
    run = RunResult(records, agents=2, window_s=600.0, drain_s=1.0, elapsed_s=9.0,
                    agents_started=2, agents_completed=finished)  # fmt: skip
    metrics = summarize(records, warmup_s=0.0, window_s=600.0, block_size=16,
                        reuse_completion=False, batch=2)  # fmt: skip
    return ArmResult(arm, metrics=metrics, elapsed_s=10.0, agents_started=2, run=run)


def test_a_rollouts_row_covers_its_batch_and_the_report_says_which_runs_have_no_makespan(
        ) -> None:
    rows = []
    for repeat, finished in enumerate((2, 2, 1)):
        key = live.RunKey("calibrated", repeat, 2, "ours", 0, 0)
        rows.append(live.make_row(key, _batch_result("ours", finished=finished),
                                  pressure=3.0, warmup_s=0.0, window_s=600.0))
    # The batch ends with its last turn (8 s), not its last session-final (9 s): a final is
    # answered in the router by some arms and queued on a worker by others.
    assert rows[0]["makespan_s"] == 8.0
    assert rows[0]["steps_per_min"] == pytest.approx(4 / (8.0 / 60))
    assert rows[0]["latency_p50_s"] is not None and rows[0]["hit_rate"] is not None
    assert rows[2]["makespan_s"] is None  # one agent never finished: no makespan
    config = {"workers": 2, "block_size": 16, "window_s": 600.0, "warmup_s": 0.0,
              "repeats": 3, "rollout": True,
              "regimes": {"calibrated": {
                  "setup": {"workload": "trace", "token_scale": 0.1, "time_scale": 0.25},
                  "sweep": {"agents": [2], "pressures": [3.0], "num_gpu_blocks": 100,
                            "capacity_tokens": 3200, "mean_peak_tokens": 800.0}}}}
    report = live.build_report(rows, config=config, arm_order=["ours"],
                               regime_order=["calibrated"], agents={"calibrated": [2]},
                               meta={}, include_samples=False)  # fmt: skip
    text = live.render_markdown(report)
    assert "rollout: one batch of N agents per run, run to its end (capped at 600.0 s)" in text
    assert "| ours | 8 (8-8) [1/3 without: cut or a run lost] |" in text
    # Its run figures cover the runs that finished: 5 of the 6, 1.7 a repeat of 2.
    assert "(1.7 of 2 runs)" in text


def test_the_paused_count_is_weighed_up_to_the_runs_end_when_it_ended_before_its_window(
        ) -> None:
    from dynamo_thunderagent.bench.live_observer import Observer
    from dynamo_thunderagent.stack.arms import arm_named

    class _Stack:  # no /state to read: only the polled paused count
        processes: list[Any] = []
        state_url = None

    observer = Observer(arm_named("ours"), (0.0, 600.0))
    observer.t0 = 100.0
    observer.samples = [(100.0, 2.0), (105.0, 4.0)]  # 2 paused for 5 s, then 4
    run = RunResult([], agents=2, window_s=600.0, drain_s=1.0, elapsed_s=10.0,
                    agents_started=2, agents_completed=2)  # a batch over after 10 s
    figures_ = observer.finish(_Stack(), run)  # type: ignore[arg-type]
    assert figures_["paused_mean"] == pytest.approx(3.0)  # not 4 for the 590 s after its end
