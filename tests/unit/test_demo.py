"""The demo's pure parts: its timeline, its table, and the runs its options choose."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dynamo_thunderagent.bench import demo as demo_module
from dynamo_thunderagent.bench import regimes
from dynamo_thunderagent.bench.demo import config_from_args, workload_note
from dynamo_thunderagent.bench.demo_report import (
    FIGURES,
    agent_run_times,
    paired_agent_runs,
    ratios,
    render_table,
    timeline,
)
from dynamo_thunderagent.bench.live import PreparedRegime
from dynamo_thunderagent.bench.records import RecordKind, TurnRecord
from dynamo_thunderagent.cli import build_parser


def _turn(end: float, prompt: int = 100, cached: int = 50, *, kind: RecordKind = "turn",
          error: str | None = None, cancelled: bool = False) -> TurnRecord:  # fmt: skip
    return TurnRecord(
        kind=kind, agent=0, session_id="s", turn=0, start=end - 1.0, end=end,
        planned_prompt_tokens=prompt, planned_output_tokens=10, prompt_tokens=prompt,
        cached_tokens=cached, completion_tokens=10, error=error, cancelled=cancelled,
    )  # fmt: skip


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["demo", *argv])


# ----- timeline -----------------------------------------------------------------------------


def test_timeline_bins_successful_turns_by_completion_time() -> None:
    records = [
        _turn(1.0, 100, 0), _turn(9.9, 100, 100), _turn(10.0, 200, 200),
        _turn(5.0, error="Timeout: x"), _turn(6.0, cancelled=True), _turn(7.0, kind="final"),
        _turn(30.0),  # after the window: not shown
    ]  # fmt: skip
    buckets = timeline(records, bucket_s=10.0, until_s=25.0)
    assert [(b.start_s, b.end_s, b.steps) for b in buckets] == [
        (0.0, 10.0, 2), (10.0, 20.0, 1), (20.0, 25.0, 0)
    ]  # fmt: skip
    assert buckets[0].steps_per_min == pytest.approx(12.0)
    assert buckets[0].hit_rate == pytest.approx(0.5)
    assert buckets[1].hit_rate == pytest.approx(1.0)
    assert buckets[2].steps_per_min == 0.0 and buckets[2].hit_rate is None


def test_timeline_rate_of_a_short_last_bucket_is_per_its_own_length() -> None:
    buckets = timeline([_turn(21.0), _turn(22.0)], bucket_s=10.0, until_s=25.0)
    assert buckets[-1].steps_per_min == pytest.approx(2 * 60.0 / 5.0)


def test_timeline_rejects_an_empty_bucket_or_window() -> None:
    with pytest.raises(ValueError, match="bucket_s"):
        timeline([], bucket_s=0.0, until_s=10.0)
    with pytest.raises(ValueError, match="bucket_s"):
        timeline([], bucket_s=5.0, until_s=0.0)


# ----- table --------------------------------------------------------------------------------


def _row(arm: str, **values: float | None) -> dict[str, object]:
    row: dict[str, object] = {f.key: None for f in FIGURES}
    row.update(arm=arm, error=None, **values)
    return row


def test_table_prints_every_figure_per_arm_and_a_ratio_line() -> None:
    stock = _row("stock", steps_per_min=300.0, hit_rate=0.3, recomputed_tokens=1000,
                 recomputed_fraction=0.5,
                 latency_p50_s=2.0, latency_p99_s=10.0, latency_max_s=17.5, turns_ok=100,
                 errors=0)  # fmt: skip
    ours = _row("ours", steps_per_min=450.0, hit_rate=0.9, recomputed_tokens=100,
                recomputed_fraction=0.1,
                latency_p50_s=1.0, latency_p99_s=15.0, turns_ok=150, errors=0,
                admission_wait_p50_s=0.0, admission_wait_p99_s=9.0, admission_wait_max_s=12.0,
                pauses=5, resumes=4, moves=1)  # fmt: skip
    text = render_table([stock, ours])
    for figure in FIGURES:
        assert figure.label in text
    # The recomputed share compares (0.20x); the count (0.10x) does not, over unequal turns.
    assert "ours / stock: steps/min 1.50x, hit rate 3.00x, recomputed share 0.20x" in text
    assert "recomputed tokens 0.10x" not in text
    assert "agent-run mean -" in text  # no agent ran whole: no ratio, not a zero
    waiting = next(line for line in text.splitlines() if "longest wait not admitted" in line)
    assert waiting.split()[-2:] == ["-", "none"]  # stock cannot measure it; ours had none
    longest = next(line for line in text.splitlines() if "longest turn" in line)
    assert longest.split()[-2:] == ["17.50", "-"]  # every arm can measure it; ours' is unset


def test_ratios_are_none_where_either_arm_lacks_the_figure() -> None:
    base = _row("stock", steps_per_min=0.0, hit_rate=0.5)
    other = _row("ours", steps_per_min=10.0, hit_rate=0.75)
    got = ratios(other, base)
    assert got["steps_per_min"] is None and got["agent_run_paired_mean_s"] is None
    assert got["hit_rate"] == pytest.approx(1.5)
    assert "pauses" not in got


def test_table_names_a_failed_arm() -> None:
    failed = _row("ours")
    failed["error"] = "StackError: no start"
    assert "ours: run failed: StackError: no start" in render_table([_row("stock"), failed])


# ----- options ------------------------------------------------------------------------------


def test_default_demo_is_calibrated_stock_then_ours_at_three_times_capacity() -> None:
    config = config_from_args(_args())
    assert config.regime == "calibrated"
    assert [a.label for a in config.arms] == ["stock", "ours"]
    setup, sweep = config.live_config().plan(config.regime)
    assert sweep.agents == (24,)
    assert sweep.pressures[0] == pytest.approx(3.0, rel=0.02)
    assert setup.workload == ("trace" if regimes.DEFAULT_TRACE.is_file() else "swe")
    assert config.window_s == 100.0 and config.warmup_s == 20.0


def test_cheap_recompute_is_one_flag_away_and_runs_the_toy_agents() -> None:
    config = config_from_args(_args("--regime", "cheap-recompute"))
    setup, sweep = config.live_config().plan(config.regime)
    assert setup.workload == "toy" and sweep.agents == (30,)
    assert sweep.pressures[0] == pytest.approx(3.0, rel=0.02)


def test_agents_option_sizes_the_capacity_for_that_many_agents() -> None:
    config = config_from_args(_args("--regime", "cheap-recompute", "--agents", "20"))
    _, sweep = config.live_config().plan(config.regime)
    assert sweep.agents == (20,)
    assert sweep.pressures[0] == pytest.approx(3.0, rel=0.02)


def test_short_window_gets_a_proportional_warmup_and_duration_is_an_alias() -> None:
    config = config_from_args(_args("--duration", "20"))
    assert config.window_s == 20.0 and config.warmup_s == 5.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup", "30", "--window", "20"], "--warmup"),
        (["--regime", "cheap-recompute", "--trace", "x.jsonl"], "--trace"),
        (["--trace", "/nonexistent/trace.jsonl"], "not found"),
        (["--arms", "stock,nosuch"], "nosuch"),
        (["--agents", "0"], "--agents"),
        (["--pressure", "0"], "--pressure"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_args(_args(*argv))


def test_missing_trace_falls_back_to_synthetic_swe_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    absent = tmp_path / "absent.jsonl"
    monkeypatch.setattr(regimes, "DEFAULT_TRACE", absent)
    monkeypatch.setattr(demo_module, "DEFAULT_TRACE", absent)
    config = config_from_args(_args())
    setup, sweep = config.live_config().plan(config.regime)
    assert setup.workload == "swe"
    note = workload_note(config, PreparedRegime(setup, sweep, []))
    assert note is not None and str(absent) in note and "synthetic" in note


def test_no_fallback_note_where_the_regime_replays_no_trace() -> None:
    config = config_from_args(_args("--regime", "cheap-recompute"))
    setup, sweep = config.live_config().plan(config.regime)
    assert workload_note(config, PreparedRegime(setup, sweep, [])) is None


# ----- the picture --------------------------------------------------------------------------


def test_timeline_png_is_written_for_both_arms(tmp_path: Path) -> None:
    from dynamo_thunderagent.bench.plots import write_timeline

    buckets = [b.to_dict() for b in timeline([_turn(3.0), _turn(14.0)], bucket_s=10.0,
                                             until_s=20.0)]  # fmt: skip
    path = write_timeline({"stock": buckets, "ours": buckets}, tmp_path / "t.png",
                          title="test", warmup_s=5.0)  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----- agent-run completion -----------------------------------------------------------------


def _agent(session: str, start: float, end: float, joined: bool = False) -> list[TurnRecord]:
    """One agent's last turn answered at ``end``, then its session-final, 5 s later."""
    turn = TurnRecord(kind="turn", agent=0, session_id=session, turn=0, start=start,
                      end=end, planned_prompt_tokens=10, planned_output_tokens=1,
                      joined=joined)
    final = TurnRecord(kind="final", agent=0, session_id=session, turn=1, start=end,
                       end=end + 5.0, planned_prompt_tokens=0, planned_output_tokens=1,
                       joined=joined)
    return [turn, final]  # fmt: skip


