"""Bad flags and unusable inputs of the commands end in a clear error and exit 2, never a
traceback, a hang or a run that silently measures nothing (found by a probe of every
command with hostile values)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dynamo_thunderagent import cli
from dynamo_thunderagent.bench.trace import read_trace
from dynamo_thunderagent.flags import finite_float

SIM = ["bench", "sim", "--regime", "cheap-recompute", "--agents", "2", "--arms", "stock",
       "--jobs", "1", "--window-s", "20", "--warmup-s", "0"]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; it must exit 2 (returned or through argparse) and say why on stderr."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "error" in err
    return err


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e300", "x", ""])
def test_a_float_flag_is_finite_and_sanely_sized(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        finite_float(text)
    assert finite_float("2.5") == 2.5 and finite_float("-1e9") == -1e9


@pytest.mark.parametrize("argv", [
    ["top", "--state", "127.0.0.1:1", "--interval", "nan"],
    ["doctor", "--endpoint", "a.b.c", "--router-endpoint", "d.e.f", "--model-name", "m",
     "--timeout", "inf"],
    [*SIM, "--window-s", "nan"],
    ["bench", "live", "--dry-run", "--drain", "inf"],
    ["demo", "--window", "nan"],
])  # fmt: skip
def test_nan_and_inf_are_refused_by_name(argv: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert "must be a finite number" in refused(argv, capsys)


def test_a_pool_smaller_than_every_prompt_is_an_error_not_a_recursion(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*SIM, "--blocks", "1"], capsys)
    assert "larger than a worker's KV pool" in err and "--blocks" in err


def test_an_out_folder_that_cannot_be_made_is_refused_before_the_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert "cannot make the folder" in refused([*SIM, "--out", str(taken)], capsys)
    assert "--out is empty" in refused([*SIM, "--out", ""], capsys)


@pytest.mark.parametrize(("argv", "message"), [
    ([*SIM, "--warmup-s", "-5"], "--warmup-s must be >= 0"),
    ([*SIM, "--arms", "ttl-pinning", "--ttl-s", "-1"], "--ttl-s must be > 0"),
    ([*SIM, "--workers", "99999"], "--workers must be at most 1,024"),
    ([*SIM, "--window-s", "1e8"], "--window-s must be at most 604,800"),
    ([*SIM, "--agents", "99999999"], "from 1 to 10,000"),
    (["bench", "live", "--dry-run", "--repeats", "1000"], "--repeats must be in 1..100"),
    (["bench", "live", "--dry-run", "--window", "0"], "--window must be > 0"),
    (["bench", "live", "--dry-run", "--workers", "0"], "--workers must be in 1..64"),
    (["bench", "overhead", "--workers", "0"], "--workers must be in 1..4,096"),
    (["bench", "clients", "--arms", "nope"], "--arms: nope not in"),
    (["bench", "clients", "--repeats", "0"], "--repeats must be >= 1"),
    (["bench", "clients", "--concurrency", "0"], "--concurrency values must be >= 1"),
    (["bench", "clients", "--timeout", "0"], "--timeout must be > 0"),
    (["bench", "reliability", "--phases", "flood,boom"], "--phases: boom"),
    (["bench", "reliability", "--agents", "0"], "--agents must be >= 1, got 0"),
    (["bench", "reliability", "--fault-every", "0"], "--fault-every must be > 0"),
])  # fmt: skip
def test_out_of_range_flags_name_the_flag_and_its_range(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refused(argv, capsys)


def _trace(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("data", "message"), [
    (b"", "no trace rows"),
    (b"\n\n", "no trace rows"),
    (b"\xff\xfe\n", ":1: not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", ":1: bad trace row (nested too deeply"),
])  # fmt: skip
def test_an_unreadable_trace_says_which_file_and_line(
        tmp_path: Path, data: bytes, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path, data)
    with pytest.raises(ValueError, match=r"not UTF-8|no trace rows|nested too deeply") as error:
        read_trace(path)
    assert str(path) in str(error.value) and message in str(error.value)
    # The commands that replay it say so too, a dry run included.
    assert message in refused([*SIM, "--trace", str(path)], capsys)
    assert message in refused(["bench", "live", "--dry-run", "--trace", str(path)], capsys)


def test_overhead_with_nothing_timed_of_a_kind_prints_a_dash(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "overhead", "--programs", "10", "--workers", "2", "--ticks",
                     "2", "--admissions", "10"]) == 0
    out = capsys.readouterr().out
    assert "continuing p99 -" in out
