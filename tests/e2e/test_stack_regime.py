"""End-to-end: ``dynamo-thunderagent stack --regime calibrated`` as a user runs it.

The command runs as a subprocess, as from a shell: its banner must state the KV sizing the
benchmark uses before anything starts, its stdout the URL once the model is served, a plain
OpenAI client must get a chat completion, our router must see the regime's pool, and SIGINT
must stop every process it started. aiperf, run as the README shows, must complete every
request of its multi-turn workload on a stack started with the same options.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_MARKS, MODEL, SESSION, group_gone

from dynamo_thunderagent.bench.clients import AiperfWorkload, find_aiperf, run_aiperf
from dynamo_thunderagent.bench.live import LiveConfig

pytestmark = E2E_MARKS

STARTUP_S = 90.0


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen[bytes], what: str,
                   timeout: float = STARTUP_S) -> re.Match[str]:
    """The first match of ``pattern`` in the file ``path`` is being written to."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text(errors="replace") if path.exists() else ""
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match
        if proc.poll() is not None or time.monotonic() > deadline:
            state = f"exit {proc.returncode}" if proc.poll() is not None else "still running"
            pytest.fail(f"no {what} after {timeout:.0f}s ({state}); output:\n{text[-4000:]}")
        time.sleep(0.2)


def _summary(stderr: str) -> dict[str, Any]:
    """The JSON summary the stack prints on stderr once it is up."""
    start = stderr.index("\n{") + 1
    end = stderr.index("\n}", start) + 2
    summary: dict[str, Any] = json.loads(stderr[start:end])
    return summary


def test_stack_in_the_calibrated_regime_states_its_sizing_and_serves_a_chat(
    tmp_path: Path,
) -> None:
    import openai

    _, sweep = LiveConfig(regimes=("calibrated",)).plan("calibrated")
    blocks = sweep.num_gpu_blocks
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    command = [sys.executable, "-m", "dynamo_thunderagent", "stack", "--regime", "calibrated",
               "--arm", "ours", "--run-dir", str(tmp_path / "run")]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=tmp_path,
                                start_new_session=True)  # fmt: skip
    pgids: list[int] = []
    try:
        sizing = _wait_for_line(err, r"^stack: KV: .*$", proc, "KV sizing in the banner", 30)
        assert f"2 workers x {blocks:,} blocks x 16 tokens = {2 * blocks * 16:,} KV tokens" in (
            sizing.group(0))
        banner = err.read_text()
        assert "regime: calibrated" in banner and "token 0.1, time 0.25" in banner
        assert f"--num-gpu-blocks-override {blocks} --block-size 16 --speedup-ratio 1 " in banner
        url = _wait_for_line(out, r"^http://127\.0\.0\.1:\d+/v1$", proc, "URL on stdout").group(0)
        _wait_for_line(err, r"^}$", proc, "JSON summary")
        summary = _summary(err.read_text())
        pgids = list(summary["pids"].values())
        assert summary["regime"]["blocks_per_worker"] == blocks

        client = openai.OpenAI(base_url=url, api_key="unused", timeout=30)
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "list the changed files"}],
            max_tokens=8, extra_headers={SESSION: "regime-1"},
        )  # fmt: skip
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 8

        import urllib.request

        with urllib.request.urlopen(summary["state"], timeout=10) as response:
            state = json.loads(response.read())
        capacities = [r["capacity_tokens"] for r in state["scheduler"]["ranks"].values()]
        assert capacities == [blocks * 16] * 2, state["scheduler"]["ranks"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    left = [pgid for pgid in pgids if not group_gone(pgid)]
    for pgid in left:  # ours, started by the stack above; never leave them to the next test
        os.killpg(pgid, signal.SIGKILL)
    assert proc.returncode == 0, err.read_text()[-4000:]
    assert pgids and not left, f"stack processes outlived SIGINT: {left}"


# The README's aiperf command against `stack --regime calibrated`: 16 conversations whose
# contexts grow to about the regime's mean peak, about bench live's 2x point.
README_WORKLOAD = AiperfWorkload("regime-multi-turn", conversations=16, turns=6,
                                 input_tokens=800, output_tokens=8, turn_delay_ms=500)


def test_aiperf_as_the_readme_runs_it_completes_every_request_in_the_calibrated_regime(
    tmp_path: Path,
) -> None:
    from dynamo_thunderagent.stack.__main__ import build_parser, config_from_args, regime_from_args
    from dynamo_thunderagent.stack.launcher import LocalStack

    try:
        aiperf = find_aiperf()
    except FileNotFoundError as error:
        pytest.fail(f"{error} (make test installs it)")
    args = build_parser().parse_args(["--regime", "calibrated", "--arm", "ours",
                                      "--run-dir", str(tmp_path / "run")])
    config = config_from_args(args)
    assert regime_from_args(args, config) is not None
    with LocalStack(config) as stack:
        result = run_aiperf(stack, README_WORKLOAD, 16, tmp_path / "aiperf", aiperf=aiperf,
                            timeout_s=240)
    assert result["failure"] is None and result["returncode"] == 0, result
    assert result["errors"] == 0, result
    assert result["completed"] == README_WORKLOAD.requests, result
