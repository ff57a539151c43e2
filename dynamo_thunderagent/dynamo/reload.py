"""Reloading the router policy while ``serve`` runs (SIGHUP, or a change to the file).

Tuning a threshold should not cost a restart that forgets every program. On a reload
the file is read and validated exactly as ``dynamo-thunderagent validate`` reads it
(:func:`~dynamo_thunderagent.catalog.load_policy`, same messages), then compared with
the running policy:

* only the classifier's parameters changed: they are applied to the live classifier
  (:meth:`~dynamo_thunderagent.classifier.RequestClassifier.reconfigure`); programs,
  waiting turns, counters and measured engine costs are kept;
* the classifier's type or the worker selection changed, or the classifier type cannot
  change parameters live: nothing is applied, the log says a restart is needed;
* the file is invalid: nothing is applied, the log gives the validation message.

Each reload is counted by result (``ok``, ``invalid``, ``needs_restart``) in the
router's /state (``policy.reloads``). Which parameters are live: docs/operate.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from dynamo_thunderagent.catalog import Catalog, PluginError, ResolvedPolicy, load_policy
from dynamo_thunderagent.classifier import RequestClassifier
from dynamo_thunderagent.config import PolicyError

log = structlog.get_logger("dynamo_thunderagent.reload")

ReloadResult = Literal["ok", "invalid", "needs_restart"]
RESULTS: tuple[ReloadResult, ...] = ("ok", "invalid", "needs_restart")


def check_policy(policy: ResolvedPolicy) -> None:
    """What ``serve`` needs of a policy beyond its schema; PolicyError if it lacks it."""
    if policy.classifier is None or "aggregated" not in policy.stages:
        raise PolicyError(f"{policy.source}: the router needs request_classifier and "
                          "worker_selection.aggregated")


@dataclass(frozen=True)
class ReloadPlan:
    """What a new policy changes relative to the running one."""

    result: ReloadResult
    message: str
    changed: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (old, new)


def plan_reload(current: ResolvedPolicy, new: ResolvedPolicy) -> ReloadPlan:
    """Whether ``new`` can replace ``current`` live, and which parameters it changes.

    Pure: nothing is applied. A change of classifier type or of the worker selection is
    refused (``needs_restart``): a new classifier would start with an empty program table.
    """
    assert current.classifier is not None and new.classifier is not None
    old_type, new_type = current.classifier.type, new.classifier.type
    if old_type != new_type:
        return ReloadPlan("needs_restart", f"request_classifier.type changed from "
                          f"{old_type!r} to {new_type!r}; a new classifier type starts with "
                          "an empty program table, so it needs a restart")
    old_stages = current.describe().get("worker_selection")
    new_stages = new.describe().get("worker_selection")
    if old_stages != new_stages:
        what = "; ".join(f"{key}: {old!r} -> {value!r}" for key, (old, value)
                         in _differences(old_stages, new_stages, "worker_selection").items())
        return ReloadPlan("needs_restart", f"worker_selection changed ({what}); the worker "
                          "selector is chosen at startup, so it needs a restart")
    old_params = current.classifier.parameters.model_dump()
    new_params = new.classifier.parameters.model_dump()
    changed = {key: (old_params.get(key), value) for key, value in new_params.items()
               if old_params.get(key) != value}
    if not changed:
        return ReloadPlan("ok", "no parameter changed")
    listed = ", ".join(f"{key}: {old!r} -> {value!r}" for key, (old, value) in changed.items())
    return ReloadPlan("ok", f"applied {listed}", changed)


def _differences(old: Any, new: Any, where: str) -> dict[str, tuple[Any, Any]]:
    """Each key path under ``where`` whose value differs between two plain-data trees
    (a key on one side only: None on the other)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(old) | set(new), key=str):
            out.update(_differences(old.get(key), new.get(key), f"{where}.{key}"))
        return out
    return {} if old == new else {where: (old, new)}


