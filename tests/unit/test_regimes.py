"""The two regimes are defined once (``bench.regimes``); live and sim read that definition."""

from __future__ import annotations

import dataclasses
from itertools import islice
from pathlib import Path

import pytest

from dynamo_thunderagent.bench import live_sweep
from dynamo_thunderagent.bench.calibration.timing import DEFAULT_TIMING
from dynamo_thunderagent.bench.regimes import REGIME_NAMES, REGIMES, regime_named
from dynamo_thunderagent.bench.sim.run import regime_scenario
from dynamo_thunderagent.bench.workload import SYNTHETIC_WORKLOADS, agent_stream


@pytest.mark.parametrize("name", REGIME_NAMES)
def test_live_and_sim_read_the_same_regime(name: str) -> None:
    r = REGIMES[name]
    setup = live_sweep.default_setup(name)
    scenario = regime_scenario(name)
    assert setup.regime == scenario.regime == name
    assert setup.client_overhead_s == scenario.client_overhead_s == r.client_overhead_s
    assert (setup.token_scale, setup.time_scale, setup.max_agents) == (
        r.live.token_scale, r.live.time_scale, r.live.max_agents)  # fmt: skip
    assert scenario.timing == r.sim_timing and scenario.workload == r.workload_spec()
    # Both replay the trace when the regime does and the file is there, else the same shape.
    replays = r.default_trace() is not None
    assert (setup.workload == "trace") == replays == (scenario.trace is not None)
    if not replays:
        assert setup.workload == r.workload


def test_calibrated_regime_is_the_trace_fit() -> None:
    r = regime_named("calibrated")
    assert r.calibrated and r.gpu_timing == DEFAULT_TIMING
    assert r.client_overhead_s == DEFAULT_TIMING.request_overhead_s
    assert r.sim_timing.prefill_per_token_s == DEFAULT_TIMING.prefill_us_per_token / 1e6
    cheap = regime_named("cheap-recompute")
    assert not cheap.calibrated and cheap.mocker_args("/nonexistent", 1.0, 1.0) == []
    with pytest.raises(ValueError, match="unknown regime"):
        regime_named("gpu")


def test_live_toy_agents_are_the_simulators_cheap_recompute_agents() -> None:
    # One toy shape: the live harness names its sessions after the workload, nothing else.
    setup = dataclasses.replace(live_sweep.default_setup("cheap-recompute"), workload="toy")
    live = list(islice(live_sweep.base_plans(setup, 3), 8))
    sim = list(islice(agent_stream(SYNTHETIC_WORKLOADS["toy"], 3), 8))
    assert [p.turns for p in live] == [p.turns for p in sim]
    assert [p.session_id.split("-", 1)[1] for p in live] == [
        p.session_id.split("-", 1)[1] for p in sim]  # fmt: skip
    assert all(p.session_id.startswith("toy-") for p in live)


@pytest.mark.parametrize("name", REGIME_NAMES)
def test_live_trace_flag_replays_its_file_in_every_regime(name: str, tmp_path: Path) -> None:
    trace = tmp_path / "mine.jsonl"
    trace.write_text('{"session_id": "a", "step": 1, "input_tokens": 10, '
                     '"output_tokens": 2, "tool_seconds": 1.0}\n')
    setup = live_sweep.live_setup(name, trace=trace)
    assert (setup.workload, setup.trace) == ("trace", trace)
    assert live_sweep.live_setup(name, workload="trace", trace=trace).workload == "trace"
    with pytest.raises(ValueError, match="--trace and --workload toy contradict"):
        live_sweep.live_setup(name, workload="toy", trace=trace)
    with pytest.raises(ValueError, match="not found"):
        live_sweep.live_setup(name, trace=tmp_path / "missing.jsonl")
