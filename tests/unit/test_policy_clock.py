"""The routers' durations on a benchmark's clock (``--policy-clock``).

A regime whose ``time_scale`` is below 1 runs the agents' tools and the engine that much
faster than production; a policy's seconds must run as fast, or every wait, tick and bound in
the file is ``1 / time_scale`` times longer against the agents' turns than it would be in
production."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynamo_thunderagent.bench import live_cli
from dynamo_thunderagent.bench.live import prepare_regime
from dynamo_thunderagent.bench.live_sweep import ArmSpec
from dynamo_thunderagent.catalog import default_catalog, load_policy
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.policy_files import (
    DYNAMO_PARAMETERS,
    EXTENDED_POLICY,
    PARITY_POLICY,
    policy_on_clock,
    seconds_on_clock,
)
from dynamo_thunderagent.stack.arms import PYTHON_PORT_SECONDS, arm_named

from .test_live import _args  # the CLI's own parsing, as a user runs it


def _params(path: Path) -> ThunderAgentParameters:
    resolved = load_policy(path, default_catalog())
    assert resolved.classifier is not None
    params = resolved.classifier.parameters
    assert isinstance(params, ThunderAgentParameters)
    return params


def _broken_policy(tmp_path: Path) -> Path:
    """A policy whose duration is not a number."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("request_classifier:\n  type: thunderagent\n  parameters:\n"
                      "    max_wait_seconds: soon\n")  # fmt: skip
    return broken


def test_every_duration_is_scaled_and_nothing_else() -> None:
    given = {"max_wait_seconds": 60, "min_residency_seconds": 5, "pause_threshold": 0.95,
             "idle_horizon_factor": 3, "resume_timeout_seconds": 120}
    scaled = seconds_on_clock(given, 0.25)
    assert scaled["max_wait_seconds"] == 15 and scaled["min_residency_seconds"] == 1.25
    assert scaled["resume_timeout_seconds"] == 30
    assert scaled["pause_threshold"] == 0.95 and scaled["idle_horizon_factor"] == 3
    # Dynamo's timing parameters left at their defaults are written, scaled.
    defaults = ThunderAgentParameters()
    assert scaled["scheduler_interval_seconds"] == defaults.scheduler_interval_seconds * 0.25
    assert scaled["session_retention_seconds"] == defaults.session_retention_seconds * 0.25
    assert given["max_wait_seconds"] == 60  # pure: the caller's mapping is unchanged


def test_bad_scales_and_durations_are_refused_by_name() -> None:
    for scale in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="time scale must be a positive number"):
            seconds_on_clock({}, scale)
    with pytest.raises(ValueError, match="max_wait_seconds must be a number of seconds"):
        seconds_on_clock({"max_wait_seconds": "a minute"}, 0.25)


def test_a_scaled_file_loads_with_its_durations_scaled(tmp_path: Path) -> None:
    told = policy_on_clock(EXTENDED_POLICY, 0.25, tmp_path)
    assert told != EXTENDED_POLICY and told.parent == tmp_path
    shipped, scaled = _params(EXTENDED_POLICY), _params(told)
    assert scaled.max_wait_seconds == shipped.max_wait_seconds * 0.25  # type: ignore[operator]
    assert scaled.resume_timeout_seconds == shipped.resume_timeout_seconds * 0.25
    assert scaled.scheduler_interval_seconds == shipped.scheduler_interval_seconds * 0.25
    assert scaled.pause_threshold == shipped.pause_threshold
    assert scaled.placement == shipped.placement  # the rest of the file as written
    assert policy_on_clock(EXTENDED_POLICY, 1.0, tmp_path) == EXTENDED_POLICY


def test_the_parity_file_stays_within_dynamos_parameters(tmp_path: Path) -> None:
    # Dynamo's builtin plugin rejects parameters it does not know: the copy adds none.
    told = policy_on_clock(PARITY_POLICY, 0.25, tmp_path)
    original = yaml.safe_load(PARITY_POLICY.read_text())["request_classifier"]["parameters"]
    copy = yaml.safe_load(told.read_text())["request_classifier"]["parameters"]
    assert set(copy) == set(original)
    assert set(original) <= DYNAMO_PARAMETERS  # the parity file is Dynamo's parameters only
    assert {"resume_timeout_seconds", "session_retention_seconds", "scheduler_interval_seconds",
            "acting_decay_tau_seconds"} <= DYNAMO_PARAMETERS
    assert copy["resume_timeout_seconds"] == original["resume_timeout_seconds"] * 0.25


def test_a_file_without_our_classifier_is_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("worker_selection:\n  instances: []\n")
    assert policy_on_clock(other, 0.25, tmp_path / "out") == other
    assert not (tmp_path / "out").exists()


