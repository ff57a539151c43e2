"""examples/sandbox_pool: sandboxes parked, prepared and reclaimed from lifecycle events."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dynamo_thunderagent.events import LifecycleEvent

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sandbox_pool" / "harness.py"


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    pytest.importorskip("zmq")
    spec = importlib.util.spec_from_file_location("sandbox_pool_harness", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _event(kind: str, session: str) -> LifecycleEvent:
    return LifecycleEvent(kind, session, 7, 0, 0.0)  # type: ignore[arg-type]


def test_a_program_is_prepared_parked_and_reclaimed(harness: ModuleType) -> None:
    pool = harness.SandboxPool(spares=1)
    pool.start()
    try:
        assert pool.handle(_event("paused", "a")) == "nothing to park"
        assert pool.handle(_event("resuming", "a")) == "prepared"
        sandbox = pool.by_program["a"]
        assert sandbox.worker == "7/0" and len(pool.warm) == 1  # the spare was replaced
        assert pool.handle(_event("paused", "a")) == "parked" and sandbox.parked
        assert pool.handle(_event("resuming", "a")) == "prepared" and not sandbox.parked
        assert pool.by_program["a"] is sandbox  # the same sandbox, woken
        assert pool.handle(_event("ended", "a")) == "reclaimed"
        assert sandbox.process.poll() is not None and "a" not in pool.by_program
        assert pool.handle(_event("expired", "a")) == "nothing to reclaim"
    finally:
        pool.close()
    assert not pool.warm and not pool.by_program
