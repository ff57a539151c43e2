"""The arm registry and what each arm owns: launch arguments, readiness, figures (no processes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.policy_files import EXTENDED_POLICY, PARITY_POLICY
from dynamo_thunderagent.stack.arms import (
    ARM_NAMES,
    ARMS,
    BASELINE_ARM,
    BUILTIN_POLICY_YAML,
    HEADLINE_ARMS,
    Arm,
    LaunchContext,
    arm_named,
)
from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig


def _stack(tmp_path: Path, arm: str, **overrides: Any) -> LocalStack:
    return LocalStack(StackConfig(arm=arm, run_dir=tmp_path / "run", http_port=8000, **overrides))


class _Seen:
    """An ObservedRun with canned logs and state."""

    def __init__(self, logs: dict[str, str], state: dict[str, Any] | None = None) -> None:
        self.logs, self._state = logs, state

    def log(self, role: str) -> str:
        return self.logs.get(role, "")

    def state(self) -> dict[str, Any] | None:
        return self._state

    def state_samples(self) -> Sequence[tuple[float, float]]:
        return [(0.0, 2.0)]

    def paused(self, samples: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
        return (float(len(samples)), 9.0)


def test_the_registry_lists_every_arm_once_in_comparison_order() -> None:
    assert ARM_NAMES == ("stock", "builtin", "dynamo-python", "ours")
    assert BASELINE_ARM == "stock" and HEADLINE_ARMS == ("stock", "ours")
    assert all(ARMS[name].name == name for name in ARM_NAMES)
    with pytest.raises(ValueError, match="unknown arm 'nope'; choose from stock, builtin"):
        arm_named("nope")


def test_only_the_thunderagent_arms_take_a_policy_and_only_ours_serves_state() -> None:
    assert [n for n in ARM_NAMES if ARMS[n].takes_policy] == ["builtin", "ours"]
    assert [n for n in ARM_NAMES if ARMS[n].serves_state] == ["ours"]
    assert arm_named("ours").default_policy == EXTENDED_POLICY
    assert arm_named("builtin").default_policy == PARITY_POLICY
    given = {"--policy": Path("a.yaml"), "--builtin-policy": Path("b.yaml")}
    assert [ARMS[n].chosen_policy(given) for n in ARM_NAMES] == [
        None, Path("b.yaml"), None, Path("a.yaml")]  # fmt: skip


def test_stock_routes_in_the_frontend_with_soft_session_affinity(tmp_path: Path) -> None:
    stack = _stack(tmp_path, "stock")
    argv = stack._frontend_argv()
    assert argv[argv.index("--router-mode") + 1] == "kv"
    assert argv[argv.index("--router-session-affinity-mode") + 1] == "soft"
    assert stack.arm.router(stack.launch) is None and stack.router_endpoint is None
    assert stack.namespace == stack.worker_namespace == "dynamo"
    assert stack.state_url is None and stack.arm.readiness(stack.launch) == []


def test_builtin_writes_its_default_policy_and_waits_for_its_admission_line(
    tmp_path: Path,
) -> None:
    stack = _stack(tmp_path, "builtin")
    stack.run_dir.mkdir(parents=True)
    stack.arm.prepare(stack.launch)
    assert stack.policy_path == stack.run_dir / "thunderagent-policy.yaml"
    assert stack.policy_path.read_text() == BUILTIN_POLICY_YAML
    argv = stack._frontend_argv()
    assert argv[argv.index("--router-policy-config") + 1] == str(stack.policy_path)
    # The same soft session affinity as stock: the comparison is the plugin alone.
    assert argv[argv.index("--router-session-affinity-mode") + 1] == "soft"
    (ready,) = stack.arm.readiness(stack.launch)
    assert "ThunderAgent admission enabled" in ready.what
    assert stack.arm.observed_env() == {"DYN_LOG": "info,thunderagent=debug"}


def test_router_arms_scope_the_frontend_to_their_router_namespace(tmp_path: Path) -> None:
    ours = _stack(tmp_path / "a", "ours", router_args=["--x"])
    assert ours._frontend_argv()[-4:] == ["--router-mode", "round-robin", "--namespace", "ta"]
    assert (ours.worker_endpoint, ours.router_endpoint) == ("ta-workers.backend.generate",
                                                           "ta.router.generate")
    launch = ours.arm.router(ours.launch)
    assert launch is not None and launch.argv[-1] == "--x"
    assert launch.argv[launch.argv.index("--state-port") + 1] == str(ours.state_port)
    assert launch.env["DTA_ROUTER_ENDPOINT"] == "ta.router.generate"
    assert ours.state_url is not None and len(ours.arm.readiness(ours.launch)) == 1

    python = _stack(tmp_path / "b", "dynamo-python")
    assert python.router_endpoint == "tapy.thunderagent_router.generate"
    launch = python.arm.router(python.launch)
    assert launch is not None and launch.env == {
        "DYN_NAMESPACE": "tapy", "DYN_NAMESPACE_WORKER_SUFFIX": "workers"}  # fmt: skip
    assert python.state_url is None


def test_a_custom_router_command_replaces_ours_and_has_no_state_to_wait_for(
    tmp_path: Path,
) -> None:
    stack = _stack(tmp_path, "ours", router_cmd=["{python}", "r.py", "{router_endpoint}"])
    launch = stack.arm.router(stack.launch)
    assert launch is not None and launch.argv[1:] == ["r.py", "ta.router.generate"]
    assert stack.state_url is None and stack.arm.router_readiness(stack.launch) == []
    assert stack.policy_path is None


def test_each_arm_reports_only_the_figures_it_can_measure() -> None:
    assert arm_named("stock").figures(_Seen({})) == {}
    assert arm_named("builtin").figures(_Seen({})) == {}  # debug lines absent: nothing
    builtin = arm_named("builtin").figures(_Seen({"frontend": (
        "2026-01-01T00:00:01Z ThunderAgent scheduler state changed paused_programs=3\n"
        "x forced program resumes forced_resumes=2\n")}))  # fmt: skip
    assert builtin == {"forced_resumes": 2, "paused_mean": 1.0, "paused_max": 9.0}
    python = arm_named("dynamo-python").figures(_Seen({"router": (
        "2026-01-01T00:00:01Z thunderagent.program paused a paused=1\n")}))  # fmt: skip
    assert (python["pauses"], python["resumes"], python["paused_mean"]) == (1, 0, 1.0)
    ours = arm_named("ours").figures(_Seen({}, {"scheduler": {"counters": {"moves": 4}}}))
    assert (ours["moves"], ours["pauses"], ours["paused_mean"]) == (4, 0, 1.0)
    assert arm_named("ours").figures(_Seen({}))["state_error"] == "no /state"


def test_a_new_arm_is_one_subclass_in_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class RoundRobinArm(Arm):  # the example of docs/architecture.md, "Adding an arm"
        name = "round-robin"

        def frontend_args(self, ctx: LaunchContext) -> list[str]:
            return ["--router-mode", "round-robin"]

    assert isinstance(ARMS, dict)
    monkeypatch.setitem(ARMS, RoundRobinArm.name, RoundRobinArm())  # as if listed in ARMS
    stack = _stack(tmp_path, "round-robin")
    assert stack._frontend_argv()[-2:] == ["--router-mode", "round-robin"]
    assert stack.arm.router(stack.launch) is None and stack.state_url is None
    assert stack.arm.readiness(stack.launch) == [] and stack.arm.figures(_Seen({})) == {}
    with pytest.raises(ValueError, match="only applies to arms 'builtin' and 'ours'"):
        StackConfig(arm="round-robin", policy=tmp_path / "p.yaml").validate()


@pytest.mark.parametrize("arm, router_cmd", [("stock", None), ("ours", ["my-router"])])
def test_a_second_router_needs_an_arm_whose_router_serves_state(
        tmp_path: Path, arm: str, router_cmd: list[str] | None) -> None:
    from dynamo_thunderagent.stack.process import StackError

    stack = _stack(tmp_path, arm, router_cmd=router_cmd)
    stack._env = {"DYN_DISCOVERY_BACKEND": "file"}  # as if started: nothing is spawned
    with pytest.raises(StackError, match=f"arm {arm!r} has no router with a state port"):
        stack.start_router_again()
    assert stack.processes == []


@pytest.mark.parametrize("arm", ["builtin", "ours"])
def test_a_relative_policy_path_reaches_the_router_as_an_absolute_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm: str) -> None:
    # The stack's processes run in its run dir: a path relative to the caller's folder (as
    # bench live's policy copies under a relative --out) would name nothing there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "p.yaml").write_text(PARITY_POLICY.read_text(encoding="utf-8"))
    stack = _stack(tmp_path, arm, policy=Path("out/p.yaml"))
    assert stack.policy_path == stack.launch.policy == tmp_path / "out" / "p.yaml"
