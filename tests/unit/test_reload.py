"""Policy reloads: new parameters reach the live scheduler and no program is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from dynamo_thunderagent.catalog import builtin_catalog, load_policy
from dynamo_thunderagent.classifier import ThunderAgentClassifier
from dynamo_thunderagent.costs import EngineCosts, MeasuredRecompute, TurnTiming
from dynamo_thunderagent.dynamo.reload import PolicyReloader, plan_reload
from dynamo_thunderagent.dynamo.serve import _operate
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import Lifecycle
from dynamo_thunderagent.selector import ThunderAgentSelector

from .conftest import W0, W1, Harness, make


def test_reconfigure_keeps_programs_requests_and_counters(h: Harness) -> None:
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 500)
    h.acting_on("b", W0, 400)
    waiting, _ = h.turn("c", 600)  # no room: paused, its turn waits
    counters = dict(h.scheduler.counters)
    h.scheduler.reconfigure(ThunderAgentParameters(pause_threshold=0.5, pause_target=0.4,
                                                   buffer_per_program=0))
    assert set(h.scheduler.table.programs) == {"a", "b", "c"}
    assert waiting in h.scheduler.table.requests
    assert h.scheduler.counters == counters
    assert h.scheduler.snapshot(h.now)["parameters"]["pause_threshold"] == 0.5  # type: ignore[index]


def test_a_lower_pause_threshold_pauses_at_the_next_tick() -> None:
    h = make(buffer_per_program=0, acting_decay_tau_seconds=1e9)
    h.workers({W0: 1_000})
    h.acting_on("a", W0, 400)
    h.acting_on("b", W0, 300)
    assert not h.tick().paused  # 0.70 is under 0.95
    h.scheduler.reconfigure(ThunderAgentParameters(
        pause_threshold=0.6, pause_target=0.5, resume_hysteresis=0.1, buffer_per_program=0,
        acting_decay_tau_seconds=1e9))
    paused = h.tick().paused
    assert paused == ["b"]  # the smallest ACTING program gives way: 0.70 -> 0.40
    assert h.program("b").lifecycle is Lifecycle.PAUSED
    assert set(h.scheduler.table.programs) == {"a", "b"}


def test_a_new_buffer_reprices_every_rank(h: Harness) -> None:
    h.workers({W0: 10_000, W1: 10_000})
    h.acting_on("a", W0, 500)
    h.scheduler.reconfigure(ThunderAgentParameters(buffer_per_program=250,
                                                   acting_token_weight=0.5))
    assert h.scheduler.table.usage(W0) == 0.5 * 500 + 250


def test_measured_engine_costs_survive_a_reload() -> None:
    h = make(pause_min_recompute_ratio=1.0)
    h.scheduler.observe_costs(EngineCosts(1e-4, 0.5))
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=2.0))
    assert isinstance(h.scheduler.costs, MeasuredRecompute)
    assert h.scheduler.costs.costs == EngineCosts(1e-4, 0.5)
    assert h.scheduler.costs.ratio == 2.0
    # From parity (which measures without deciding) to measured: the meter moves over.
    h = make()
    for _ in range(3):
        h.scheduler.observe_turn(TurnTiming(2_000, 0.2, 0.5))
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=1.0,
                                                   host_kv_blocks=64))
    assert h.scheduler.costs.describe()["decode_seconds"] == pytest.approx(0.5)


def test_a_reload_that_turns_on_acting_hold_factor_sets_the_hold_at_once() -> None:
    h = make(pause_min_recompute_ratio=1.0)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(0.01, 0.5))
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 0.0
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=1.0,
                                                   acting_hold_factor=2.0))
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 2.0 * 1_000 * 0.01
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=1.0))
    assert h.scheduler.snapshot(h.now)["acting_hold_seconds"] == 0.0


def test_a_reload_that_turns_on_acting_yield_factor_sets_the_horizon_at_once() -> None:
    h = make(pause_min_recompute_ratio=1.0)
    h.workers({W0: 1_000})
    h.scheduler.observe_costs(EngineCosts(0.01, 0.5))
    h.tick()
    assert h.scheduler.snapshot(h.now)["acting_yield_seconds"] is None
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=1.0,
                                                   acting_yield_factor=0.5))
    assert h.scheduler.snapshot(h.now)["acting_yield_seconds"] == 0.5 * 1_000 * 0.01
    h.scheduler.reconfigure(ThunderAgentParameters(pause_min_recompute_ratio=1.0))
    assert h.scheduler.snapshot(h.now)["acting_yield_seconds"] is None


# ---- the reloader (what SIGHUP calls) ------------------------------------------------------
POLICY = """request_classifier:
  type: {type}
  parameters: {{pause_threshold: {threshold}, scheduler_interval_seconds: 0.5}}
