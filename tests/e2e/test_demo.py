"""End-to-end: the ``demo`` subcommand drives real stacks for stock and ours and reports JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import E2E_MARKS

pytestmark = E2E_MARKS

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_both_arms_with_turns_and_no_errors() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dynamo_thunderagent", "demo", "--duration", "15",
         "--agents", "6", "--drain", "8", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout)
    assert list(report["arms"]) == ["stock", "ours"]
    for arm, figures in report["arms"].items():
        assert figures["error"] is None, (arm, figures["error"])
        assert "steps_per_min" in figures and "hit_rate" in figures, arm
        assert figures["turns_ok"] > 0, (arm, completed.stderr[-2000:])
        assert figures["errors"] == 0, (arm, figures["errors_by_type"])
    assert "pauses" in report["arms"]["ours"]["scheduler"]
    assert "stock" not in report["steps_per_min_ratio"]
    assert set(report["steps_per_min_ratio"]) == {"ours/stock"}