def test_agent_run_times_count_finished_agents_from_where_they_joined() -> None:
    # The demo pairs agents across arms, which join at the same turn in every arm: a
    # warm-started agent counts from its first turn in the run (whole_runs leaves it out
    # where runs are not paired, bench live's own mean). An unfinished agent counts nowhere.
    records = [*_agent("a", 0.0, 30.0), *_agent("warm@3", 0.0, 5.0, joined=True)]
    records.append(TurnRecord(kind="turn", agent=1, session_id="unfinished", turn=0, start=1.0,
                              end=2.0, planned_prompt_tokens=10, planned_output_tokens=1))
    # A run ends when its last turn is answered: the session-final's 5 s (a worker may
    # queue it, or the router answer it at once) are not the agent's.
    assert agent_run_times(records) == {"a": 30.0, "warm@3": 5.0}


def test_a_warm_started_plan_marks_its_records_as_joined() -> None:
    from dynamo_thunderagent.bench import workload
    from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan

    plan = AgentPlan("s", 100, tuple(TurnPlan(50, 10, 1.0) for _ in range(4)))
    assert workload.start_at(plan, 2).joined_at == 2
    assert workload.start_at(plan, 0).joined_at == 0


def test_agent_runs_are_compared_over_the_agents_every_arm_finished() -> None:
    stock = {"a": 40.0, "b": 60.0}
    ours = {"a": 30.0, "b": 40.0, "c": 90.0}  # finished one more (a long one) in the window
    paired = paired_agent_runs({"stock": stock, "ours": ours})
    assert paired["stock"]["agent_runs_paired"] == paired["ours"]["agent_runs_paired"] == 2
    assert paired["stock"]["agent_run_paired_mean_s"] == pytest.approx(50.0)
    assert paired["ours"]["agent_run_paired_mean_s"] == pytest.approx(35.0)
    assert paired["ours"]["agent_run_paired_p90_s"] == 40.0


