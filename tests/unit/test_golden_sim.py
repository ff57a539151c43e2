"""The simulator reproduces its recorded outputs exactly (see ``tests/golden/sim_cases.py``)."""

from __future__ import annotations

import json

import pytest

from tests.golden.sim_cases import CASES, needs_trace, path_of, record, trace_available


@pytest.mark.parametrize("name", sorted(CASES))
def test_bench_sim_reproduces_its_recorded_output(name: str) -> None:
    if needs_trace(name) and not trace_available():
        pytest.skip("the shared SWE-agent trace is not beside this checkout")
    expected = json.loads(path_of(name).read_text(encoding="utf-8"))
    actual = record(CASES[name])
    assert actual["argv"] == expected["argv"]
    assert actual["scenario"] == expected["scenario"]
    for got, want in zip(actual["results"], expected["results"], strict=True):
        assert got == want, f"{name}: N={want['agents']} arm={want['arm']} changed"
    assert actual == expected
