"""Program events: one per program-changing step, with the reason it was taken, logged with
the same fields at a level that keeps INFO readable, and in step with the scheduler's counters;
every rejection names the limit it hit."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import settings
from hypothesis.stateful import invariant, run_state_machine_as_test
from structlog.testing import capture_logs

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.decisions import REJECT_LIMITS, Decisions, EventKind, ProgramEvent
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import NO_PREFIX, PrefixBlocks, WorkerKey
from dynamo_thunderagent.program_log import configure_logging, log_event
from dynamo_thunderagent.scheduler import Scheduler
from tests.unit import test_properties
from tests.unit.conftest import Harness

REPO = Path(__file__).resolve().parents[2]
W0 = WorkerKey(0, 0)


class KeepsSteps(Scheduler):
    """Keeps the steps and rejection limits of every call's decisions, as the classifier
    reads them (``Decisions.steps``, ``Reject.limit``)."""

    def __init__(self, params: ThunderAgentParameters) -> None:
        super().__init__(params)
        self.steps: list[ProgramEvent] = []
        self.limits: list[str] = []

    def drain(self) -> list[ProgramEvent]:
        steps, self.steps = self.steps, []
        return steps

    def _keep(self, d: Decisions) -> Decisions:
        self.steps += d.steps
        self.limits += [reject.limit for reject in d.rejected]
        return d

    def set_workers(self, live_worker_ids: set[int] | frozenset[int],
                    cards: dict[WorkerKey, CapacityCard], now: float | None = None) -> Decisions:
        return self._keep(super().set_workers(live_worker_ids, cards, now))

    def submit(self, request_id: str, session_id: str, input_tokens: int, now: float, *,
               session_final: bool = False, prefix: PrefixBlocks = NO_PREFIX) -> Decisions:
        return self._keep(super().submit(request_id, session_id, input_tokens, now,
                                         session_final=session_final, prefix=prefix))

    def sent(self, request_id: str, worker: WorkerKey, now: float) -> Decisions:
        return self._keep(super().sent(request_id, worker, now))

    def completed(self, request_id: str, context_tokens: int, now: float) -> Decisions:
        return self._keep(super().completed(request_id, context_tokens, now))

    def aborted(self, request_id: str, now: float) -> Decisions:
        return self._keep(super().aborted(request_id, now))

    def tick(self, now: float) -> Decisions:
        return self._keep(super().tick(now))

    # A sessionless request's start and end change room, so they may pause or resume
    # programs too (the classifier applies these decisions like any other).
    def sessionless_started(self, request_id: str, worker: WorkerKey, tokens: int,
                            now: float) -> Decisions:
        return self._keep(super().sessionless_started(request_id, worker, tokens, now))

    def sessionless_ended(self, request_id: str, now: float) -> Decisions:
        return self._keep(super().sessionless_ended(request_id, now))


def recording(**params: Any) -> Harness:
    return Harness(KeepsSteps(ThunderAgentParameters(
        buffer_per_program=0, acting_decay_tau_seconds=1e9, **params)))


def kinds(h: Harness) -> list[tuple[str, str, str]]:
    assert isinstance(h.scheduler, KeepsSteps)
    return [(e.kind.value, e.program, e.reason) for e in h.scheduler.drain()]


def test_a_new_program_that_fits_no_rank_is_paused_for_no_room() -> None:
    h = recording(pause_threshold=0.9)
    h.workers({W0: 1000})
    h.acting_on("a", W0, 800)
    kinds(h)
    h.turn("new", 300)  # 800 + 300 > 900
    assert kinds(h) == [("paused", "new", "no_room"), ("deferred", "new", "program_paused")]


def test_acting_programs_of_a_rank_over_its_threshold_are_paused_for_pressure() -> None:
    h = recording(pause_threshold=0.9, pause_target=0.5)
    h.workers({W0: 1000})
    h.acting_on("a", W0, 500)
    h.acting_on("b", W0, 300)
    h.workers({W0: 800})  # capacity shrank under them: 800 > 720
    kinds(h)
    h.tick()
    paused = [(program, reason) for kind, program, reason in kinds(h) if kind == "paused"]
    assert paused and all(reason == "pressure" for _, reason in paused)


def test_a_marked_program_is_paused_at_its_tool_boundary() -> None:
    h = recording(pause_threshold=0.9, pause_target=0.5)
    h.workers({W0: 1000})
    running, _ = h.turn("a", 950)  # REASONING over the threshold: marked, not preempted
    h.tick()
    assert h.program("a").marked_for_pause
    kinds(h)
    h.complete(running, 960)
    assert ("paused", "a", "tool_boundary") in kinds(h)


def test_a_deferral_past_resume_timeout_is_recorded_as_forced_with_its_wait() -> None:
    h = recording(resume_timeout_seconds=10)
    h.workers({W0: 1000})
    h.acting_on("big", W0, 900)
    h.turn("small", 500)
    h.tick()
    assert isinstance(h.scheduler, KeepsSteps)
    h.scheduler.drain()
    h.advance(11)
    h.tick()
    forced = [e for e in h.scheduler.drain() if e.kind is EventKind.FORCED]
    assert [(e.program, e.reason, e.wait) for e in forced] == [("small", "resume_timeout", 11)]


def test_a_session_final_ends_the_program_and_an_expired_one_says_so() -> None:
    h = recording(session_retention_seconds=60)
    h.workers({W0: 1000})
    h.acting_on("done", W0, 100)
    h.acting_on("left", W0, 100)
    h.final("done")
    assert ("ended", "done", "session_final") in kinds(h)
    h.advance(61)
    h.tick()
    assert ("expired", "left", "session_retention") in kinds(h)


# ---- the events agree with the counters, over random runs ------------------------------------
class RecordedMachine(test_properties.SchedulerMachine):
    @invariant()
    def recorded_steps_agree_with_the_counters(self) -> None:
        if not hasattr(self, "scheduler"):
            return
        scheduler = self.scheduler
        assert isinstance(scheduler, KeepsSteps)
        events = scheduler.steps  # never drained here: every step since the start
        by_kind = Counter(e.kind for e in events)
        pauses = Counter(e.reason == "idle" for e in events if e.kind is EventKind.PAUSED)
        c = scheduler.counters
        assert pauses[False] == c["pauses"] and pauses[True] == c["idle_pauses"]
        assert by_kind[EventKind.RESUMED] + by_kind[EventKind.FORCED] == c["resumes"]
        assert by_kind[EventKind.FORCED] == c["forced_resumes"]
        assert by_kind[EventKind.MOVED] == c["moves"]
        assert by_kind[EventKind.EXPIRED] == c["expired"]
        assert by_kind[EventKind.EVICTED] == c["evicted"]
        assert len(scheduler.limits) == c["rejected"]


def test_recorded_steps_agree_with_the_scheduler_counters_over_random_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(test_properties, "Scheduler", KeepsSteps)
    run_state_machine_as_test(RecordedMachine, settings=settings(
        max_examples=60, stateful_step_count=40, deadline=None))


# ---- rejection limits ------------------------------------------------------------------------
def test_every_rejection_of_the_scheduler_names_a_known_limit() -> None:
    source = (REPO / "dynamo_thunderagent" / "scheduler.py").read_text()
    limits = re.findall(r'_reject\(d, request_id, "([a-z_]+)"', source)
    assert len(limits) >= len(REJECT_LIMITS)  # each at least once
    assert set(limits) == set(REJECT_LIMITS)


def test_a_rejection_carries_the_limit_it_hit_and_a_message_naming_it() -> None:
    h = recording(max_tracked_requests=1)
    h.workers({W0: 1000})
    h.turn("a", 100)
    _, d = h.turn("b", 100)
    (reject,) = d.rejected
    assert reject.limit == "max_tracked_requests"
    assert "max_tracked_requests=1" in reject.reason


# ---- logging ---------------------------------------------------------------------------------
EVENT = ProgramEvent(EventKind.PAUSED, "p1", W0, 300, "pressure")


def test_every_event_has_the_same_fields_and_per_turn_ones_are_debug() -> None:
    with capture_logs() as logs:
        for kind in EventKind:
            log_event(ProgramEvent(kind, "p1", W0, 300, "r", 1.5))
    assert {frozenset(entry) for entry in logs} == {frozenset(
        {"event", "log_level", "program", "worker_id", "dp_rank", "tokens", "reason", "wait_s"})}
    debug = {entry["event"] for entry in logs if entry["log_level"] == "debug"}
    assert debug == {"program.admitted", "program.deferred", "program.ended"}
    assert {entry["log_level"] for entry in logs} == {"debug", "info"}


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_structlog")
def test_dyn_logging_jsonl_gives_one_json_object_per_event() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        configure_logging({"DYN_LOGGING_JSONL": "1", "DYN_LOG": "info"})
        log_event(EVENT)
        log_event(ProgramEvent(EventKind.ADMITTED, "p1", W0, 300, "sticky"))  # DEBUG: hidden
    lines = err.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "program.paused" and record["level"] == "info"
    assert (record["program"], record["worker_id"], record["dp_rank"]) == ("p1", 0, 0)
    assert (record["tokens"], record["reason"], record["wait_s"]) == (300, "pressure", 0.0)


@pytest.mark.usefixtures("restore_structlog")
def test_without_jsonl_events_are_console_lines_and_debug_shows_per_turn_ones() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        configure_logging({"DYN_LOG": "debug"})
        log_event(ProgramEvent(EventKind.ADMITTED, "p1", W0, 300, "sticky"))
    assert "program.admitted" in err.getvalue() and not err.getvalue().startswith("{")