worker_selection:
  instances: [{{name: ta, type: thunderagent}}]
  aggregated: ta
"""


def _write(path: Path, threshold: object = 0.9, kind: str = "thunderagent") -> Path:
    path.write_text(POLICY.format(type=kind, threshold=threshold), encoding="utf-8")
    return path


def _reloader(path: Path) -> tuple[PolicyReloader, ThunderAgentClassifier]:
    catalog = builtin_catalog()
    policy = load_policy(path, catalog)
    assert policy.classifier is not None
    classifier = catalog.build_classifier(policy.classifier)
    assert isinstance(classifier, ThunderAgentClassifier)
    return PolicyReloader(path, catalog, policy, classifier, clock=lambda: 12.0), classifier


def test_reload_applies_a_new_pause_threshold(tmp_path: Path) -> None:
    path = _write(tmp_path / "policy.yaml", 0.9)
    reloader, classifier = _reloader(path)
    classifier.scheduler.table.create("kept", 0.0)
    _write(path, 0.85)
    plan = reloader.reload()
    assert plan.result == "ok" and plan.changed == {"pause_threshold": (0.9, 0.85)}
    assert classifier.scheduler.params.pause_threshold == 0.85
    assert classifier.scheduler.pause_rule.threshold == 0.85  # type: ignore[union-attr]
    assert "kept" in classifier.scheduler.table.programs
    assert reloader.state()["reloads"] == {"ok": 1, "invalid": 0, "needs_restart": 0}
    assert reloader.state()["last_reload"]["message"] == "applied pause_threshold: 0.9 -> 0.85"


def test_state_shows_the_worker_selection_it_runs_and_keeps_it_until_a_restart(
        tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.replace("{{name: ta, type: thunderagent}}", "{{name: ta, type: "
                                   "thunderagent, parameters: {{preferred_load_slack: 1.0}}}}")
                    .format(type="thunderagent", threshold=0.9), encoding="utf-8")
    reloader, _ = _reloader(path)
    running = {"aggregated": {"instance": "ta", "type": "thunderagent",
                              "parameters": {"preferred_load_slack": 1.0}}}
    assert reloader.state()["worker_selection"] == running
    _write(path, 0.9)  # the slack dropped: a selector change, refused until a restart
    assert reloader.reload().result == "needs_restart"
    assert reloader.state()["worker_selection"] == running


class _PathParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")
    table: Path = Path("weights.json")


class _PathSelector(ThunderAgentSelector):
    Parameters = _PathParameters


def test_state_is_json_with_a_plugin_selector_whose_parameter_is_a_path(tmp_path: Path) -> None:
    catalog = builtin_catalog()
    catalog.worker_selectors.register("pathy", _PathSelector)
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(type="thunderagent", threshold=0.9).replace(
        "type: thunderagent}", "type: pathy, parameters: {table: w.json}}"), encoding="utf-8")
    policy = load_policy(path, catalog)
    assert policy.classifier is not None
    classifier = catalog.build_classifier(policy.classifier)
    reloader = PolicyReloader(path, catalog, policy, classifier)
    state = json.loads(json.dumps(reloader.state()))  # /state serves it with json.dumps
    assert state["worker_selection"]["aggregated"]["parameters"] == {"table": "w.json"}


def test_an_invalid_file_keeps_the_old_policy_with_validates_message(tmp_path: Path) -> None:
    path = _write(tmp_path / "policy.yaml", 0.9)
    reloader, classifier = _reloader(path)
    _write(path, 1.5)
    plan = reloader.reload()
    assert plan.result == "invalid"
    assert plan.message.startswith(f"{path}: request_classifier.parameters.pause_threshold")
    assert classifier.scheduler.params.pause_threshold == 0.9
    path.write_text("request_classifier: {type: thunderagent}\n", encoding="utf-8")
    assert "worker_selection.aggregated" in reloader.reload().message
    assert reloader.reloads == {"ok": 0, "invalid": 2, "needs_restart": 0}
    _write(path, 0.82)  # a good file afterwards applies against the policy still running
    assert reloader.reload().changed == {"pause_threshold": (0.9, 0.82)}


@pytest.mark.parametrize(("text", "why"), [
    ("x: 2020-13-45\n", "not valid YAML: a value cannot be read: month must be in 1..12"),
    ("x: " + "9" * 5000 + "\n", "not valid YAML: a value cannot be read"),
    ("x: " + "[" * 3000 + "]" * 3000 + "\n", "a value cannot be read: nested too deeply"),
], ids=["bad-date", "huge-integer", "deep-nesting"])
def test_yaml_python_cannot_hold_is_an_invalid_reload_not_a_crash(
        tmp_path: Path, text: str, why: str) -> None:
    path = _write(tmp_path / "policy.yaml", 0.9)
    reloader, classifier = _reloader(path)
    path.write_text(text, encoding="utf-8")
    plan = reloader.reload()
    assert plan.result == "invalid" and plan.message.startswith(f"{path}: ")
    assert why in plan.message
    assert classifier.scheduler.params.pause_threshold == 0.9
    assert reloader.reloads["invalid"] == 1


async def test_the_file_watch_survives_a_reload_that_raises(tmp_path: Path) -> None:
    from dynamo_thunderagent.dynamo.reload import signature

    path = _write(tmp_path / "policy.yaml", 0.9)
    reloader, classifier = _reloader(path)
    real = reloader.reload
    calls: list[str] = []

    def reload(trigger: str = "SIGHUP") -> object:
        calls.append(trigger)
        if len(calls) == 1:
            reloader._seen = signature(str(path))  # as the real one does, first
            raise RuntimeError("a bug in a reload")
        return real(trigger)

    reloader.reload = reload  # type: ignore[assignment, method-assign]
    watch = asyncio.create_task(reloader.watch(interval=0.01))
    try:
        _write(path, 0.85)
        await _until(lambda: len(calls) == 1)
        _write(path, 0.8)  # the next edit is still seen and applied
        await _until(lambda: classifier.scheduler.params.pause_threshold == 0.8)
        assert not watch.done()
    finally:
        watch.cancel()


def test_the_watch_reads_a_file_only_once_it_has_stopped_changing(tmp_path: Path) -> None:
    path = _write(tmp_path / "policy.yaml", 0.9)
    reloader, classifier = _reloader(path)
    whole = path.read_text(encoding="utf-8").replace("0.9", "0.85")
    path.write_text(whole[: len(whole) // 2], encoding="utf-8")  # a writer half-way through
    assert reloader.poll() is None  # changed since the last look: not read yet
    path.write_text(whole, encoding="utf-8")  # the writer finishes
    assert reloader.poll() is None  # changed again: still settling
    plan = reloader.poll()  # the same as a look ago: read now
    assert plan is not None and plan.result == "ok"
    assert classifier.scheduler.params.pause_threshold == 0.85
    assert reloader.reloads == {"ok": 1, "invalid": 0, "needs_restart": 0}  # none half-read
    assert reloader.poll() is None  # nothing new


async def test_an_edit_made_while_serve_starts_is_reloaded_by_the_watch(tmp_path: Path) -> None:
    from dynamo_thunderagent.dynamo.reload import signature

    path = _write(tmp_path / "policy.yaml", 0.9)
    seen = signature(str(path))  # serve takes it before it reads the policy ...
    catalog = builtin_catalog()
    policy = load_policy(path, catalog)
    assert policy.classifier is not None
    classifier = catalog.build_classifier(policy.classifier)
    assert isinstance(classifier, ThunderAgentClassifier)
    _write(path, 0.85)  # ... and the file changes while it waits for workers
    os.utime(path, ns=(1, 1))  # a different signature even on a coarse clock
    reloader = PolicyReloader(path, catalog, policy, classifier, seen=seen)
    watch = asyncio.create_task(reloader.watch(interval=0.01))
    try:
        await _until(lambda: classifier.scheduler.params.pause_threshold == 0.85)
    finally:
        watch.cancel()


async def test_a_sighup_while_serve_starts_is_kept_and_applied(tmp_path: Path) -> None:
    from dynamo_thunderagent.dynamo.reload import signature
    from dynamo_thunderagent.dynamo.serve import _keep_hangups, _Startup

    path = _write(tmp_path / "policy.yaml", 0.9)
    previous = signal.getsignal(signal.SIGHUP)
    loop = asyncio.get_running_loop()
    try:
        hangups = _keep_hangups()
        startup = _Startup(signature(str(path)), hangups)
        catalog = builtin_catalog()
        policy = load_policy(path, catalog)
        assert policy.classifier is not None
        classifier = catalog.build_classifier(policy.classifier)
        assert isinstance(classifier, ThunderAgentClassifier)
        _write(path, 0.85)
        os.kill(os.getpid(), signal.SIGHUP)  # before the reloader exists: kept, not fatal
        assert hangups == [signal.SIGHUP]
        router = SimpleNamespace(state_extensions={})
        args = Namespace(router_policy_config=str(path), watch_policy=False, events_port=0,
                         state_host="127.0.0.1")
        operate = _operate(args, policy, catalog, classifier, router, loop, startup)
        try:
            assert classifier.scheduler.params.pause_threshold == 0.85
            last = router.state_extensions["policy"]()["last_reload"]
            assert last["trigger"] == "SIGHUP during startup"
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            operate.close()
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_new_classifier_type_or_selector_needs_a_restart(tmp_path: Path) -> None:
    old = load_policy(_write(tmp_path / "old.yaml"), builtin_catalog())
    catalog = builtin_catalog()
    catalog.request_classifiers.register("other", ThunderAgentClassifier)
    new = load_policy(_write(tmp_path / "new.yaml", kind="other"), catalog)
    plan = plan_reload(old, new)
    assert plan.result == "needs_restart" and "needs a restart" in plan.message
    other = tmp_path / "selector.yaml"
    other.write_text(POLICY.format(type="thunderagent", threshold=0.9).replace(
        "name: ta", "name: tb").replace("aggregated: ta", "aggregated: tb"), encoding="utf-8")
    plan = plan_reload(old, load_policy(other, builtin_catalog()))
    assert plan.result == "needs_restart"
    # It names what changed, not only that the selection did.
    assert "worker_selection.aggregated.instance: 'ta' -> 'tb'" in plan.message
    assert plan_reload(old, old).message == "no parameter changed"


# ---- serve's wiring: SIGHUP and --watch-policy --------------------------------------------
async def _until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _wired(path: Path, *, watch: bool = False) -> tuple[ThunderAgentClassifier, Any, Any]:
    """serve's operator wiring (``_operate``: SIGHUP, --watch-policy) around a classifier
    built from ``path``, on the running loop: the classifier, the router stand-in (its
    ``state_extensions``) and what ``_operate`` returned."""
    catalog = builtin_catalog()
    policy = load_policy(path, catalog)
    assert policy.classifier is not None
    classifier = catalog.build_classifier(policy.classifier)
    assert isinstance(classifier, ThunderAgentClassifier)
    router = SimpleNamespace(state_extensions={})
    args = Namespace(router_policy_config=str(path), watch_policy=watch, events_port=0,
                     state_host="127.0.0.1")
    operate = _operate(args, policy, catalog, classifier, router, asyncio.get_running_loop())
    return classifier, router, operate


@pytest.mark.parametrize("watch", [False, True], ids=["sighup", "watch-policy"])
async def test_serve_reloads_on_sighup_or_when_the_file_changes(tmp_path: Path,
                                                                watch: bool) -> None:
    path = _write(tmp_path / "policy.yaml", 0.9)
    classifier, router, operate = _wired(path, watch=watch)
    loop = asyncio.get_running_loop()
    try:
        _write(path, 0.85)
        if not watch:
            os.kill(os.getpid(), signal.SIGHUP)  # this process: the handler is ours
        await _until(lambda: router.state_extensions["policy"]()["reloads"]["ok"] == 1)
        assert classifier.scheduler.params.pause_threshold == 0.85
        lifecycle = router.state_extensions["lifecycle"]()  # wired, with no --events-port
        assert lifecycle["events_url"] is None and lifecycle["published"]["paused"] == 0
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        operate.close()


async def test_a_sighup_reload_that_raises_is_logged_and_the_next_one_applies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A reload failing in a way nobody foresaw, from the signal handler: logged as
    # policy.reload_failed with the running policy kept, as the file watch does (before,
    # the event loop logged a bare "Exception in callback", no event an operator greps for).
    from structlog.testing import capture_logs

    path = _write(tmp_path / "policy.yaml", 0.9)
    real = PolicyReloader.reload
    calls: list[str] = []

    def reload(self: PolicyReloader, trigger: str = "SIGHUP") -> object:
        calls.append(trigger)
        if len(calls) == 1:
            raise RuntimeError("a bug in a reload")
        return real(self, trigger)

    monkeypatch.setattr(PolicyReloader, "reload", reload)
    classifier, _, operate = _wired(path)
    loop = asyncio.get_running_loop()
    try:
        _write(path, 0.85)
        with capture_logs() as logs:
            os.kill(os.getpid(), signal.SIGHUP)
            await _until(lambda: len(calls) == 1)
            await asyncio.sleep(0.05)
        failed = [entry for entry in logs if entry["event"] == "policy.reload_failed"]
        assert len(failed) == 1 and failed[0]["trigger"] == "SIGHUP"
        assert classifier.scheduler.params.pause_threshold == 0.9  # kept
        os.kill(os.getpid(), signal.SIGHUP)
        await _until(lambda: classifier.scheduler.params.pause_threshold == 0.85)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        operate.close()
