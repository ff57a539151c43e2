"""``bench overhead`` runs the shipped policy's scheduler end to end (a small fleet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamo_thunderagent import cli
from dynamo_thunderagent.policy_files import PARITY_POLICY


def run(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    code = cli.main(["bench", "overhead", "--workers", "4", "--dp-ranks", "2", "--programs",
                     "80", "--ticks", "20", "--admissions", "200", "--json", *extra])
    assert code == 0
    result: dict[str, object] = json.loads(capsys.readouterr().out)
    return result


def test_overhead_times_the_extended_policy_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys)
    assert result["policy"] == "thunderagent-extended.yaml"
    assert result["admissions_timed"] and result["ticks_timed"] == 20


def test_overhead_takes_another_policy_and_refuses_a_bad_one(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "--policy", str(PARITY_POLICY))["policy"] == str(PARITY_POLICY)
    bad = tmp_path / "bad.yaml"
    bad.write_text("request_classifier:\n  type: thunderagent\n  parameters:\n"
                   "    pause_threshold: 2\n", encoding="utf-8")
    assert cli.main(["bench", "overhead", "--policy", str(bad)]) == 2
    assert "pause_threshold" in capsys.readouterr().err
