"""The closed-loop driver's slots: a session-final is sent, not waited for."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dynamo_thunderagent.bench.driver import _Run
from dynamo_thunderagent.bench.prompts import PromptText, TemplateOverhead
from dynamo_thunderagent.bench.workload import AgentPlan, TurnPlan
from dynamo_thunderagent.dynamo.translate import FINAL_HEADER


class _SlowFinals:
    """Turns are answered at once; a session-final takes ``final_s`` (a router that queues
    it on a busy worker, as stock does)."""

    def __init__(self, final_s: float) -> None:
        self.final_s = final_s

    async def create(self, **kwargs: Any) -> Any:
        if kwargs["extra_headers"].get(FINAL_HEADER) == "true":
            await asyncio.sleep(self.final_s)
        else:
            await asyncio.sleep(0)
        usage = SimpleNamespace(prompt_tokens=10, completion_tokens=kwargs["max_tokens"],
                                prompt_tokens_details=SimpleNamespace(cached_tokens=0))
        return SimpleNamespace(usage=usage)


def _run(final_s: float, plans: list[AgentPlan], window_s: float) -> _Run:
    client = SimpleNamespace(chat=SimpleNamespace(completions=_SlowFinals(final_s)))
    return _Run(client, "m", iter(plans), PromptText(), TemplateOverhead(), window_s=window_s,
                drain_s=0.0, request_timeout_s=30.0, job="job", release_unfinished=True)


def _plan(name: str) -> AgentPlan:
    return AgentPlan(name, 8, (TurnPlan(4, 2, 0.0),))


def test_a_slot_starts_its_next_agent_before_the_last_ones_final_is_answered() -> None:
    async def main() -> _Run:
        run = _run(0.5, [_plan("a"), _plan("b")], window_s=5.0)
        await run.slot()
        await run.settle_finals(5.0)
        return run

    run = asyncio.run(main())
    by_session = {(r.session_id, r.kind): r for r in run.records}
    assert by_session[("b", "turn")].start < by_session[("a", "final")].end
    assert by_session[("a", "final")].ok and by_session[("b", "final")].ok
    assert run.agents_completed == 2 and not run.finals


def test_finals_still_unanswered_when_the_run_settles_are_cancelled_not_left_running() -> None:
    async def main() -> _Run:
        run = _run(30.0, [_plan("a")], window_s=5.0)
        await run.slot()
        await run.settle_finals(0.05)
        return run

    run = asyncio.run(main())
    final = next(r for r in run.records if r.kind == "final")
    assert final.cancelled and final.end > 0 and not run.finals


def test_at_the_end_every_session_with_turns_and_no_final_gets_a_release() -> None:
    from dynamo_thunderagent.bench.records import TurnRecord
    from dynamo_thunderagent.dynamo.translate import PARENT_HEADER, SESSION_HEADER

    class _Calls(_SlowFinals):
        def __init__(self) -> None:
            super().__init__(0.0)
            self.headers: list[dict[str, str]] = []

        async def create(self, **kwargs: Any) -> Any:
            self.headers.append(kwargs["extra_headers"])
            return await super().create(**kwargs)

    calls = _Calls()

    async def main() -> None:
        client = SimpleNamespace(chat=SimpleNamespace(completions=calls))
        run = _Run(client, "m", iter(()), PromptText(), TemplateOverhead(), window_s=1.0,
                   drain_s=0.0, request_timeout_s=5.0, job="job", release_unfinished=True)
        run.records += [
            TurnRecord("turn", 0, "done", 0, 0.0, 1.0, 8, 2),
            TurnRecord("final", 0, "done", 1, 1.0, 1.1, 0, 1),
            # A parent waiting on its subagents when its slot was cancelled: its own turn
            # ended, the subagent's was cut off.
            TurnRecord("turn", 1, "parent", 0, 0.0, 1.0, 8, 2),
            TurnRecord("turn", 1, "parent-sub0", 0, 1.0, 2.0, 8, 2,
                       parent_session_id="parent", cancelled=True),
        ]
        run.release_open_sessions()
        await run.settle_finals(5.0)

    asyncio.run(main())
    assert {h[SESSION_HEADER]: h.get(PARENT_HEADER) for h in calls.headers} == {
        "parent": None, "parent-sub0": "parent"}
    assert all(h[FINAL_HEADER] == "true" for h in calls.headers)
