"""docs/architecture.md's table of every parameter, its default, its allowed values and the
extended policy's value, checked against the parameter models and the shipped file.

The table is rendered from ``parameters.py`` and policies/thunderagent-extended.yaml; when a
parameter, a bound, a default or the extended file changes, rewrite it with
``.venv/bin/python -m tests.unit.test_parameter_reference`` and read the diff.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dynamo_thunderagent.parameters import ThunderAgentParameters, ThunderAgentSelectorParameters

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
EXTENDED = ROOT / "policies" / "thunderagent-extended.yaml"
BEGIN = "<!-- parameter reference: rendered by tests/unit/test_parameter_reference.py -->"
END = "<!-- end of parameter reference -->"


def _number(value: float) -> str:
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e9):
        return f"{int(value):,}"
    return f"{value:g}".replace("e+", "e")


def _value(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`"
    return _number(value)


def _allowed(field: FieldInfo) -> str:
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = type(None) in typing.get_args(annotation)
    base = args[0] if optional else annotation
    if typing.get_origin(base) is typing.Literal:
        return ", ".join(f"`{a}`" for a in typing.get_args(base))
    if base is bool:
        return "`true`, `false`"
    low, high = "(", ")"
    lower: float | None = None
    upper: float | None = None
    for m in field.metadata:
        if getattr(m, "ge", None) is not None:
            low, lower = "[", m.ge
        if getattr(m, "gt", None) is not None:
            low, lower = "(", m.gt
        if getattr(m, "le", None) is not None:
            high, upper = "]", m.le
        if getattr(m, "lt", None) is not None:
            high, upper = ")", m.lt
    kind = "integer" if base is int else "number"
    span = (f"{kind} in {low}{_number(lower) if lower is not None else '-inf'}, "
            f"{_number(upper) if upper is not None else 'inf'}{high}")
    return f"off, or {span}" if optional else span


def _extended_values() -> tuple[dict[str, Any], dict[str, Any]]:
    policy = yaml.safe_load(EXTENDED.read_text())
    classifier = policy["request_classifier"]["parameters"]
    selector = policy["worker_selection"]["instances"][0]["parameters"]
    return classifier, selector


def _rows(model: type[BaseModel], where: str, extended: dict[str, Any]) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        ours = _value(extended[name]) if name in extended else "the default"
        rows.append(f"| `{name}` | {where} | {_value(field.default)} | {_allowed(field)} "
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
