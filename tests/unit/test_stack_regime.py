"""``stack --regime``: the local stack sized and timed as ``bench live`` runs a regime.

Nothing here starts a process: the sizing, the flags and the banner are pure (the
calibrated regimes write their mocker profile into a temp dir).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dynamo_thunderagent.bench.live import LiveConfig, prepare_regime
from dynamo_thunderagent.bench.regimes import REGIME_NAMES, REGIMES
from dynamo_thunderagent.cli import build_parser as cli_parser
from dynamo_thunderagent.stack.__main__ import (
    build_parser,
    config_from_args,
    regime_from_args,
    run_stack_cli,
)
from dynamo_thunderagent.stack.regime import (
    DEFAULT_BLOCKS,
    DEFAULT_SPEEDUP_RATIO,
    banner,
    prepare_stack_regime,
)

URL = "http://127.0.0.1:18000/v1"


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("name", REGIME_NAMES)
def test_each_regime_gets_the_pool_and_mocker_flags_bench_live_runs_it_with(
    name: str, tmp_path: Path
) -> None:
    bench = prepare_regime(LiveConfig(regimes=(name,)), name, tmp_path / "bench")
    ours = prepare_stack_regime(name, tmp_path / "stack")
    assert ours.num_gpu_blocks == bench.sweep.num_gpu_blocks
    assert ours.speedup_ratio == bench.setup.speedup_ratio
    assert (ours.token_scale, ours.time_scale) == (bench.setup.token_scale,
                                                   bench.setup.time_scale)
    same_dir = [a.replace(str(tmp_path / "bench"), str(tmp_path / "stack"))
                for a in bench.mocker_args]
    assert ours.mocker_args == same_dir


def test_blocks_overrides_the_sizing_and_the_host_tier_follows_it(tmp_path: Path) -> None:
    tiered = prepare_stack_regime("tiered", tmp_path, blocks=500)
    assert tiered.num_gpu_blocks == 500 and tiered.blocks_given
    tier = REGIMES["tiered"].host_tier
    assert tier is not None
    flags = tiered.mocker_args
    assert flags[flags.index("--num-host-blocks") + 1] == str(tier.host_blocks(500))


def test_the_pool_is_split_over_the_workers_as_bench_live_splits_it(tmp_path: Path) -> None:
    four = prepare_stack_regime("cheap-recompute", tmp_path, workers=4)
    _, sweep = LiveConfig(regimes=("cheap-recompute",), workers=4).plan("cheap-recompute")
    assert four.num_gpu_blocks == sweep.num_gpu_blocks
    assert four.capacity_tokens == 4 * sweep.num_gpu_blocks * 16


def test_an_unknown_regime_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as error:
        prepare_stack_regime("expensive", tmp_path)
    assert "'expensive'" in str(error.value)
    assert all(name in str(error.value) for name in REGIME_NAMES)


@pytest.mark.parametrize("top_level", [False, True], ids=["stack-module", "cli"])
def test_the_command_line_refuses_an_unknown_regime_listing_the_choices(
    top_level: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = cli_parser() if top_level else build_parser()
    argv = [*(["stack"] if top_level else []), "--regime", "expensive"]
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--regime" in err and all(name in err for name in REGIME_NAMES)


def test_without_a_regime_the_stack_keeps_the_mocker_default_timing() -> None:
    args = _args("--arm", "ours")
    config = config_from_args(args)
    assert regime_from_args(args, config) is None
    assert config.num_gpu_blocks == DEFAULT_BLOCKS
    assert config.speedup_ratio == DEFAULT_SPEEDUP_RATIO
    assert config.mocker_args == []
    assert config.run_dir is None  # the launcher picks a temp dir, as before


def test_a_regime_sets_pool_clock_and_flags_and_writes_its_profile_in_the_run_dir(
    tmp_path: Path,
) -> None:
    args = _args("--regime", "calibrated", "--run-dir", str(tmp_path / "run"))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None
    assert config.num_gpu_blocks == regime.num_gpu_blocks
    assert config.speedup_ratio == regime.speedup_ratio == REGIMES["calibrated"].live.speedup_ratio
    assert config.mocker_args == regime.mocker_args
    profile = next(a for a in config.mocker_args if a.startswith(str(tmp_path / "run")))
    assert Path(profile).exists()


def test_a_regime_refuses_a_speedup_ratio_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_stack_cli(_args("--regime", "calibrated", "--speedup-ratio", "3",
                               "--run-dir", str(tmp_path)))
    assert code == 2
    err = capsys.readouterr().err
    assert "--speedup-ratio" in err and "calibrated" in err


def test_the_banner_states_sizing_scales_what_to_send_flags_and_url(tmp_path: Path) -> None:
    args = _args("--regime", "calibrated", "--run-dir", str(tmp_path))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None
    text = banner(regime, config, URL, tmp_path / "model")
    blocks = regime.num_gpu_blocks
    assert "regime: calibrated" in text
    assert f"2 workers x {blocks:,} blocks x 16 tokens = {2 * blocks * 16:,} KV tokens" in text
    assert "bench live --regime calibrated" in text
    assert "token 0.1, time 0.25" in text
    assert "mocker tokens" in text and "10 real tokens" in text
    assert f"--num-gpu-blocks-override {blocks} --block-size 16 --speedup-ratio 1 " in text
    assert URL in text and "X-Dynamo-Session-ID" in text


def test_the_banner_names_the_policy_copy_a_reload_must_edit(tmp_path: Path) -> None:
    args = _args("--regime", "calibrated", "--arm", "ours", "--run-dir", str(tmp_path))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None and config.policy is not None
    text = banner(regime, config, URL, tmp_path / "model")
    assert f"the router reads a copy of the policy on this clock, {config.policy}" in text
    assert "edit that copy and send the router SIGHUP" in text
    wall = _args("--regime", "calibrated", "--arm", "ours", "--policy-clock", "wall",
                 "--run-dir", str(tmp_path / "wall"))
    config = config_from_args(wall)
    regime = regime_from_args(wall, config)
    assert regime is not None
    assert "reads a copy" not in banner(regime, config, URL, tmp_path / "model")


def test_the_banner_without_a_regime_says_it_is_none() -> None:
    config = config_from_args(_args())
    text = banner(None, config, URL, Path("/tmp/model"))
    assert "regime: none" in text
    assert "2 workers x 256 blocks x 16 tokens = 8,192 KV tokens" in text
    assert "--speedup-ratio 10" in text and URL in text


def test_in_the_tiered_regime_arm_ours_runs_a_policy_told_of_the_tier(tmp_path: Path) -> None:
    import yaml

    args = _args("--regime", "tiered", "--arm", "ours", "--run-dir", str(tmp_path / "run"))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None and regime.host_blocks > 0 and config.policy is not None
    told = yaml.safe_load(config.policy.read_text())
    assert told["request_classifier"]["parameters"]["host_kv_blocks"] == regime.host_blocks
    assert f"runs {config.policy}" in banner(regime, config, URL, tmp_path)
    stock = _args("--regime", "tiered", "--arm", "stock", "--run-dir", str(tmp_path / "s"))
    stock_config = config_from_args(stock)
    regime_from_args(stock, stock_config)
    assert stock_config.policy is None  # the frontend's router takes no policy


def test_a_regime_stack_runs_the_routers_durations_on_its_clock(tmp_path: Path) -> None:
    args = _args("--regime", "calibrated", "--arm", "ours", "--run-dir", str(tmp_path / "a"))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None and config.policy is not None
    assert config.policy.name == "thunderagent-extended-clock0.25.yaml"
    assert "a 60 s wait in a policy file is 15 s here" in banner(
        regime, config, URL, tmp_path / "model")
    args = _args("--regime", "calibrated", "--arm", "dynamo-python", "--run-dir",
                 str(tmp_path / "b"))
    config = config_from_args(args)
    assert regime_from_args(args, config) is not None
    assert "--scheduler-interval-seconds=1.25" in config.router_args
    args = _args("--regime", "calibrated", "--arm", "ours", "--policy-clock", "wall",
                 "--run-dir", str(tmp_path / "c"))
    config = config_from_args(args)
    regime = regime_from_args(args, config)
    assert regime is not None and config.policy is None and config.router_args == []
    assert "policy file is" not in banner(regime, config, URL, tmp_path / "model")


def test_a_callers_own_router_flags_win_over_the_clocks(tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.launcher import StackConfig
    from dynamo_thunderagent.stack.regime import prepare_stack_regime

    regime = prepare_stack_regime("calibrated", tmp_path)
    config = StackConfig(arm="dynamo-python", router_args=["--scheduler-interval-seconds=9"])
    regime.apply(config)
    assert "--scheduler-interval-seconds=1.25" in config.router_args
    assert config.router_args[-1] == "--scheduler-interval-seconds=9"  # argparse: last wins
