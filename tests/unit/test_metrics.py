"""Run metrics: steps/min over the steady window, hit rate, recomputed tokens, latency."""

from __future__ import annotations

import pytest

from dynamo_thunderagent.bench.metrics import (
    batch_makespan,
    recomputed_tokens,
    steps_per_min,
    summarize,
)
from dynamo_thunderagent.bench.records import TurnRecord
from dynamo_thunderagent.quantile import percentile


def turn(
    session: str,
    k: int,
    end: float,
    prompt: int | None = 100,
    cached: int | None = 0,
    completion: int | None = 10,
    *,
    start: float | None = None,
    error: str | None = None,
    cancelled: bool = False,
    kind: str = "turn",
    joined: bool = False,
) -> TurnRecord:
    return TurnRecord(
        kind=kind,  # type: ignore[arg-type]
        agent=0,
        session_id=session,
        turn=k,
        start=end - 1.0 if start is None else start,
        end=end,
        planned_prompt_tokens=prompt or 0,
        planned_output_tokens=completion or 0,
        prompt_tokens=None if error else prompt,
        cached_tokens=None if error else cached,
        completion_tokens=None if error else completion,
        error=error,
        error_type=error.split(":")[0] if error else None,
        cancelled=cancelled,
        joined=joined,
    )


def test_steps_per_min_counts_only_turns_completed_in_the_steady_window() -> None:
    records = [
        turn("a", 0, end=5.0),  # warm-up: dropped
        turn("a", 1, end=10.0),  # window start is inclusive
        turn("a", 2, end=20.0),
        turn("b", 0, end=39.9),
        turn("b", 1, end=40.0),  # window end is exclusive (drain)
        turn("b", 2, end=30.0, error="APITimeoutError: timed out"),
        turn("c", 0, end=25.0, cancelled=True),
        turn("c", 1, end=26.0, kind="final"),
    ]
    rate, count, length = steps_per_min(records, warmup_s=10, window_s=40)
    assert (count, length) == (3, 30)
    assert rate == pytest.approx(6.0)


def test_tail_shortens_the_steady_window() -> None:
    records = [turn("a", 0, end=15.0), turn("a", 1, end=35.0)]
    rate, count, length = steps_per_min(records, warmup_s=10, window_s=40, tail_s=10)
    assert (count, length, rate) == (1, 20, 3.0)


def test_an_empty_steady_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty steady window"):
        steps_per_min([], warmup_s=30, window_s=40, tail_s=10)


def test_recomputed_tokens_are_the_previous_prompt_that_was_not_found_cached() -> None:
    records = [
        turn("a", 0, 1, prompt=100, cached=0, completion=10),
        turn("a", 1, 2, prompt=150, cached=100, completion=10),  # full reuse
        turn("a", 2, 3, prompt=200, cached=40, completion=10),  # evicted during the tool
    ]
    assert recomputed_tokens(records, reuse_completion=False) == (110, 250)
    # Counting the reply too: turn 1 could reuse 110, turn 2 could reuse 160.
    assert recomputed_tokens(records, reuse_completion=True) == (130, 270)


def test_recomputed_tokens_round_reuse_down_to_whole_blocks() -> None:
    records = [turn("a", 0, 1, prompt=100), turn("a", 1, 2, prompt=150, cached=96)]
    assert recomputed_tokens(records, block_size=16, reuse_completion=False) == (0, 96)


def test_recomputed_tokens_skip_failed_turns_and_never_cross_programs() -> None:
    records = [
        turn("a", 0, 1, prompt=100),
        turn("a", 1, 2, error="APIStatusError: 503"),
        turn("a", 2, 3, prompt=300, cached=0),  # compared with turn 0
        turn("b", 0, 1, prompt=1000, cached=0),  # first turn of another program
    ]
    assert recomputed_tokens(records, reuse_completion=False) == (100, 100)


def test_more_cache_than_expected_is_not_negative_recompute() -> None:
    records = [turn("a", 0, 1, prompt=100), turn("a", 1, 2, prompt=150, cached=150)]
    assert recomputed_tokens(records) == (0, 110)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) is None


def test_summarize_reports_every_figure_of_a_run() -> None:
    records = [
        turn("a", 0, end=12.0, start=11.0, prompt=100, cached=0),
        turn("a", 1, end=14.0, start=12.0, prompt=150, cached=96),
        turn("b", 0, end=16.0, start=13.0, prompt=200, cached=64),
        turn("b", 1, end=18.0, error="APITimeoutError: Request timed out."),
        turn("b", 1, end=19.0, cancelled=True),
        turn("a", 2, end=20.0, kind="final", prompt=None, cached=None, completion=None),
    ]
    m = summarize(records, warmup_s=10, window_s=30, block_size=16, reuse_completion=False)
    assert m.steady_turns == 3 and m.turns_ok == 3
    assert m.steps_per_min == pytest.approx(9.0)
    assert m.prompt_tokens == 450 and m.cached_tokens == 160
    assert m.hit_rate == pytest.approx(160 / 450)
    assert (m.recomputed_tokens, m.reusable_tokens) == (0, 96)
    assert m.recomputed_fraction == 0.0
    assert m.latency_p50_s == pytest.approx(2.0) and m.latency_p99_s == pytest.approx(3.0)
    assert m.errors == 1 and m.errors_by_type == {"APITimeoutError": 1}
    assert m.cancelled == 1 and m.agents_completed == 1
    assert m.to_dict()["recomputed_fraction"] == 0.0


