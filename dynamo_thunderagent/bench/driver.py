"""Closed-loop agent driver: N agents talk to an OpenAI-compatible endpoint until a deadline.

Each agent runs one :class:`~dynamo_thunderagent.bench.workload.AgentPlan`: send a chat turn
with its whole history and ``X-Dynamo-Session-ID``, receive the reply, sleep the tool time,
append the tool output, repeat; after the last turn it sends one minimal request with
``X-Dynamo-Session-Final: true`` so the scheduler can release the program. A finished agent
is replaced by the next plan of the stream at once, so N agents are always in flight: the
session-final is bookkeeping and nobody waits for its answer, which ours and the Python port
give in the router while stock and the builtin queue the request on a worker (a slot that
waited for it would idle longer under those arms, a bias in ours' favour); the run collects
the answers at its end. So the next agent's first turn may reach the router before the last
one's final does: for milliseconds the router still counts the finished program.

Contract of a run (:func:`run_closed_loop`):

* Turns are launched only before ``start + window_s``. After that, turns in flight may
  finish until ``start + window_s + drain_s``; what is still running then is cancelled and
  recorded as ``cancelled`` (not an error: the driver gave up, the server did not fail).
* Every request has a client timeout (``request_timeout_s``) and the SDK never retries, so
  the run ends by ``window_s + drain_s`` plus about 20 s at most (5 s for cancelled slots to
  unwind, 5 s for background loops, ``FINAL_TIMEOUT_S`` for the session-finals and
  releases still outstanding, which are then cancelled), whatever the server does.
* Prompts are made of whole words that the tokenizer maps to exactly one token each, so the
  prompt of turn ``k`` has the planned number of tokens (the chat template's own tokens are
  measured once per run and subtracted). The content of every message is a pure function of
  the session id and the message's position, and replies are replaced by synthetic text of
  the generated length: turn ``k``'s prompt extends turn ``k-1``'s token for token, which is
  what prefix caching needs. (The mocker emits random ids; its text would be just as
  stable, but synthetic replies keep runs reproducible across arms.) How: ``bench/prompts.py``.
* A compaction turn's prompt shares only the system prompt with the previous one.
* A fan-out turn's subagents run concurrently once the turn's reply is in, each with its own
  session id, ``X-Dynamo-Parent-Session-ID: <parent>`` and a session-final (or release) of
  its own; the parent's tool is over when the last of them has ended, plus the turn's
  ``tool_seconds`` (not their session-finals, which nobody waits for). Subagents run inside
  the parent's slot: N counts parents, and their records carry the parent's agent number and
  session id.
* ``background`` (optional): other tenants' chat traffic beside the agents, sessionless
  requests of unique prompts sent back to back by ``concurrency`` loops from the start until
  the window closes. They are not turns (not in ``records``); their counts and latency are
  in ``RunResult.background``. They are no program's, so they show what a program-aware
  router does when part of its workers' KV is taken by requests outside its programs
  (``sessionless_kv``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dynamo_thunderagent.bench.prompts import (
    History,
    PromptText,
    TemplateOverhead,
    measure_template_overhead,
)
from dynamo_thunderagent.bench.records import RecordKind, RunResult, TurnRecord
from dynamo_thunderagent.bench.workload import AgentPlan, Background
from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, PARENT_HEADER, SESSION_HEADER
from dynamo_thunderagent.quantile import percentile

FINAL_TIMEOUT_S = 10.0  # the client's timeout of a session-final, and the run's wait for them


@dataclass(frozen=True)
class Progress:
    """A snapshot passed to the progress callback."""

    elapsed_s: float
    turns_ok: int
    errors: int
    in_flight: int
    agents_started: int
    agents_completed: int


def _usage_fields(reply: Any) -> tuple[int | None, int | None, int | None]:
    usage = getattr(reply, "usage", None)
    if usage is None:
        return None, None, None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return usage.prompt_tokens, cached, usage.completion_tokens


class _Run:
    """State shared by the agent slots of one run."""

    def __init__(
        self,
        client: Any,
        model: str,
        plans: Iterator[AgentPlan],
        text: PromptText,
        overhead: TemplateOverhead,
        *,
        window_s: float,
        drain_s: float,
        request_timeout_s: float,
        job: str,
        release_unfinished: bool,
    ) -> None:
        self.client = client
        self.model = model
        self.plans = plans
        self.text = text
        self.overhead = overhead
        self.window_s = window_s
        self.drain_s = drain_s
        self.request_timeout_s = request_timeout_s
        self.job = job
        self.release_unfinished = release_unfinished
        self.t0 = time.monotonic()
        self.records: list[TurnRecord] = []
        self.in_flight: dict[int, TurnRecord] = {}
        self.agents_started = 0
        self.agents_completed = 0
        self._next_request = 0
        self.background_latencies: list[float] = []
        self.background_errors = 0
        self.finals: set[asyncio.Task[None]] = set()  # session-finals not answered yet

    def now(self) -> float:
        return time.monotonic() - self.t0

    def window_open(self) -> bool:
        return self.now() < self.window_s

    def next_plan(self) -> tuple[int, AgentPlan] | None:
        plan = next(self.plans, None)
        if plan is None:
            return None
        self.agents_started += 1
        return self.agents_started - 1, plan

    async def request(
        self,
        record: TurnRecord,
        messages: list[dict[str, str]],
        max_tokens: int,
        headers: dict[str, str],
        timeout_s: float,
    ) -> None:
        """Send one chat request and fill ``record``; never raises except on cancellation."""
        key = self._next_request
        self._next_request += 1
        self.in_flight[key] = record
        self.records.append(record)
        try:
            reply = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=max_tokens,
                extra_headers=headers,
                timeout=timeout_s,
            )
            record.prompt_tokens, record.cached_tokens, record.completion_tokens = _usage_fields(
                reply
            )
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        except Exception as error:  # every failure is data: record it, keep the loop going
            record.error_type = type(error).__name__
            record.error = f"{record.error_type}: {error}"[:500]
        finally:
            record.end = self.now()
            self.in_flight.pop(key, None)

    async def session_final(
        self, agent: int, plan: AgentPlan, kind: RecordKind, parent: str | None = None
    ) -> None:
        record = TurnRecord(kind, agent, plan.session_id, len(plan.turns), self.now(), 0.0, 0, 1,
                            parent_session_id=parent, joined=plan.joined_at > 0)  # fmt: skip
        await self.request(
            record,
            [{"role": "user", "content": "done"}],
            1,
            {**_session_headers(plan.session_id, parent), FINAL_HEADER: "true"},
            min(self.request_timeout_s, FINAL_TIMEOUT_S),
        )

    def send_final(
        self, agent: int, plan: AgentPlan, kind: RecordKind, parent: str | None = None
    ) -> None:
        """Send the session-final (or release) without waiting for its answer; the run
        collects what is outstanding at its end (:meth:`settle_finals`)."""
        task = asyncio.create_task(self.session_final(agent, plan, kind, parent))
        self.finals.add(task)
        task.add_done_callback(self.finals.discard)

    def release_open_sessions(self) -> None:
        """Send a release for every session that sent turns and neither a session-final
        nor a release: the agents (and subagents, under their parent) of slots the run
        cancelled, a parent waiting on its subagents included."""
        ended = {r.session_id for r in self.records if r.kind != "turn"}
        open_sessions = {r.session_id: r for r in self.records
                         if r.kind == "turn" and r.session_id not in ended}
        for r in open_sessions.values():
            self.send_final(r.agent, _plan_stub(r.session_id), "release", r.parent_session_id)

    async def settle_finals(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the session-finals still outstanding; cancel the rest
        (their records say ``cancelled``)."""
        if not self.finals:
            return
        _, late = await asyncio.wait(set(self.finals), timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)

    async def run_agent(self, agent: int, plan: AgentPlan, parent: str | None = None) -> bool:
        """Run one plan until it ends, fails, or the window closes; True if it finished."""
        history = History(plan, self.text, self.overhead, self.job)
        for k, turn in enumerate(plan.turns):
            if not self.window_open():
                return False
            history.before_turn(k)
            record = TurnRecord(
                "turn", agent, plan.session_id, k, self.now(), 0.0,
                plan.prompt_tokens(k), turn.output_tokens,
                parent_session_id=parent, compaction=k > 0 and turn.compaction,
                joined=plan.joined_at > 0,
            )  # fmt: skip
            await self.request(
                record,
                list(history.messages),
                turn.output_tokens,
                _session_headers(plan.session_id, parent),
                self.request_timeout_s,
            )
            if record.error is not None:
                return False
            if turn.subagents:
                # The parent's tool is its subagents: run them all, wait for the last.
                ended = await asyncio.gather(
                    *(self.run_subagent(agent, sub, plan.session_id) for sub in turn.subagents)
                )
                if not all(ended):
                    return False
            if k < len(plan.turns) - 1:
                # The tool runs; the window may close meanwhile (then the loop stops).
                remaining = max(0.0, self.window_s - self.now())
                await asyncio.sleep(min(turn.tool_seconds, remaining))
        return True

    async def run_subagent(self, agent: int, plan: AgentPlan, parent: str) -> bool:
        """Run a subagent to its end, then send its session-final (or release)."""
        finished = await self.run_agent(agent, plan, parent)
        if finished:
            self.send_final(agent, plan, "final", parent)
        elif self.release_unfinished:
            self.send_final(agent, plan, "release", parent)
        return finished

    async def slot(self) -> None:
        """One of the N agent slots: run plans back to back while the window is open."""
        while self.window_open():
            picked = self.next_plan()
            if picked is None:
                return
            agent, plan = picked
            finished = False
            try:
                finished = await self.run_agent(agent, plan)
            finally:
                if finished:
                    self.agents_completed += 1
            if finished:
                self.send_final(agent, plan, "final")
            elif self.release_unfinished:
                self.send_final(agent, plan, "release")

    async def background(self, loop: int, spec: Background) -> None:
        """One loop of background traffic: sessionless requests until the window closes."""
        sent = 0
        while self.window_open():
            content = self.text.text(spec.prompt_tokens, f"{self.job}:background:{loop}:{sent}")
            sent += 1
            start = self.now()
            try:
                await self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": content}],
                    max_tokens=spec.output_tokens,
                    timeout=self.request_timeout_s,
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # counted; the loop goes on like the agents do, after a
                self.background_errors += 1  # breath, so a stack refusing fast is not flooded
                await asyncio.sleep(0.1)
            else:
                self.background_latencies.append(self.now() - start)

    def progress(self) -> Progress:
        turns_ok = sum(1 for r in self.records if r.kind == "turn" and r.end and r.ok)
        errors = sum(1 for r in self.records if r.error is not None)
        return Progress(
            elapsed_s=self.now(),
            turns_ok=turns_ok,
            errors=errors,
            in_flight=len(self.in_flight),
            agents_started=self.agents_started,
            agents_completed=self.agents_completed,
        )


