"""docs/architecture.md's table of every parameter, its default, its allowed values and the
extended policy's value, checked against the parameter models and the shipped file.

The table is rendered from ``parameters.py`` and policies/thunderagent-extended.yaml; when a
parameter, a bound, a default or the extended file changes, rewrite it with
``.venv/bin/python -m tests.unit.test_parameter_reference`` and read the diff.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from dynamo_thunderagent.config import allowed_values, format_number
from dynamo_thunderagent.parameters import ThunderAgentParameters, ThunderAgentSelectorParameters

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
EXTENDED = ROOT / "policies" / "thunderagent-extended.yaml"
BEGIN = "<!-- parameter reference: rendered by tests/unit/test_parameter_reference.py -->"
END = "<!-- end of parameter reference -->"


def _value(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value
    return format_number(value)


def _extended_values() -> tuple[dict[str, Any], dict[str, Any]]:
    policy = yaml.safe_load(EXTENDED.read_text())
    classifier = policy["request_classifier"]["parameters"]
    selector = policy["worker_selection"]["instances"][0]["parameters"]
    return classifier, selector


def _rows(model: type[BaseModel], where: str, extended: dict[str, Any]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        ours = _value(extended[name]) if name in extended else "the default"
        rows.append(f"| `{name}` | {where} | {_value(field.default)} | {allowed_values(field)} "
                    f"| {ours} |")
    return rows


def render() -> str:
    classifier, selector = _extended_values()
    lines = [
        BEGIN,
        "| parameter | of | default (parity) | allowed | policies/thunderagent-extended.yaml |",
        "|---|---|---|---|---|",
        *_rows(ThunderAgentParameters, "classifier", classifier),
        *_rows(ThunderAgentSelectorParameters, "selector", selector),
        END,
    ]
    return "\n".join(lines)


def _doc_block(text: str) -> str:
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END)
    return text[start:end]


def test_the_parameter_table_matches_the_models_and_the_extended_file() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lost its parameter reference markers"
    expected = render()
    assert _doc_block(text) == expected, (
        "docs/architecture.md's parameter reference is stale; rewrite it with "
        "`.venv/bin/python -m tests.unit.test_parameter_reference`. Expected:\n" + expected)


def test_every_extended_key_is_a_parameter() -> None:
    classifier, selector = _extended_values()
    assert set(classifier) <= set(ThunderAgentParameters.model_fields)
    assert set(selector) <= set(ThunderAgentSelectorParameters.model_fields)


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(text.replace(_doc_block(text), render()))
    sys.stdout.write(f"rewrote the parameter reference in {DOC}\n")
