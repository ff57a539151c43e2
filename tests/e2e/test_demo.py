"""End-to-end: ``demo`` drives real stacks for stock and ours and reports every figure.

It checks that the demo runs and reports what a reader needs (every figure, the ratio line,
the JSON and the PNG), never which arm is ahead: that is measured, not asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import E2E_MARKS

from dynamo_thunderagent.bench.demo_report import FIGURES

pytestmark = E2E_MARKS

REPO_ROOT = Path(__file__).resolve().parents[2]
# Figures every arm measures, and those only a scheduling arm (ours) does.
EVERY_ARM = ("steps_per_min", "hit_rate", "recomputed_tokens", "latency_p50_s",
             "latency_p99_s", "latency_max_s", "turns_ok", "errors")  # fmt: skip
OURS_ONLY = ("admission_wait_p50_s", "admission_wait_p99_s", "admission_wait_max_s",
             "paused_mean", "pauses", "resumes", "moves")  # fmt: skip


def test_demo_runs_stock_then_ours_and_reports_every_figure_and_the_picture(
    tmp_path: Path,
) -> None:
    window = 20.0
    completed = subprocess.run(
        [sys.executable, "-m", "dynamo_thunderagent", "demo", "--window", str(window),
         "--warmup", "5", "--drain", "5", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    for figure in FIGURES:
        assert figure.label in completed.stdout, figure.label
    assert "ours / stock: steps/min " in completed.stdout
    assert f"plot: {tmp_path / 'demo_calibrated.png'}" in completed.stdout

    png = tmp_path / "demo_calibrated.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "results.json").read_text())
    assert list(report["arms"]) == ["stock", "ours"]
    for arm, figures in report["arms"].items():
        assert figures["error"] is None, (arm, figures["error"])
        assert figures["turns_ok"] > 0, (arm, output[-2000:])
        assert figures["errors"] == 0, (arm, figures["errors_by_type"])
        missing = [k for k in EVERY_ARM if figures.get(k) is None]
        assert not missing, (arm, missing)
        # Agent-run completion may be None (no agent ran whole in a short window): a key.
        assert {"agent_runs", "agent_run_mean_s", "agent_run_p90_s", "agent_runs_paired",
                "agent_run_paired_mean_s", "agent_run_paired_p90_s"} <= set(figures), arm
    ours = report["arms"]["ours"]
    assert not [k for k in OURS_ONLY if ours.get(k) is None], ours["scheduler"]
    assert set(report["ratios"]) == {"ours/stock"}
    assert report["ratios"]["ours/stock"]["steps_per_min"] is not None
    for arm in ("stock", "ours"):
        buckets = report["timeline"][arm]
        assert buckets and buckets[-1]["end_s"] == window, arm
        assert sum(b["steps"] for b in buckets) > 0, arm
