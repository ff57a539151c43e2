"""docs/metrics.md and the Grafana dashboard name exactly the metrics the router serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dynamo_thunderagent.decisions import EventKind
from dynamo_thunderagent.dynamo.metrics import METRICS, PREFIX

REPO = Path(__file__).resolve().parents[2]


def documented_metrics() -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    return set(re.findall(rf"`({PREFIX}_[a-z_]+)`", text))


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    served = {f"{PREFIX}_{name}" for name, _, _, _ in METRICS}
    assert documented_metrics() == served


def test_every_dashboard_query_uses_documented_metrics_only() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "thunderagent.json").read_text())
    documented = documented_metrics()
    exprs = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    assert exprs
    for expr in exprs:
        used = set(re.findall(rf"{PREFIX}_[a-z_]+", expr))
        assert used, f"query names no metric of ours: {expr}"
        # A histogram's series carry _bucket/_sum/_count after the documented name.
        bare = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
        assert bare <= documented, f"undocumented metric in {expr}: {bare - documented}"


# Every structlog call of the router's code (the benchmark harness and the local stack
# log for the person running them, not for operators). A call names its event as its
# first argument; the two that do not are listed with the events they log.
_LOG_ANY = re.compile(r"\blog\.\w+\(")
_LOG_CALL = re.compile(
    r'\blog\.(?:debug|info|warning|error|exception)\(\s*"([a-z0-9_]+(?:\.[a-z0-9_]+)+)"')
_TICK_STEP = re.compile(r'\(\s*"([a-z0-9_]+\.[a-z0-9_]+_failed)",')  # router.tick_once's steps
_NAMED_ELSEWHERE = {
    "program_log.py": 'log.log(level, f"program.{event.kind.value}"',  # EventKind, below
    "router.py": "log.exception(failed, ",  # one of tick_once's steps
}


def logged_events() -> set[str]:
    package = REPO / "dynamo_thunderagent"
    events = {f"program.{kind.value}" for kind in EventKind}
    for path in sorted(package.rglob("*.py")):
        if {"bench", "stack"} & set(path.relative_to(package).parts):
            continue
        text = path.read_text()
        for call in _LOG_ANY.finditer(text):
            named = _LOG_CALL.match(text, call.start())
            if named:
                events.add(named.group(1))
                continue
            line = text[call.start():text.index("\n", call.start())]
            assert line.startswith(_NAMED_ELSEWHERE.get(path.name, "\0")), (
                f"{path.name}: a log call whose event this test cannot read: {line!r}")
        events |= set(_TICK_STEP.findall(text))
    return events


def documented_events() -> set[str]:
    """The events named in the first column of metrics.md's two event tables."""
    text = (REPO / "docs" / "metrics.md").read_text()
    section = text[text.index("## Structured events"):text.index("## The state endpoint")]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    events = {name for row in rows for name in re.findall(r"`([a-z0-9_]+\.[a-z0-9_.]+)`", row)}
    # The fields' table names no events; the first sentence names two program events.
    return events | set(re.findall(r"`(program\.[a-z_]+)`", section))


def test_every_event_the_router_logs_is_documented_and_every_documented_one_exists() -> None:
    # An operator reads a warning's meaning in docs/metrics.md ("Structured events").
    events = logged_events()
    assert {"request.failed", "scheduler.tick_failed", "program.marked_for_pause",
            "program.paused"} <= events
    documented = documented_events()
    assert sorted(events - documented) == []
    assert sorted(documented - events) == []
