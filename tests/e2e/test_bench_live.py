"""End-to-end: ``bench live --quick --json`` drives real stacks and prints one JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import E2E_MARKS

pytestmark = E2E_MARKS

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_bench_live_quick_json(tmp_path: Path) -> None:
    out_dir = tmp_path / "results"
    completed = subprocess.run(
        [sys.executable, "-m", "dynamo_thunderagent", "bench", "live", "--quick", "--json",
         "--window", "10", "--warmup", "3", "--drain", "3", "--max-agents", "6",
         "--out", str(out_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout)  # exactly one JSON object on stdout
    assert report["regime"] == "calibrated"
    assert list(report["arms"]) == ["stock", "ours"]
    assert report["failures"] == [] and report["total_errors"] == 0
    counts = report["regimes"]["calibrated"]["agents"]
    assert len(counts) == 2 and counts[-1] == 6
    for arm, figures in report["arms"].items():
        assert figures["agents"] == 6
        assert figures["steps_per_min"] > 0, (arm, completed.stderr[-2000:])
        assert figures["hit_rate"] is not None
        assert figures["errors"] == 0 and figures["failed_runs"] == 0
        assert set(figures["by_n"]) == {str(n) for n in counts}
    ours = report["arms"]["ours"]
    assert ours["pauses"] is not None and ours["admission_wait_max_s"] is not None
    assert report["arms"]["stock"]["pauses"] is None  # not measurable for stock
    assert len(report["runs"]) == 4
    assert "progress" not in completed.stdout and "== run" in completed.stderr
    for name in ("results.json", "results.md", "steps_per_min_calibrated.png",
                 "hit_rate_calibrated.png", "latency_cdf_calibrated.png"):  # fmt: skip
        assert (out_dir / name).is_file(), name
    saved = json.loads((out_dir / "results.json").read_text())
    assert saved["runs_done"] == 4 and "turn_latencies_s" in saved["runs"][0]
    assert "| stock |" in (out_dir / "results.md").read_text()