def test_a_bad_duration_in_the_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("request_classifier:\n  type: thunderagent\n"
                   "  parameters:\n    max_wait_seconds: soon\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"bad\.yaml: max_wait_seconds must be a number"):
        policy_on_clock(bad, 0.25, tmp_path / "out")


def test_the_calibrated_regime_runs_every_router_on_its_clock(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--regime", "calibrated", "--out", str(tmp_path)))
    prepared = prepare_regime(config, "calibrated", tmp_path)
    clock = prepared.setup.time_scale
    assert clock == 0.25 and prepared.policy_clock == clock
    ours = prepared.policy_for(ArmSpec("ours", "ours"))
    assert ours is not None
    assert _params(ours).max_wait_seconds == _params(EXTENDED_POLICY).max_wait_seconds * clock  # type: ignore[operator]
    builtin = prepared.policy_for(ArmSpec("builtin", "builtin"))
    assert builtin is not None and builtin != PARITY_POLICY
    assert _params(builtin).scheduler_interval_seconds == 5 * clock
    assert prepared.policy_for(ArmSpec("stock", "stock")) is None  # no policy to scale
    variant = prepared.policy_for(ArmSpec("ours:v", "ours", EXTENDED_POLICY))
    assert variant is not None and variant.parent.name == "ours-v"  # no colon in a path
    assert ArmSpec("ours:a+b", "ours").folder != ArmSpec("ours:a-b", "ours").folder
    port = prepared.router_args_for(ArmSpec("dynamo-python", "dynamo-python"))
    assert port == [f"{flag}={seconds * clock:g}" for flag, seconds in PYTHON_PORT_SECONDS.items()]
    assert "--scheduler-interval-seconds=1.25" in port
    assert "--soft-demote-priority-jump=-0.5" in port  # one word: not read as an option
    assert prepared.router_args_for(ArmSpec("ours", "ours")) == []  # its file says it
    assert arm_named("stock").clock_args(clock) == []


def test_wall_clock_and_an_unscaled_regime_run_the_files_as_written(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--regime", "calibrated", "--policy-clock", "wall",
                                         "--out", str(tmp_path)))
    wall = prepare_regime(config, "calibrated", tmp_path)
    assert wall.policy_clock == 1.0 and wall.policy_for(ArmSpec("ours", "ours")) is None
    assert wall.router_args_for(ArmSpec("dynamo-python", "dynamo-python")) == []
    config = live_cli.config_from_args(_args("--regime", "cheap-recompute", "--out", str(tmp_path)))
    cheap = prepare_regime(config, "cheap-recompute", tmp_path)
    assert cheap.setup.time_scale == 1 and cheap.policy_for(ArmSpec("ours", "ours")) is None


def test_ours_only_durations_left_at_their_defaults_are_scaled_too() -> None:
    defaults = ThunderAgentParameters()
    ours = seconds_on_clock({"idle_horizon_factor": 3}, 0.25)  # a parameter only ours reads
    assert ours["idle_horizon_min_seconds"] == defaults.idle_horizon_min_seconds * 0.25
    parity = seconds_on_clock({"pause_threshold": 0.9}, 0.25)  # a file Dynamo's plugin reads
    assert "idle_horizon_min_seconds" not in parity


def test_a_scale_that_takes_a_duration_past_its_limit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"at time scale 0.001: .*scheduler_interval_seconds"):
        seconds_on_clock({"scheduler_interval_seconds": 5}, 0.001)


def test_a_policy_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing\.yaml"):
        policy_on_clock(tmp_path / "missing.yaml", 0.25, tmp_path / "out")
    broken = tmp_path / "broken.yaml"
    broken.write_text("request_classifier: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml"):
        policy_on_clock(broken, 0.25, tmp_path / "out")


def test_an_unknown_policy_clock_is_refused(tmp_path: Path) -> None:
    import dataclasses

    config = live_cli.config_from_args(_args("--regime", "calibrated", "--out", str(tmp_path)))
    with pytest.raises(ValueError, match="policy clock must be one of regime, wall"):
        prepare_regime(dataclasses.replace(config, policy_clock="regimes"), "calibrated",
                       tmp_path)


def test_a_clock_without_a_work_dir_refuses_to_derive_a_policy(tmp_path: Path) -> None:
    import dataclasses

    config = live_cli.config_from_args(_args("--regime", "calibrated", "--out", str(tmp_path)))
    prepared = dataclasses.replace(prepare_regime(config, "calibrated", tmp_path), work_dir=None)
    with pytest.raises(ValueError, match="policy clock needs a work_dir"):
        prepared.policy_for(ArmSpec("ours", "ours"))


