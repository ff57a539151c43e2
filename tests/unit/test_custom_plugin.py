"""A third-party request classifier, loaded through the real entry-point path.

The example package in ``examples/priority_gate`` is not pip-installed: each
test writes the ``*.dist-info`` folder that pip would write (METADATA and
``entry_points.txt``, the latter taken from the example's own pyproject.toml)
and puts it and the example's source on ``sys.path``. From there on the
catalog finds the plugin exactly as it would in a real installation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dynamo_thunderagent.catalog import (
    CLASSIFIER_GROUP,
    PluginError,
    default_catalog,
    load_policy,
)
from dynamo_thunderagent.classifier import (
    AdmissionRejected,
    ClassifyRequest,
    Completed,
    RequestClassifier,
    Sent,
)
from dynamo_thunderagent.cli import main as cli_main
from dynamo_thunderagent.config import PolicyError
from dynamo_thunderagent.program import WorkerKey

tomllib = pytest.importorskip("tomllib")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "priority_gate"


def write_dist_info(root: Path, name: str, entry_points: dict[str, dict[str, str]]) -> None:
    """What ``pip install`` leaves behind, reduced to what entry-point lookup reads."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = []
    for group, points in entry_points.items():
        lines.append(f"[{group}]")
        lines.extend(f"{point} = {target}" for point, target in points.items())
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def declared_entry_points() -> dict[str, dict[str, str]]:
    pyproject = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    points: dict[str, dict[str, str]] = pyproject["project"]["entry-points"]
    return points


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example plugin, 'installed' into a private site folder; returns that folder."""
    site = tmp_path / "site"
    site.mkdir()
    write_dist_info(site, "priority_gate", declared_entry_points())
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.syspath_prepend(str(site))
    return site


def write_policy(tmp_path: Path, parameters: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "request_classifier:\n"
        "  type: priority-gate\n"
        f"  parameters: {parameters}\n"
        "worker_selection:\n"
        "  instances: [{name: ta, type: thunderagent}]\n"
        "  aggregated: ta\n"
    )
    return path


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def build_gate(tmp_path: Path, parameters: str, clock: Callable[[], float]) -> RequestClassifier:
    catalog = default_catalog()
    policy = load_policy(write_policy(tmp_path, parameters), catalog)
    assert policy.classifier is not None
    return catalog.build_classifier(policy.classifier, clock=clock)


def turn(rid: str, session: str, parent: str | None = None) -> ClassifyRequest:
    return ClassifyRequest(rid, session, input_tokens=100, parent_session_id=parent)


def final(rid: str, session: str) -> ClassifyRequest:
    return ClassifyRequest(rid, session, input_tokens=0, session_final=True)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


# ---- resolution ------------------------------------------------------------------------
def test_example_declares_its_type_in_the_classifier_group() -> None:
    assert declared_entry_points() == {
        CLASSIFIER_GROUP: {"priority-gate": "priority_gate:PriorityGate"}
    }


def test_installed_plugin_type_resolves_from_the_default_catalog(installed: Path) -> None:
    catalog = default_catalog()
    assert catalog.request_classifiers.names() == ["priority-gate", "thunderagent"]
    plugin = catalog.request_classifiers.get("priority-gate")
    assert plugin.__module__ == "priority_gate" and plugin.__name__ == "PriorityGate"
    assert issubclass(plugin, RequestClassifier)


def test_example_policy_file_validates_with_defaults_filled_in(installed: Path) -> None:
    policy = load_policy(EXAMPLE / "policy.yaml")
    assert policy.classifier is not None and policy.classifier.type == "priority-gate"
    assert policy.describe()["request_classifier"]["parameters"] == {
        "max_sessions": 32, "max_waiting": 256, "idle_release_seconds": 300.0,
    }
    assert policy.stages["aggregated"].type == "thunderagent"


def test_validate_command_prints_the_resolved_plugin_policy(
    installed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["validate", str(EXAMPLE / "policy.yaml")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["request_classifier"]["type"] == "priority-gate"


def test_omitted_parameters_take_their_defaults(installed: Path, tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path, "{}"))
    assert policy.classifier is not None
    assert policy.classifier.parameters.model_dump() == {
        "max_sessions": 64, "max_waiting": 1024, "idle_release_seconds": 600.0,
    }


@pytest.mark.parametrize(
    ("parameters", "key", "why"),
    [
        ("{max_sessions: 0}", "request_classifier.parameters.max_sessions", "greater than 0"),
        ("{max_waiting: -1}", "request_classifier.parameters.max_waiting", "greater than or equal"),
        ("{idle_release_seconds: .inf}", "request_classifier.parameters.idle_release_seconds",
         "finite"),
        ("{max_session: 4}", "request_classifier.parameters.max_session", "unknown key"),
    ],
)
def test_invalid_plugin_parameter_fails_naming_file_and_key(
    installed: Path, tmp_path: Path, parameters: str, key: str, why: str
) -> None:
    path = write_policy(tmp_path, parameters)
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    message = str(error.value)
    assert str(path) in message and key in message and why in message
    if why == "unknown key":  # the accepted names, and the closest
        assert "accepts parameters: max_sessions, max_waiting, idle_release_seconds" in message
        assert "did you mean 'max_sessions'?" in message
    else:  # what the key accepts, not every other key
        assert "allowed: " in message and "accepts parameters" not in message


def test_validate_command_reports_a_bad_plugin_parameter(
    installed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_policy(tmp_path, "{max_sessions: 0}")
    assert cli_main(["validate", str(path)]) == 2
    assert "request_classifier.parameters.max_sessions" in capsys.readouterr().err


# ---- registration errors ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "complaint"),
    [("thunderagent", "already registered"), ("default", "reserved")],
)
def test_plugin_cannot_take_a_builtin_or_reserved_type_name(
    installed: Path, name: str, complaint: str
) -> None:
    write_dist_info(installed, "squatter",
                    {CLASSIFIER_GROUP: {name: "priority_gate:PriorityGate"}})
    with pytest.raises(PluginError, match=complaint) as error:
        default_catalog()
    assert repr(name) in str(error.value)
    assert "request_classifier" in str(error.value)


def test_plugin_whose_module_is_missing_fails_naming_the_entry_point(installed: Path) -> None:
    write_dist_info(installed, "broken",
                    {CLASSIFIER_GROUP: {"broken-gate": "no_such_module:Gate"}})
    with pytest.raises(PluginError, match=r"'broken-gate'.*no_such_module:Gate.*failed to load"):
        default_catalog()


def test_serve_with_a_broken_plugin_says_what_validate_says(
        installed: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: validate printed the error, serve a traceback (its catalog was built outside
    # the checks that turn a PluginError into a message).
    from dynamo_thunderagent.dynamo import serve

    monkeypatch.setattr(serve, "configure_logging", lambda: None)
    write_dist_info(installed, "broken",
                    {CLASSIFIER_GROUP: {"broken-gate": "no_such_module:Gate"}})
    policy = str(EXAMPLE / "policy.yaml")
    assert cli_main(["validate", policy]) == 2
    said = capsys.readouterr().err
    assert "'broken-gate'" in said and "failed to load" in said
    assert cli_main(["serve", "--router-policy-config", policy, "--endpoint",
                     "w.backend.generate", "--model-name", "m", "--model-path", "m"]) == 2
    assert capsys.readouterr().err == said


def test_plugin_class_must_be_a_request_classifier(installed: Path) -> None:
    write_dist_info(installed, "wrong_base",
                    {CLASSIFIER_GROUP: {"not-a-gate": "priority_gate:PriorityGateParameters"}})
    with pytest.raises(PluginError, match="must be a subclass of"):
        default_catalog()


# ---- behaviour of the built classifier ----------------------------------------------------
async def test_sessions_beyond_the_cap_wait_for_a_session_final(
    installed: Path, tmp_path: Path
) -> None:
    clock = FakeClock()
    gate = build_gate(tmp_path, "{max_sessions: 1}", clock)
    first = await gate.classify(turn("a1", "a"))
    assert first.tracked and first.preferred is None
    waiting = asyncio.create_task(gate.classify(turn("b1", "b")))
    await settle()
    assert not waiting.done()
    assert gate.snapshot() == {"sessions": ["a"], "max_sessions": 1, "waiting": 1}
    again = await gate.classify(turn("a2", "a"))  # a holds the slot: no wait
    assert again.tracked
    clock.now = 7.0
    done = await gate.classify(final("a-final", "a"))
    assert done.session_final
    admitted = await asyncio.wait_for(waiting, timeout=1)
    assert admitted.waited_seconds == 7.0
    assert gate.snapshot()["sessions"] == ["b"]


async def test_subagent_of_a_running_session_skips_the_queue(
    installed: Path, tmp_path: Path
) -> None:
    gate = build_gate(tmp_path, "{max_sessions: 1}", FakeClock())
    await gate.classify(turn("p1", "parent"))
    stranger = asyncio.create_task(gate.classify(turn("s1", "stranger")))
    await settle()
    child = await asyncio.wait_for(gate.classify(turn("c1", "child", parent="parent")), 1)
    assert child.tracked
    assert not stranger.done()
    assert gate.snapshot()["sessions"] == ["parent"]  # the subagent took no slot
    stranger.cancel()


async def test_full_queue_rejects_with_the_limit_it_hit(installed: Path, tmp_path: Path) -> None:
    gate = build_gate(tmp_path, "{max_sessions: 1, max_waiting: 1}", FakeClock())
    await gate.classify(turn("a1", "a"))
    queued = asyncio.create_task(gate.classify(turn("b1", "b")))
    await settle()
    with pytest.raises(AdmissionRejected, match=r"max_waiting=1") as error:
        await gate.classify(turn("c1", "c"))
    assert error.value.request_id == "c1"
    queued.cancel()


async def test_cancelled_wait_leaves_the_queue(installed: Path, tmp_path: Path) -> None:
    gate = build_gate(tmp_path, "{max_sessions: 1}", FakeClock())
    await gate.classify(turn("a1", "a"))
    gave_up = asyncio.create_task(gate.classify(turn("b1", "b")))
    later = asyncio.create_task(gate.classify(turn("c1", "c")))
    await settle()
    gave_up.cancel()
    await settle()
    assert gate.snapshot()["waiting"] == 1
    await gate.classify(final("a-final", "a"))
    await asyncio.wait_for(later, timeout=1)
    assert gate.snapshot()["sessions"] == ["c"]


async def test_quiet_session_gives_its_slot_back_on_tick(installed: Path, tmp_path: Path) -> None:
    clock = FakeClock()
    gate = build_gate(tmp_path, "{max_sessions: 1, idle_release_seconds: 30}", clock)
    assert gate.tick_interval == 5.0
    await gate.classify(turn("a1", "a"))
    waiting = asyncio.create_task(gate.classify(turn("b1", "b")))
    await settle()
    clock.now = 100.0
    gate.tick()  # a1 is still in flight: the slot stays
    await settle()
    assert not waiting.done()
    gate.on_event(Sent("a1", WorkerKey(1)))
    gate.on_event(Completed("a1", context_tokens=180))
    clock.now = 129.0
    gate.tick()
    await settle()
    assert not waiting.done()  # quiet for 29 s only
    clock.now = 130.0
    gate.tick()
    admitted = await asyncio.wait_for(waiting, timeout=1)
    assert admitted.waited_seconds == 130.0


async def test_requests_without_a_session_pass_untracked(installed: Path, tmp_path: Path) -> None:
    gate = build_gate(tmp_path, "{max_sessions: 1}", FakeClock())
    await gate.classify(turn("a1", "a"))
    admission = await gate.classify(ClassifyRequest("x", None, input_tokens=5))
    assert not admission.tracked and admission.preferred is None
    gate.on_event(Completed("never-seen", context_tokens=1))  # ignored