def test_a_failed_session_final_is_named_apart_from_a_failed_turn() -> None:
    records = [
        turn("a", 0, end=12.0, error="APITimeoutError: Request timed out."),
        turn("a", 1, end=13.0, kind="final", prompt=None, cached=None, completion=None,
             error="APITimeoutError: Request timed out."),
        turn("b", 1, end=14.0, kind="release", prompt=None, cached=None, completion=None,
             error="APIConnectionError: Connection error."),
    ]  # fmt: skip
    m = summarize(records, warmup_s=10, window_s=30)
    assert m.errors == 3
    assert m.errors_by_type == {"APITimeoutError": 1, "APITimeoutError (session-final)": 1,
                                "APIConnectionError (release)": 1}  # fmt: skip


def test_summarize_without_usage_has_no_hit_rate() -> None:
    m = summarize([], warmup_s=0, window_s=10)
    assert m.hit_rate is None and m.latency_p50_s is None and m.steps_per_min == 0


def test_agent_run_time_counts_whole_runs_only() -> None:
    # A run ends when its last turn is answered, not its session-final (which some arms
    # answer in the router and others queue on a worker).
    records = [
        turn("a", 0, end=2.0, start=1.0), turn("a", 1, end=5.0),
        turn("a", 2, end=6.0, kind="final"),          # a whole run: 1.0 -> 5.0
        # Warm-started (joined mid-program; its plan is renumbered from turn 0): left out.
        turn("b@3", 0, end=4.0, start=0.5, joined=True), turn("b@3", 1, end=9.0, joined=True),
        turn("b@3", 2, end=9.5, kind="final", joined=True),
        turn("c", 0, end=3.0, start=2.0),             # still running: no final
        turn("d", 0, end=4.0, start=2.0), turn("d", 1, end=10.0, kind="final"),  # 2.0 -> 4.0
    ]
    m = summarize(records, warmup_s=0.0, window_s=20.0)
    assert (m.agent_runs, m.agent_run_mean_s, m.agent_run_p90_s) == (2, 3.0, 4.0)
    assert m.agents_completed == 3


def _batch(*, c_finishes: bool) -> list[TurnRecord]:
    records = [
        turn("a", 0, end=2.0, start=0.0), turn("a", 1, end=5.0),
        turn("a", 2, end=6.0, kind="final"),
        turn("b", 0, end=3.0, start=0.0), turn("b", 1, end=11.0),
        turn("b", 2, end=12.0, kind="final"),
        turn("c", 0, end=4.0, start=0.0),
    ]
    if c_finishes:
        records.append(turn("c", 1, end=9.0, kind="final"))
    return records


def test_a_rollouts_window_is_its_batch_once_every_run_ended() -> None:
    done = summarize(_batch(c_finishes=True), warmup_s=0.0, window_s=600.0, batch=3)
    # The batch ends with its last turn answered (11 s), not its last session-final (12 s).
    assert done.makespan_s == batch_makespan(_batch(c_finishes=True), 3) == 11.0
    assert done.steady_window_s == 11.0 and done.steady_turns == 5
    assert done.steps_per_min == pytest.approx(5 / (11.0 / 60))
    assert (done.agent_runs, done.agent_run_p90_s) == (3, 11.0)
    # A run that failed: no makespan, and the batch ended with its last turn.
    failed = [*_batch(c_finishes=False), turn("c", 1, end=10.0, error="APITimeoutError: t")]
    ended = summarize(failed, warmup_s=0.0, window_s=600.0, batch=3)
    assert ended.makespan_s is None and ended.steady_window_s == 11.0
    assert ended.steps_per_min == pytest.approx(5 / (11.0 / 60))  # the failed turn not
    # A batch the cap cut: no makespan, and the figures up to the cap.
    cut = summarize(_batch(c_finishes=False), warmup_s=0.0, window_s=10.0, batch=3)
    assert cut.makespan_s is None and cut.steady_window_s == 10.0
    # Outside a rollout nothing changes, and a batch whose runs did not start at their first
    # turn (a warm start) has no makespan either.
    assert summarize(_batch(c_finishes=True), warmup_s=0.0, window_s=600.0).makespan_s is None
    assert batch_makespan(_batch(c_finishes=True), 4) is None
    warm = [turn("a", 3, end=2.0, start=0.0), turn("a", 4, end=3.0, kind="final")]
    assert batch_makespan(warm, 1) is None
