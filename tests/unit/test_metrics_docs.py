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