async def run_closed_loop(
    url: str,
    plans: Iterator[AgentPlan],
    *,
    agents: int,
    window_s: float,
    drain_s: float = 15.0,
    request_timeout_s: float = 60.0,
    model: str = "tiny",
    text: PromptText | None = None,
    overhead: TemplateOverhead | None = None,
    job: str = "job",
    release_unfinished: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 10.0,
    background: Background | None = None,
) -> RunResult:
    """Run ``agents`` closed-loop agents from ``plans`` against ``url`` (an OpenAI base URL).

    Returns after the window and a drain of at most ``drain_s`` (see the module docstring).
    ``overhead`` None: measured with three small requests before the window starts.
    ``release_unfinished``: send a session-final request for agents the window cut short,
    so a long-lived deployment does not keep their programs until retention expires.
    """
    if agents < 1 or window_s <= 0 or drain_s < 0 or request_timeout_s <= 0:
        raise ValueError("need agents >= 1, window_s > 0, drain_s >= 0, request_timeout_s > 0")
    from openai import AsyncOpenAI

    text = text or PromptText()
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=request_timeout_s)
    try:
        if overhead is None:
            overhead = await measure_template_overhead(client, model, text, request_timeout_s)
        run = _Run(
            client, model, plans, text, overhead,
            window_s=window_s, drain_s=drain_s, request_timeout_s=request_timeout_s,
            job=job, release_unfinished=release_unfinished,
        )  # fmt: skip
        tasks = [asyncio.create_task(run.slot()) for _ in range(agents)]
        others = ([asyncio.create_task(run.background(k, background))
                   for k in range(background.concurrency)] if background else [])
        reporter = None
        if on_progress is not None:
            reporter = asyncio.create_task(_report(run, on_progress, progress_interval_s))
        _, pending = await asyncio.wait(tasks, timeout=window_s + drain_s)
        for task in [*pending, *others]:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=5.0)
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        # Slots cancelled mid-turn (or mid-fan-out) leave their agents unreleased; release
        # them, and wait for the session-finals still outstanding, bounded.
        if release_unfinished:
            run.release_open_sessions()
        await run.settle_finals(FINAL_TIMEOUT_S)
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        for record in run.records:  # a request cut off before it set its end time
            if record.end == 0.0:
                record.end = run.now()
                record.cancelled = record.error is None
        return RunResult(
            records=run.records,
            agents=agents,
            window_s=window_s,
            drain_s=drain_s,
            elapsed_s=run.now(),
            agents_started=run.agents_started,
            agents_completed=run.agents_completed,
            template_overhead={"base": overhead.base, **overhead.per_message},
            background=_background_figures(run, background),
        )
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def _session_headers(session_id: str, parent: str | None) -> dict[str, str]:
    headers = {SESSION_HEADER: session_id}
    if parent is not None:
        headers[PARENT_HEADER] = parent
    return headers


def _plan_stub(session_id: str) -> AgentPlan:
    """A plan that only carries a session id (for release requests)."""
    return AgentPlan(session_id, 0, ())


async def _report(run: _Run, on_progress: Callable[[Progress], None], interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        on_progress(run.progress())


def _background_figures(run: _Run, spec: Background | None) -> dict[str, Any]:
    if spec is None:
        return {}
    done = run.background_latencies
    p50 = percentile(done, 0.5)
    return {
        "concurrency": spec.concurrency, "prompt_tokens": spec.prompt_tokens,
        "output_tokens": spec.output_tokens, "completed": len(done),
        "errors": run.background_errors,
        "latency_p50_s": None if p50 is None else round(p50, 3),
    }  # fmt: skip
