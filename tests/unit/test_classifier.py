"""The async classifier shell over the scheduler core, and the selector role."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_thunderagent.capacity import CapacityCard
from dynamo_thunderagent.classifier import (
    Aborted,
    AdmissionRejected,
    ClassifyRequest,
    Completed,
    Responding,
    Sent,
    ThunderAgentClassifier,
)
from dynamo_thunderagent.parameters import (
    EmptyParameters,
    ThunderAgentParameters,
    ThunderAgentSelectorParameters,
)
from dynamo_thunderagent.program import WorkerKey
from dynamo_thunderagent.selector import NoEligibleWorker, ThunderAgentSelector, WorkerLoad

W0, W1 = WorkerKey(0, 0), WorkerKey(1, 0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_classifier(**params: object) -> tuple[ThunderAgentClassifier, FakeClock]:
    clock = FakeClock()
    params.setdefault("buffer_per_program", 0)
    classifier = ThunderAgentClassifier(ThunderAgentParameters(**params), clock=clock)  # type: ignore[arg-type]
    classifier.update_workers({0, 1}, {W0: CapacityCard(1_000, 1), W1: CapacityCard(1_000, 1)})
    return classifier, clock


def turn(rid: str, session: str | None, tokens: int, final: bool = False) -> ClassifyRequest:
    return ClassifyRequest(request_id=rid, session_id=session, input_tokens=tokens,
                           session_final=final)


async def test_requests_without_a_session_pass_through() -> None:
    classifier, _ = make_classifier()
    admission = await classifier.classify(turn("r1", None, 10_000_000))
    assert admission.preferred is None and not admission.tracked
    assert classifier.scheduler.table.requests == {}


async def test_classify_admits_with_a_preferred_worker_and_follows_events() -> None:
    classifier, clock = make_classifier()
    admission = await classifier.classify(turn("r1", "s", 300))
    assert admission.preferred == W0 and admission.tracked
    classifier.on_event(Sent("r1", W1))
    classifier.on_event(Responding("r1"))
    clock.now = 2.0
    classifier.on_event(Completed("r1", 400))
    program = classifier.scheduler.table.programs["s"]
    assert program.worker == W1 and program.tokens == 400 and program.steps == 1


async def test_deferred_classify_waits_until_the_scheduler_releases_it() -> None:
    classifier, clock = make_classifier()
    for i, _w in enumerate((W0, W1)):
        await classifier.classify(turn(f"fill{i}", f"fill{i}", 900))
        classifier.on_event(Completed(f"fill{i}", 900))
    waiting = asyncio.create_task(classifier.classify(turn("r", "s", 500)))
    await asyncio.sleep(0)
    assert not waiting.done()
    classifier.update_workers({0, 1}, {W0: CapacityCard(1_000, 1), W1: CapacityCard(4_000, 1)})
    clock.now = 5.0
    classifier.tick()
    admission = await asyncio.wait_for(waiting, 1)
    assert admission.preferred == W1 and admission.waited_seconds == 5.0


async def test_cancelling_a_deferred_classify_rolls_its_program_back() -> None:
    classifier, _ = make_classifier()
    for i in range(2):
        await classifier.classify(turn(f"fill{i}", f"fill{i}", 900))
        classifier.on_event(Completed(f"fill{i}", 900))
    waiting = asyncio.create_task(classifier.classify(turn("r", "s", 500)))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert "s" not in classifier.scheduler.table.programs
    assert "r" not in classifier.scheduler.table.requests
    assert classifier.snapshot()["deferred_requests"] == 0


async def test_rejection_raises_with_the_reason_and_the_limit() -> None:
    classifier, _ = make_classifier(max_tracked_requests=1)
    await classifier.classify(turn("r1", "a", 10))
    with pytest.raises(AdmissionRejected, match="max_tracked_requests=1"):
        await classifier.classify(turn("r2", "b", 10))


async def test_a_deferred_turn_is_rejected_not_left_hanging_when_its_session_is_limited() -> None:
    classifier, _ = make_classifier()
    await classifier.classify(turn("r1", "a", 10))
    second = asyncio.create_task(classifier.classify(turn("r2", "a", 20)))
    await asyncio.sleep(0)
    classifier.on_event(Aborted("r1", "client went away"))
    admission = await asyncio.wait_for(second, 1)
    assert admission.preferred == W0


async def test_session_final_admission_carries_no_turn() -> None:
    classifier, _ = make_classifier()
    await classifier.classify(turn("r1", "a", 10))
    final = asyncio.create_task(classifier.classify(turn("f", "a", 0, final=True)))
    await asyncio.sleep(0)
    assert not final.done()
    classifier.on_event(Completed("r1", 30))
    admission = await asyncio.wait_for(final, 1)
    assert admission.session_final and "a" not in classifier.scheduler.table.programs


async def test_a_session_final_whose_client_left_still_ends_the_session() -> None:
    classifier, _ = make_classifier()
    await classifier.classify(turn("r1", "a", 10))
    final = asyncio.create_task(classifier.classify(turn("f", "a", 0, final=True)))
    await asyncio.sleep(0)
    final.cancel()  # its client went away while it waited behind the turn
    with pytest.raises(asyncio.CancelledError):
        await final
    table = classifier.scheduler.table
    assert table.programs["a"].final_request == "f"  # still queued behind the turn
    assert classifier.snapshot()["deferred_requests"] == 0  # nobody waits for an answer
    classifier.on_event(Completed("r1", 30))
    assert "a" not in table.programs and not table.requests  # ended with its turn


# ---- selector -------------------------------------------------------------------
def selector() -> ThunderAgentSelector:
    return ThunderAgentSelector(EmptyParameters())


def test_selector_honours_the_preferred_worker_when_eligible() -> None:
    loads = [WorkerLoad(W0, 10_000, 50), WorkerLoad(W1, 0, 0)]
    assert selector().select(loads, W0, 16) == W0


def test_selector_falls_back_to_the_least_loaded_eligible_worker() -> None:
    loads = [WorkerLoad(W0, 100, 10), WorkerLoad(W1, 300, 0)]  # 260 vs 300 tokens
    assert selector().select(loads, WorkerKey(9, 0), 16) == W0
    assert selector().select(loads, None, 16) == W0


def test_selector_breaks_ties_by_worker_and_rank() -> None:
    loads = [WorkerLoad(WorkerKey(2, 1), 5, 0), WorkerLoad(WorkerKey(2, 0), 5, 0),
             WorkerLoad(WorkerKey(3, 0), 5, 0)]
    assert selector().select(loads, None, 16) == WorkerKey(2, 0)
    assert selector().select(list(reversed(loads)), None, 16) == WorkerKey(2, 0)


def test_selector_with_a_load_slack_leaves_home_only_when_it_is_that_much_busier() -> None:
    sticky = ThunderAgentSelector(ThunderAgentSelectorParameters(preferred_load_slack=0.5))
    assert not sticky.takes_live_preferred  # it must see the loads of every turn
    # 1,500 against 1,000 tokens: within the slack, the program stays where its cache is
    assert sticky.select([WorkerLoad(W0, 1_500, 0), WorkerLoad(W1, 1_000, 0)], W0, 16) == W0
    # 1,516 against 1,000: more than 1.5x, the turn goes to the cheaper rank
    assert sticky.select([WorkerLoad(W0, 1_500, 1), WorkerLoad(W1, 1_000, 0)], W0, 16) == W1
    # the preferred rank is the cheapest: stays (no slack is needed)
    assert sticky.select([WorkerLoad(W0, 0, 1), WorkerLoad(W1, 0, 2)], W0, 16) == W0
    # a preferred rank that is not a candidate: the least loaded, as without the slack
    assert sticky.select([WorkerLoad(W1, 5, 0)], W0, 16) == W1
    # an idle rank against any load at home: the home is more than 1.5x of nothing
    assert sticky.select([WorkerLoad(W0, 1, 0), WorkerLoad(W1, 0, 0)], W0, 16) == W1
    assert sticky.select([WorkerLoad(W0, 0, 0), WorkerLoad(W1, 0, 0)], W0, 16) == W0
    # without the parameter, a live preferred rank is always honoured
    assert selector().takes_live_preferred
    assert selector().select([WorkerLoad(W0, 9_000, 0), WorkerLoad(W1, 0, 0)], W0, 16) == W0


def test_selector_without_candidates_says_so() -> None:
    with pytest.raises(NoEligibleWorker):
        selector().select([], W0, 16)
