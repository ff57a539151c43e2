"""Shared helpers for end-to-end tests: policies, the router's /state, chat turns.

Everything here talks to real processes started by
:class:`~dynamo_thunderagent.stack.launcher.LocalStack`. Waits poll with
deadlines (never fixed sleeps) because a 2-core CI box can be slow to start,
schedule or answer; a deadline failure reports the last state seen.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, SESSION_HEADER

REPO_ROOT = Path(__file__).resolve().parents[2]
# Every end-to-end module's marks: real processes, skipped where Dynamo or the OpenAI client
# is not installed.
E2E_MARKS = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("openai") is None,
        reason="needs ai-dynamo 1.6.1 and openai installed",
    ),
]


def _etcd_missing() -> str | None:
    """Why the stack cannot run etcd discovery here (etcd or nats-server missing), or None."""
    try:
        from dynamo_thunderagent.stack.discovery import MissingBinaries, find_binaries
    except ImportError as exc:  # the package itself is broken: let the tests say so
        return f"cannot import the stack: {exc}"
    try:
        find_binaries(sys.executable)
    except MissingBinaries as exc:
        return str(exc)
    return None


ETCD_MISSING = _etcd_missing()
# Skips a test (or one parameter of it) that needs etcd discovery where it cannot run here.
NEEDS_ETCD = pytest.mark.skipif(ETCD_MISSING is not None, reason=f"etcd discovery: {ETCD_MISSING}")
# The discoveries a stack test runs on: the file store, and etcd + NATS as a deployment runs.
DISCOVERIES = ["file", pytest.param("etcd", marks=NEEDS_ETCD)]
MODEL = "tiny"
SESSION = SESSION_HEADER
SESSION_FINAL = FINAL_HEADER
# Ask the frontend to pass the chunks' engine_data through: our router puts the
# serving worker/rank there (nvext.worker_id names the router itself).
ENGINE_DATA = {"nvext": {"extra_fields": ["engine_data"]}}

State = dict[str, Any]


def write_policy(path: Path, **parameters: Any) -> Path:
    """A ThunderAgent router-policy YAML with these classifier parameters."""
    lines = ["request_classifier:", "  type: thunderagent"]
    if parameters:
        lines.append("  parameters:")
        lines += [f"    {key}: {json.dumps(value)}" for key, value in parameters.items()]
    lines += [
        "worker_selection:",
        "  instances:",
        "    - name: ta",
        "      type: thunderagent",
        "  aggregated: ta",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def get_state(stack: Any) -> State:
    """The router's GET /state document."""
    assert stack.state_url, "this stack has no state endpoint (arm 'ours' only)"
    with urllib.request.urlopen(stack.state_url, timeout=10) as response:
        state: State = json.loads(response.read())
    return state


def wait_for_state(
    stack: Any, predicate: Callable[[State], bool], what: str, timeout: float = 30.0
) -> State:
    """Poll /state until ``predicate`` holds; fail with the last state after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: State | None = None
    while True:
        try:
            last = get_state(stack)
            if predicate(last):
                return last
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last /state:\n"
                        f"{json.dumps(last, indent=1)}")
        time.sleep(0.1)


async def async_wait_for_state(
    stack: Any, predicate: Callable[[State], bool], what: str, timeout: float = 30.0
) -> State:
    """:func:`wait_for_state` for async tests: polls in a thread, keeps the loop running."""
    return await asyncio.to_thread(wait_for_state, stack, predicate, what, timeout)


def programs(state: State) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = state["scheduler"]["programs"]
    return result


def counters(state: State) -> dict[str, int]:
    result: dict[str, int] = state["scheduler"]["counters"]
    return result


def worker_of(program: dict[str, Any]) -> int | None:
    """A /state program's worker id (its ``"worker/rank"`` string), or None."""
    worker = program.get("worker")
    return None if worker is None else int(str(worker).split("/")[0])


def idle(state: State) -> bool:
    """No program, no tracked request, nothing forwarded right now."""
    return (not programs(state) and state["scheduler"]["tracked_requests"] == 0
            and state["in_flight"] == 0)


def wait_until_ready(stack: Any, num_workers: int, timeout: float = 60.0) -> State:
    """The router sees every worker live and knows each one's capacity.

    The launcher returns once the frontend lists the model; the router's own
    worker watch may still be a refresh behind.
    """
    return wait_for_state(
        stack,
        lambda s: len(s["live_workers"]) == num_workers
        and sum(1 for r in s["scheduler"]["ranks"].values() if r["capacity_tokens"]) == num_workers,
        f"the router to see {num_workers} live workers with capacity",
        timeout,
    )


def serving_worker(response: Any) -> int:
    """The worker id our router reported for a (non-streamed) chat response."""
    nvext = (response.model_extra or {}).get("nvext") or {}
    thunderagent = (nvext.get("engine_data") or {}).get("thunderagent")
    assert thunderagent, f"no engine_data.thunderagent in the response: {nvext!r}"
    return int(thunderagent["worker_id"])


def chat(
    client: Any,
    messages: list[dict[str, str]],
    *,
    session: str | None,
    max_tokens: int = 8,
    final: bool = False,
    **kwargs: Any,
) -> Any:
    """One chat turn through the sync OpenAI client, with the session headers."""
    headers = {} if session is None else {SESSION: session}
    if final:
        headers[SESSION_FINAL] = "true"
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, extra_headers=headers,
        extra_body=ENGINE_DATA, **kwargs,
    )


def end_session(client: Any, session: str) -> None:
    """Send the minimal session-final request that releases the session's program."""
    chat(client, [{"role": "user", "content": "done"}], session=session, max_tokens=1, final=True)


def turn_text(session: str, turn: int, words: int = 12) -> str:
    """A user message that makes contexts grow turn by turn (tool output, say)."""
    return f"turn {turn} of {session}: " + " ".join(f"line{turn}-{i}" for i in range(words))


def group_gone(pgid: int) -> bool:
    """True once no process of group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def run_agents(stack: Any, prefix: str, agents: int, turns: int,
                  gate: asyncio.Event | None = None, at_gate: list[str] | None = None) -> None:
    """``agents`` agents of ``turns`` turns each (a 0.3 s tool between turns, the session-final
    at the end); with ``gate``, each waits for it halfway and adds its session to ``at_gate``."""
    import openai

    client = openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=120,
                                max_retries=0)

    async def agent(index: int) -> None:
        session = f"{prefix}-{index}"
        messages = [{"role": "system", "content": f"you are agent {index}"}]
        for turn in range(turns):
            if gate is not None and turn == turns // 2:
                assert at_gate is not None
                at_gate.append(session)
                await gate.wait()
            messages.append({"role": "user", "content": turn_text(session, turn, words=6)})
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=32, extra_headers={SESSION: session})
            messages.append({"role": "assistant",
                             "content": reply.choices[0].message.content or ""})
            await asyncio.sleep(0.3)  # the tool runs
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "done"}], max_tokens=1,
            extra_headers={SESSION: session, SESSION_FINAL: "true"})

    try:
        await asyncio.wait_for(asyncio.gather(*(agent(i) for i in range(agents))), 240)
    finally:
        await client.close()