def test_a_tiered_regime_tells_the_tier_and_scales_the_durations(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--regime", "tiered", "--out", str(tmp_path)))
    tiered = prepare_regime(config, "tiered", tmp_path)
    told = tiered.policy_for(ArmSpec("ours", "ours"))
    assert told is not None
    params = _params(told)
    assert params.host_kv_blocks == tiered.host_blocks
    assert params.resume_timeout_seconds == _params(EXTENDED_POLICY).resume_timeout_seconds * 0.25


def test_two_arms_with_files_of_one_name_get_copies_of_their_own(tmp_path: Path) -> None:
    config = live_cli.config_from_args(_args("--regime", "calibrated", "--out", str(tmp_path)))
    prepared = prepare_regime(config, "calibrated", tmp_path)
    paths = []
    for folder, wait in (("a", 10), ("b", 20)):
        (tmp_path / folder).mkdir()
        policy = tmp_path / folder / "p.yaml"
        policy.write_text("request_classifier:\n  type: thunderagent\n  parameters:\n"
                          f"    max_wait_seconds: {wait}\n")  # fmt: skip
        paths.append(prepared.policy_for(ArmSpec(f"ours:{folder}", "ours", policy)))
    assert paths[0] != paths[1]
    assert [_params(p).max_wait_seconds for p in paths if p is not None] == [2.5, 5.0]


def test_bench_live_refuses_a_policy_it_cannot_derive_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    broken = _broken_policy(tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(live_cli, "run_live", lambda *a, **k: ran.append(a) or 0)
    args = _args("--regime", "calibrated", "--arms", f"stock,ours:bad={broken}",
                 "--out", str(tmp_path / "out"))
    assert live_cli.run_live_cli(args) == 2
    assert ran == [] and "broken.yaml: max_wait_seconds must be a number" in capsys.readouterr().err


def test_a_stack_regime_takes_the_wall_clock_when_asked(tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.regime import prepare_stack_regime

    assert prepare_stack_regime("calibrated", tmp_path / "a").prepared.policy_clock == 0.25
    wall = prepare_stack_regime("calibrated", tmp_path / "b", policy_clock="wall")
    assert wall.prepared.policy_clock == 1.0


def test_the_python_ports_durations_are_its_own_defaults() -> None:
    router = pytest.importorskip("dynamo.thunderagent_router.router")
    config = router.ThunderAgentConfig()
    for flag, seconds in PYTHON_PORT_SECONDS.items():
        assert getattr(config, flag.removeprefix("--").replace("-", "_")) == seconds


def test_a_file_for_dynamos_plugin_is_its_to_judge_not_ours(tmp_path: Path) -> None:
    # Our router caps acting_token_weight at 1000; Dynamo's plugin may take more.
    given = {"acting_token_weight": 2000.0, "scheduler_interval_seconds": 5}
    assert seconds_on_clock(given, 0.25, ours=False)["scheduler_interval_seconds"] == 1.25
    with pytest.raises(ValueError, match="acting_token_weight"):
        seconds_on_clock(given, 0.25)
    config = live_cli.config_from_args(_args("--regime", "calibrated", "--out", str(tmp_path)))
    prepared = prepare_regime(config, "calibrated", tmp_path)
    theirs = tmp_path / "theirs.yaml"
    theirs.write_text("request_classifier:\n  type: thunderagent\n  parameters:\n"
                      "    acting_token_weight: 2000.0\n")  # fmt: skip
    assert prepared.policy_for(ArmSpec("builtin", "builtin", theirs)) is not None
    with pytest.raises(ValueError, match=r"theirs\.yaml"):
        prepared.policy_for(ArmSpec("ours", "ours", theirs))


def test_the_demo_refuses_a_policy_it_cannot_derive_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from dynamo_thunderagent.bench import demo
    from dynamo_thunderagent.cli import build_parser

    broken = _broken_policy(tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(demo, "run_stack", lambda *a, **k: ran.append(a))
    args = build_parser().parse_args(["demo", "--policy", str(broken), "--out", str(tmp_path)])
    assert demo.run_demo(args) == 2
    assert ran == [] and "broken.yaml: max_wait_seconds must be a number" in capsys.readouterr().err


def test_bench_clients_refuses_a_bad_policy_before_synthesizing_a_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from dynamo_thunderagent.bench import clients
    from dynamo_thunderagent.cli import build_parser

    broken = tmp_path / "broken.yaml"
    broken.write_text("request_classifier: [unclosed\n")
    made: list[object] = []
    monkeypatch.setattr(clients, "find_aiperf", lambda explicit=None: "aiperf")
    monkeypatch.setattr(clients, "synthesize", lambda *a, **k: made.append(a))
    monkeypatch.setattr(clients, "run_one", lambda *a, **k: made.append(a))
    args = build_parser().parse_args(["bench", "clients", "--workloads", "agentic-code",
                                      "--arms", "stock,ours", "--policy", str(broken),
                                      "--out", str(tmp_path / "out")])
    assert clients.run_clients_cli(args) == 2
    assert made == [] and "broken.yaml" in capsys.readouterr().err
