"""docs/metrics.md and the Grafana dashboard name exactly the metrics the router serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


# A log call whose first argument is the event's name, and the router's tick steps, which
# name the event their failure is logged under.
_LOG_CALL = re.compile(r'\blog\.(?:debug|info|warning|error|exception)\(\s*"([a-z_]+\.[a-z_]+)"')
_TICK_STEP = re.compile(r'\(\s*"([a-z_]+\.[a-z_]+_failed)",')


def logged_events() -> set[str]:
    package = REPO / "dynamo_thunderagent"
    events: set[str] = set()
    for path in [package / "classifier.py", *sorted((package / "dynamo").glob("*.py"))]:
        text = path.read_text()
        events |= set(_LOG_CALL.findall(text)) | set(_TICK_STEP.findall(text))
    return events


def test_every_event_the_router_logs_is_documented() -> None:
    # An operator reads a warning's meaning in docs/metrics.md ("Structured events").
    text = (REPO / "docs" / "metrics.md").read_text()
    events = logged_events()
    assert {"request.failed", "scheduler.tick_failed", "program.marked_for_pause"} <= events
    assert sorted(e for e in events if f"`{e}`" not in text) == []
