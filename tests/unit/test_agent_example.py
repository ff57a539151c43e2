"""examples/agent_loop.py's own logic: which command a reply asks for, and a bounded tool."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    pytest.importorskip("openai")
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_reply_that_names_an_allowed_command_runs_it(agent: ModuleType) -> None:
    assert agent.choose_command("thinking\nRUN: ls -la src\n", 0) == ["ls", "-la", "src"]


@pytest.mark.parametrize("reply", ["", "random tokens", "RUN: curl http://x", "RUN: ls 'open",
                                   "RUN:"])
def test_anything_else_falls_back_to_the_plan(agent: ModuleType, reply: str) -> None:
    assert agent.choose_command(reply, 1) == agent.PLAN[1]
    assert agent.choose_command(reply, len(agent.PLAN)) == agent.PLAN[0]  # the plan cycles


def test_the_tool_reports_its_exit_status_and_output(agent: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hi")
    assert agent.run_tool(["ls"], str(tmp_path)) == "exit 0\nhello.txt\n"
    assert agent.run_tool(["ls", "missing"], str(tmp_path)).startswith("exit 2\n")


def test_a_tool_that_cannot_start_says_why(agent: ModuleType, tmp_path: Path) -> None:
    assert agent.run_tool(["no-such-program-here"], str(tmp_path)).startswith("failed:")


def test_a_tool_that_runs_too_long_is_cut_off(agent: ModuleType, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def too_long(argv: list[str], **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout", 0))  # type: ignore[arg-type]

    monkeypatch.setattr(agent.subprocess, "run", too_long)
    assert agent.run_tool(["ls"], str(tmp_path)).startswith("failed: Command '['ls']' timed out")


def test_the_example_spells_the_headers_the_router_reads(agent: ModuleType) -> None:
    from dynamo_thunderagent.dynamo import translate

    assert (agent.SESSION_HEADER, agent.FINAL_HEADER) == (
        translate.SESSION_HEADER, translate.FINAL_HEADER)