def test_no_common_agent_run_leaves_the_paired_figures_empty() -> None:
    paired = paired_agent_runs({"stock": {"a": 1.0}, "ours": {"b": 2.0}})
    assert paired["ours"] == {"agent_runs_paired": 0, "agent_run_paired_mean_s": None,
                              "agent_run_paired_p90_s": None}  # fmt: skip


def test_the_demo_runs_ours_as_bench_live_does_on_the_regimes_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dynamo_thunderagent.bench.live import prepare_regime
    from dynamo_thunderagent.bench.runner import RunSpec
    from dynamo_thunderagent.catalog import default_catalog, load_policy
    from dynamo_thunderagent.parameters import ThunderAgentParameters

    config = config_from_args(_args("--out", str(tmp_path)))
    prepared = prepare_regime(config.live_config(), config.regime, tmp_path)
    specs: list[RunSpec] = []

    class Seen(Exception):
        pass

    def fake_run_stack(spec: RunSpec, say: object, observer: object) -> object:
        specs.append(spec)
        raise Seen  # the spec is all this test needs: no stack starts

    monkeypatch.setattr(demo_module, "run_stack", fake_run_stack)
    ours = next(a for a in config.arms if a.label == "ours")
    with pytest.raises(Seen):
        demo_module.run_arm(ours, 1, prepared, config, lambda line: None)
    assert specs and specs[0].policy == prepared.policy_for(ours)
    resolved = load_policy(specs[0].policy, default_catalog())  # type: ignore[arg-type]
    params = resolved.classifier.parameters  # type: ignore[union-attr]
    assert isinstance(params, ThunderAgentParameters)
    assert params.scheduler_interval_seconds == 5 * prepared.setup.time_scale
