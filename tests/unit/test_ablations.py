"""The ablation policies follow the shipped ones (bench/ablations.py writes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamo_thunderagent.bench import ablations as ablations_module
from dynamo_thunderagent.bench.ablations import ABLATION_DIR, ablations, render
from dynamo_thunderagent.catalog import load_policy
from dynamo_thunderagent.policy_files import EXTENDED_POLICY


def test_the_ablation_files_are_what_the_shipped_policies_make() -> None:
    wanted = ablations()
    on_disk = {path.stem for path in ABLATION_DIR.glob("*.yaml")}
    assert on_disk == set(wanted), "run: python -m dynamo_thunderagent.bench.ablations"
    for stem, policy in wanted.items():
        text = (ABLATION_DIR / f"{stem}.yaml").read_text(encoding="utf-8")
        assert text == render(policy), f"{stem}.yaml is stale: rerun the generator"


def test_every_ablation_is_a_valid_policy() -> None:
    wanted = ablations()
    assert "minus_price_moves" in wanted and "plus_pressure_decay" in wanted
    for stem in wanted:
        load_policy(ABLATION_DIR / f"{stem}.yaml")  # raises PolicyError if invalid


def test_a_dynamo_parameter_the_extended_policy_changes_has_both_files() -> None:
    wanted = ablations()
    parameters = {stem: wanted[stem]["request_classifier"]["parameters"]
                  for stem in ("plus_resume_timeout_seconds", "minus_resume_timeout_seconds")}
    assert parameters["plus_resume_timeout_seconds"]["resume_timeout_seconds"] == 120
    assert parameters["minus_resume_timeout_seconds"]["resume_timeout_seconds"] == 1800
    assert "max_wait_seconds" not in parameters["plus_resume_timeout_seconds"]  # parity's rest
    assert parameters["minus_resume_timeout_seconds"]["max_wait_seconds"] == 60


def test_an_extended_policy_without_a_parity_parameter_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = EXTENDED_POLICY.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if "session_retention_seconds" not in line]
    short = tmp_path / "extended.yaml"
    short.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(ablations_module, "EXTENDED_POLICY", short)
    with pytest.raises(ValueError, match=r"leaves out parity parameters \['session_retention"):
        ablations()


def test_a_selector_parameter_of_the_extended_policy_has_both_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = EXTENDED_POLICY.read_text(encoding="utf-8")
    if "preferred_load_slack" not in text:  # the test holds whether or not it is shipped
        text = text.replace("      type: thunderagent\n", "      type: thunderagent\n"
                            "      parameters: {preferred_load_slack: 1.0}\n")
    extended = tmp_path / "extended.yaml"
    extended.write_text(text, encoding="utf-8")
    monkeypatch.setattr(ablations_module, "EXTENDED_POLICY", extended)
    wanted = ablations()
    plus, minus = wanted["plus_preferred_load_slack"], wanted["minus_preferred_load_slack"]
    [plus_selector] = plus["worker_selection"]["instances"]
    [minus_selector] = minus["worker_selection"]["instances"]
    assert plus_selector["parameters"]["preferred_load_slack"] > 0
    assert "parameters" not in minus_selector
    assert "price_moves" not in plus["request_classifier"]["parameters"]  # parity's classifier
    assert minus["request_classifier"]["parameters"]["price_moves"] is True  # extended's
    for stem in ("plus_preferred_load_slack", "minus_preferred_load_slack"):
        path = tmp_path / f"{stem}.yaml"
        path.write_text(render(wanted[stem]), encoding="utf-8")
        load_policy(path)  # a valid policy