class PolicyReloader:
    """Re-reads ``path`` on demand and applies what can change live to ``classifier``."""

    def __init__(self, path: str | Path, catalog: Catalog, policy: ResolvedPolicy,
                 classifier: RequestClassifier, *,
                 clock: Callable[[], float] = time.time,
                 seen: tuple[int, int, int] | None = None) -> None:
        self.path = str(path)
        self.catalog = catalog
        self.policy = policy
        self.classifier = classifier
        self.clock = clock
        self.reloads: dict[str, int] = dict.fromkeys(RESULTS, 0)
        self.last: dict[str, Any] | None = None
        # The file as last read (what `watch` compares with): ``seen``, taken before the
        # running policy was read (serve reads it, then waits for workers: an edit made
        # meanwhile is a change), else now; and again at every reload.
        self._seen = seen if seen is not None else signature(self.path)
        self._settling: tuple[int, int, int] | None = None  # a change not yet read (poll)

    def reload(self, trigger: str = "SIGHUP") -> ReloadPlan:
        """Read, validate and apply the policy file; the old policy stays on any failure."""
        self._seen = signature(self.path)
        try:
            new = load_policy(self.path, self.catalog)
            check_policy(new)
        except (PolicyError, PluginError) as error:
            plan = ReloadPlan("invalid", str(error))
            log.error("policy.reload_invalid", source=self.path, trigger=trigger,
                      error=plan.message, kept="the running policy")
            return self._count(plan, trigger)
        plan = plan_reload(self.policy, new)
        if plan.result == "ok" and plan.changed:
            assert new.classifier is not None
            if not self.classifier.reconfigure(new.classifier.parameters):
                plan = ReloadPlan("needs_restart", f"classifier type "
                                  f"{new.classifier.type!r} cannot change its parameters live")
        if plan.result == "ok":
            self.policy = new
            log.info("policy.reloaded", source=self.path, trigger=trigger, change=plan.message)
        else:
            log.warning("policy.reload_needs_restart", source=self.path, trigger=trigger,
                        reason=plan.message, kept="the running policy")
        return self._count(plan, trigger)

    def _count(self, plan: ReloadPlan, trigger: str) -> ReloadPlan:
        self.reloads[plan.result] += 1
        self.last = {"result": plan.result, "message": plan.message, "trigger": trigger,
                     "at": self.clock()}
        return plan

    def state(self) -> dict[str, Any]:
        """The ``policy`` part of the router's /state: its file, the reloads, and the worker
        selection it runs (types and parameters, defaults filled in; fixed until a restart,
        while the classifier's parameters show in ``scheduler.parameters``)."""
        return {"source": self.path, "reloads": dict(self.reloads), "last_reload": self.last,
                "worker_selection": self.policy.describe().get("worker_selection")}

    async def watch(self, interval: float = 1.0) -> None:
        """Reload whenever the file changes (its size, modification time or inode), once
        it has stayed the same for ``interval`` (:meth:`poll` every ``interval``)."""
        while True:
            await asyncio.sleep(interval)
            self.poll()

    def poll(self) -> ReloadPlan | None:
        """One look at the file: reload it if it changed and has not changed since the last
        look (a file still being written is not read half-way); the plan, or None."""
        now = signature(self.path)
        if now is None or now == self._seen:
            self._settling = None
            return None
        if now != self._settling:
            self._settling = now  # changed since the last look: let the writer finish
            return None
        self._settling = None
        return self.guarded_reload(trigger="file changed")

    def guarded_reload(self, trigger: str = "SIGHUP") -> ReloadPlan | None:
        """:meth:`reload`, with any failure nobody foresaw logged (``policy.reload_failed``,
        with its traceback) and the running policy kept: what a signal handler or the file
        watch calls, where an exception would be lost or end the watch. None then."""
        try:
            return self.reload(trigger=trigger)
        except Exception as error:  # the next signal or edit may fix it
            log.exception("policy.reload_failed", source=self.path, trigger=trigger,
                          error=repr(error), kept="the running policy")
            return None


def signature(path: str) -> tuple[int, int, int] | None:
    """What tells one version of the file from another (None: it cannot be read)."""
    with contextlib.suppress(OSError):
        stat = os.stat(path)
        return stat.st_mtime_ns, stat.st_size, stat.st_ino
    return None
