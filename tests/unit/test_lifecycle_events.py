"""Program lifecycle notifications: from Decisions to messages a harness receives."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.classifier import ClassifyRequest, Completed, Sent, ThunderAgentClassifier
from dynamo_thunderagent.decisions import Decisions
from dynamo_thunderagent.dynamo.notify import (
    EventPublisher,
    LifecycleNotifier,
    lifecycle_events,
    table_worker_of,
)
from dynamo_thunderagent.events import LifecycleEvent, Subscriber
from dynamo_thunderagent.parameters import ThunderAgentParameters
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.scheduler import Scheduler
from dynamo_thunderagent.stack.process import free_port

W0, W1 = WorkerKey(7, 0), WorkerKey(8, 1)


def test_decisions_become_paused_resuming_ended_and_expired_events() -> None:
    d = Decisions(paused=["p"], resumed=[("r", W1), ("f", W0)], forced=["f"], removed=["e"],
                  expired=["x"], marked=["m"])
    events = lifecycle_events(d, lambda s: W0 if s == "p" else None, at=5.0)
    assert [(e.event, e.session_id, e.worker_id, e.dp_rank, e.reason) for e in events] == [
        ("paused", "p", 7, 0, "no room"),
        ("ended", "e", None, None, "removed"),
        ("expired", "x", None, None, "idle past session_retention_seconds"),
        ("resuming", "r", 8, 1, "room"),
        ("resuming", "f", 7, 0, "forced"),
    ]


def test_a_pause_or_an_end_says_why_as_the_scheduler_decided_it() -> None:
    scheduler = Scheduler(ThunderAgentParameters(buffer_per_program=0,
                                                 acting_decay_tau_seconds=1e9))
    scheduler.set_workers(frozenset({7}), {W0: CapacityCard(2_000, 1)})
    for rid, session, tokens in (("a1", "small", 600), ("b1", "big", 1_200)):
        scheduler.submit(rid, session, tokens, 0.0)
        scheduler.sent(rid, W0, 0.0)
        scheduler.completed(rid, tokens, 1.0)
    scheduler.set_workers(frozenset({7}), {W0: CapacityCard(1_500, 1)})  # over the threshold
    d = scheduler.tick(2.0)
    events = lifecycle_events(d, table_worker_of(scheduler.table.programs), at=2.0)
    assert [(e.event, e.session_id, e.reason) for e in events] == [
        ("paused", "small", "pressure")]
    d = scheduler.submit("b-final", "big", 0, 3.0, session_final=True)
    events = lifecycle_events(d, table_worker_of(scheduler.table.programs), at=3.0)
    assert ("ended", "big", "session final") in [(e.event, e.session_id, e.reason)
                                                  for e in events]


def test_an_event_survives_its_json_and_bad_messages_say_why() -> None:
    event = LifecycleEvent("resuming", "agent-1", 7, 0, 3.5, "room", 4)
    assert LifecycleEvent.from_json(event.to_json()) == event
    with pytest.raises(ValueError, match="kind must be one of"):
        LifecycleEvent.from_json(b'{"event": "exploded", "session_id": "a"}')
    with pytest.raises(ValueError, match="not JSON"):
        LifecycleEvent.from_json(b"{")


class _Sent:
    """Stands in for an EventPublisher: keeps what it was given, or drops it while full."""

    url = "tcp://127.0.0.1:1"

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []
        self.full = False
        self.dropped = 0

    def publish(self, event: LifecycleEvent) -> bool:
        if self.full:
            self.dropped += 1
            return False
        self.events.append(event)
        return True


def test_notifier_numbers_events_and_keeps_recent_decisions() -> None:
    sent = _Sent()
    notifier = LifecycleNotifier(lambda s: W0, cast(EventPublisher, sent), recent=3,
                                 clock=lambda: 9.0)
    notifier(Decisions(paused=["a", "b"], marked=["c"]))
    notifier(Decisions(resumed=[("a", W1)]))
    state = notifier.state()
    assert state["published"] == {"paused": 2, "resuming": 1, "ended": 0, "expired": 0}
    assert [(e.event, e.seq) for e in sent.events] == [
        ("paused", 1), ("paused", 2), ("resuming", 3)]
    assert [r["decision"] for r in state["recent_decisions"]] == ["paused", "paused", "resuming"]
    assert state["recent_decisions"][-1]["worker"] == "8/1"
    assert notifier.seq == 3


def test_an_event_dropped_on_a_full_queue_is_not_counted_as_published() -> None:
    sent = _Sent()
    notifier = LifecycleNotifier(lambda s: W0, cast(EventPublisher, sent))
    notifier(Decisions(paused=["a"]))
    sent.full = True
    notifier(Decisions(paused=["b"], resumed=[("a", W1)]))
    state = notifier.state()
    assert state["published"] == {"paused": 1, "resuming": 0, "ended": 0, "expired": 0}
    assert state["dropped"] == 2
    assert len(state["recent_decisions"]) == 3


def test_without_an_events_port_nothing_counts_as_published() -> None:
    # /state's lifecycle.published and lifecycle_events_total count what went out on
    # --events-port; without one the decisions are still kept for `top`.
    notifier = LifecycleNotifier(lambda s: W0, clock=lambda: 9.0)
    notifier(Decisions(paused=["a", "b"], resumed=[("c", W1)]))
    state = notifier.state()
    assert state["published"] == {"paused": 0, "resuming": 0, "ended": 0, "expired": 0}
    assert state["events_url"] is None and state["dropped"] == 0
    assert [r["decision"] for r in state["recent_decisions"]] == ["paused", "paused", "resuming"]


def test_a_subscriber_receives_what_the_router_publishes() -> None:
    publisher = EventPublisher("127.0.0.1", free_port())
    notifier = LifecycleNotifier(lambda s: W0, publisher)
    try:
        with Subscriber(publisher.url) as subscriber:
            # A SUB socket joins asynchronously: publish until the first message arrives.
            deadline = time.monotonic() + 10
            first = None
            while first is None and time.monotonic() < deadline:
                notifier(Decisions(paused=["warmup"]))
                first = subscriber.receive(timeout=0.1)
            assert first is not None and first.event == "paused"
            notifier(Decisions(resumed=[("agent", W1)], removed=["gone"]))
            received = []
            while (event := subscriber.receive(timeout=2)) is not None:
                received.append(event)
                if event.event == "resuming":
                    break
            resumed = [e for e in received if e.event == "resuming"]
            assert [(e.session_id, e.worker_id, e.dp_rank) for e in resumed] == [("agent", 8, 1)]
            ended = next(e for e in received if e.event == "ended")
            assert ended.session_id == "gone" and resumed[0].seq == ended.seq + 1
    finally:
        publisher.close()


def test_only_the_kinds_asked_for_are_received() -> None:
    with pytest.raises(ValueError, match="unknown lifecycle event kinds"):
        Subscriber("tcp://127.0.0.1:1", kinds=["paused", "born"])


def test_the_classifier_hands_every_decision_to_its_listeners() -> None:
    classifier = ThunderAgentClassifier(
        ThunderAgentParameters(buffer_per_program=0, resume_on_events=True), clock=lambda: 1.0)
    seen: list[Decisions] = []
    classifier.decision_listeners.append(seen.append)
    notifier = LifecycleNotifier(table_worker_of(classifier.scheduler.table.programs))
    classifier.decision_listeners.append(notifier)
    classifier.update_workers([7], {W0: CapacityCard(total_kv_blocks=100, block_size=1)})

    async def run() -> None:
        await classifier.classify(ClassifyRequest("r1", "big", 90))
        classifier.on_event(Sent("r1", W0))
        classifier.on_event(Completed("r1", 90))
        classifier.tick()  # 0.90 > 0.95? no; still resident
        waiter = asyncio.ensure_future(classifier.classify(ClassifyRequest("r2", "late", 50)))
        await asyncio.sleep(0)
        assert not waiter.done()  # no room: paused at admission, its turn waits
        await classifier.classify(ClassifyRequest("f1", "big", 0, session_final=True))
        admission = await asyncio.wait_for(waiter, 5)  # the session's end freed the room
        assert admission.preferred == W0

    asyncio.run(run())
    kinds = [(r["decision"], r["session_id"]) for r in notifier.state()["recent_decisions"]]
    assert kinds == [("paused", "late"), ("ended", "big"), ("resuming", "late")]
    assert seen and all(d.changed for d in seen)
