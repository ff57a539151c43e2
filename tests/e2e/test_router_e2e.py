"""End-to-end behaviour of our router component between the real Dynamo frontend and mockers.

Every test starts real processes (``LocalStack``: ZMQ broker, mocker workers,
``dynamo-thunderagent serve``, ``python -m dynamo.frontend``) and talks to
them with the official ``openai`` client. Tests that only need a healthy
two-worker stack share one (module scope); tests that kill a worker, need
tiny KV capacity or another policy start their own.

The shared stack and the pressure and worker-death tests run twice: on file
discovery, and on etcd + NATS as the README's deployment runs (the ``[etcd]``
cases, skipped where etcd or nats-server is not installed).

The router's GET /state is the observation point: the program table, tracked
requests, pause/resume counters and what the router has forwarded. Waits poll
it with deadlines; no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# This folder's conftest.py: pytest puts a test folder without __init__.py on sys.path.
from conftest import (
    DISCOVERIES,
    E2E_MARKS,
    ENGINE_DATA,
    MODEL,
    REPO_ROOT,
    SESSION,
    SESSION_FINAL,
    async_wait_for_state,
    chat,
    counters,
    end_session,
    get_state,
    idle,
    programs,
    serving_worker,
    turn_text,
    wait_for_state,
    wait_until_ready,
    worker_of,
    write_policy,
)

pytestmark = E2E_MARKS

# At speedup 1 the mocker decodes roughly one token per 10 ms here; turns that
# must stay in flight while a test looks at them generate a few hundred tokens.
LONG_TURN_TOKENS = 300


def _stack(run_dir: Path, policy: Path | None, **overrides: Any) -> Any:
    from dynamo_thunderagent.stack.launcher import LocalStack

    config: dict[str, Any] = {
        "arm": "ours", "num_workers": 2, "num_gpu_blocks": 256, "block_size": 16,
        "speedup_ratio": 1.0, "policy": policy, "run_dir": run_dir, "startup_timeout_s": 120.0,
    }
    config.update(overrides)
    return LocalStack(**config)


def _async_client(stack: Any, timeout: float = 60.0) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=timeout,
                              max_retries=0)


def _sync_client(stack: Any, timeout: float = 60.0) -> Any:
    import openai

    return openai.OpenAI(base_url=stack.url, api_key="unused", timeout=timeout, max_retries=0)


async def _async_turn(client: Any, session: str, text: str, max_tokens: int,
                      **kwargs: Any) -> Any:
    return await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        extra_headers={SESSION: session}, extra_body=ENGINE_DATA, **kwargs,
    )


# ---- the shared two-worker stack ------------------------------------------------------------
@pytest.fixture(scope="module", params=DISCOVERIES)
def shared_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    root = tmp_path_factory.mktemp(f"router-e2e-{request.param}")
    policy = write_policy(root / "policy.yaml", scheduler_interval_seconds=0.5)
    # (Anthropic's messages API on too, for the agent clients that speak it.)
    with _stack(root / "run", policy, discovery=request.param,
                frontend_args=["--enable-anthropic-api"]) as stack:
        wait_until_ready(stack, 2)
        yield stack


@pytest.fixture
def stack(shared_stack: Any) -> Iterator[Any]:
    """The shared stack, idle when the test starts; sessions a test leaves open are ended."""
    wait_for_state(shared_stack, idle, "the shared stack to be idle before the test")
    yield shared_stack
    with _sync_client(shared_stack, timeout=30) as client:
        for session in programs(get_state(shared_stack)):
            end_session(client, session)


# ---- 1. one turn per session at a time ------------------------------------------------------
def _program_state(state: dict[str, Any], session: str) -> dict[str, Any]:
    return programs(state).get(session) or {}


async def test_turns_of_one_session_run_one_at_a_time(stack: Any) -> None:
    client = _async_client(stack)
    session = "serial"
    finish: dict[str, str | None] = {}

    async def turn(name: str) -> None:
        stream = await _async_turn(client, session, turn_text(session, 0 if name == "a" else 1),
                                   LONG_TURN_TOKENS, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                finish[name] = chunk.choices[0].finish_reason

    try:
        first = asyncio.create_task(turn("a"))
        await async_wait_for_state(
            stack, lambda s: _program_state(s, session).get("in_flight") is not None,
            "the first turn to be admitted")
        second = asyncio.create_task(turn("b"))

        # While the first turn is on a worker, the second is held by the router:
        # queued on the program, not forwarded, and the program has no finished step.
        queued = await async_wait_for_state(
            stack, lambda s: _program_state(s, session).get("waiting") == 1,
            "the second turn to queue behind the first")
        program = programs(queued)[session]
        assert program["steps"] == 0 and program["phase"] == "reasoning"
        assert queued["in_flight"] == 1, "both turns of one session were forwarded at once"

        # The second turn is forwarded only after the first completed (one step done).
        alone = await async_wait_for_state(
            stack,
            lambda s: _program_state(s, session).get("steps") == 1
            and _program_state(s, session).get("in_flight") is not None
            and _program_state(s, session).get("waiting") == 0,
            "the second turn to start after the first completed")
        # The scheduler tracks a request from its forwarding to its finish; the router's
        # own `in_flight` counts open streams, and the first turn's stream may still be
        # handing its last chunk to the frontend after its finish was seen.
        assert alone["scheduler"]["tracked_requests"] == 1, "both turns were forwarded at once"

        await asyncio.wait_for(asyncio.gather(first, second), 120)
        assert finish == {"a": "length", "b": "length"}
        done = await async_wait_for_state(
            stack, lambda s: _program_state(s, session).get("steps") == 2
            and s["scheduler"]["tracked_requests"] == 0,
            "both turns to be accounted as completed")
        assert programs(done)[session]["phase"] == "acting"
    finally:
        await client.close()


# ---- 2. sticky placement --------------------------------------------------------------------
def test_turns_of_a_session_stick_to_one_worker_while_capacity_allows(stack: Any) -> None:
    session = "sticky"
    messages: list[dict[str, str]] = []
    served: list[int] = []
    with _sync_client(stack) as client:
        for turn in range(5):
            messages.append({"role": "user", "content": turn_text(session, turn)})
            reply = chat(client, messages, session=session, max_tokens=16)
            served.append(serving_worker(reply))
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        state = get_state(stack)
        end_session(client, session)

    assert len(set(served)) == 1, f"turns moved between workers: {served}"
    assert served[0] in stack.worker_instances().values()
    program = programs(state)[session]
    assert worker_of(program) == served[0]
    assert program["steps"] == 5 and program["moves"] == 0 and program["pauses"] == 0


# ---- 3. session-final releases the program ---------------------------------------------------
def test_session_final_releases_the_program_and_its_capacity(stack: Any) -> None:
    with _sync_client(stack) as client:
        chat(client, [{"role": "user", "content": turn_text("release-a", 0)}],
             session="release-a", max_tokens=32)
        busy = get_state(stack)
        program = programs(busy)["release-a"]
        rank = busy["scheduler"]["ranks"][program["worker"]]
        assert rank["usage_tokens"] > 0 and rank["programs"] == 1

        final = chat(client, [{"role": "user", "content": "done"}], session="release-a",
                     max_tokens=1, final=True)
        assert final.choices == [] or final.choices[0].message.content in (None, "")

        released = wait_for_state(stack, lambda s: "release-a" not in programs(s),
                                  "the session-final to remove the program")
        assert released["scheduler"]["tracked_requests"] == 0
        assert all(r["usage_tokens"] == 0 and r["programs"] == 0
                   for r in released["scheduler"]["ranks"].values())

        # A new session gets the freed capacity straight away: admitted, never paused.
        reply = chat(client, [{"role": "user", "content": turn_text("release-b", 0)}],
                     session="release-b", max_tokens=8)
        assert reply.choices[0].message.content
        after = get_state(stack)
        assert programs(after)["release-b"]["pauses"] == 0
        assert counters(after)["pauses"] == counters(released)["pauses"]
        end_session(client, "release-b")
    wait_for_state(stack, idle, "release-b to be released")


# ---- agent clients that name their session their own way -----------------------------------
# Dynamo's frontend turns other clients' session headers into a turn's session, on Anthropic's
# messages API (--enable-anthropic-api) and OpenAI's responses API as on chat completions:
# Claude Code's x-claude-code-session-id, x-session-id, thread-id. (A header it does not know,
# such as session_id, leaves the request without a session.) Path, session header, body.
def _messages(text: str, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


def _responses(text: str, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_output_tokens": 8, "stream": stream, "input": text}


def _chat_body(text: str, stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": text}]}


AGENT_CLIENTS = {
    "claude-code-messages": ("/messages", "x-claude-code-session-id", _messages),
    "responses": ("/responses", "x-session-id", _responses),
    "chat-thread-id": ("/chat/completions", "thread-id", _chat_body),
}


def _post(stack: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """POST ``body`` to the frontend; the reply's text (a 200 asserted)."""
    import urllib.request

    request = urllib.request.Request(
        stack.url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01",
                 **headers})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
        text: str = reply.read().decode()
    return text


def _ended_well(path: str, stream: bool, reply: str) -> bool:
    """Whether ``reply`` is a whole answer of its API (its closing event, when streamed)."""
    if stream:
        closing = {"/messages": ("event: message_stop",),
                   "/responses": ("event: response.completed", "event: response.incomplete"),
                   "/chat/completions": ("data: [DONE]",)}[path]
        return any(event in reply for event in closing)
    answer = json.loads(reply)
    if path == "/messages":
        return bool(answer["type"] == "message" and answer["stop_reason"])
    if path == "/responses":
        return bool(answer["object"] == "response" and answer["status"] in (
            "completed", "incomplete"))
    return bool(answer["choices"][0]["finish_reason"])


@pytest.mark.parametrize("client", sorted(AGENT_CLIENTS))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_agent_clients_sessions_are_programs_on_every_api(stack: Any, client: str,
                                                          stream: bool) -> None:
    path, header, body = AGENT_CLIENTS[client]
    session = f"{client}-{'s' if stream else 'w'}"
    before = get_state(stack)
    text = ""
    for step in (1, 2):
        text += turn_text(session, step)
        reply = _post(stack, path, body(text, stream), {header: session})
        assert _ended_well(path, stream, reply), reply[-400:]
        state = wait_for_state(stack, lambda s: s["in_flight"] == 0,
                               "the turn to leave the router")
        program = programs(state).get(session)
        assert program is not None and program["steps"] == step, programs(state)
    # The session-final, answered by the router itself, reads as a whole answer of the API.
    reply = _post(stack, path, body("done", stream),
                  {header: session, SESSION_FINAL: "true"})
    assert _ended_well(path, stream, reply), reply[-400:]
    after = wait_for_state(stack, idle, f"the {client} session to end")
    assert after["router"]["completed"] == before["router"]["completed"] + 2
    assert after["router"]["session_final"] == before["router"]["session_final"] + 1
    assert after["router"]["passthrough"] == before["router"]["passthrough"]


# ---- 5. no session: pass-through --------------------------------------------------------------
def test_requests_without_a_session_pass_through(stack: Any) -> None:
    before = get_state(stack)
    with _sync_client(stack) as client:
        reply = chat(client, [{"role": "user", "content": "no session here"}], session=None,
                     max_tokens=12)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    after = get_state(stack)
    assert programs(after) == {}
    assert after["scheduler"]["tracked_requests"] == 0
    assert after["router"]["passthrough"] == before["router"]["passthrough"] + 1
    assert after["router"]["completed"] == before["router"]["completed"]  # nothing tracked


def test_turns_that_end_at_a_stop_string_are_completed_turns_of_their_program(
        stack: Any) -> None:
    # Dynamo's frontend matches stop strings in the text itself and then drops the router's
    # stream as it does for a client that leaves. Such turns were counted aborted: the
    # program never grew, and a first turn's program was rolled back, so an agent whose
    # turns end at a stop string (a ReAct loop's "Observation:") was never tracked (found
    # by a hostile-input probe: hit rate 0.46-0.50 against stock's 0.73).
    before = get_state(stack)
    tokens = []
    with _sync_client(stack) as client:
        prompt = ""
        for i in range(3):
            prompt += turn_text("stops", i)
            # The mocker's tokens read "<t1234>": every turn stops at its first token.
            reply = chat(client, [{"role": "user", "content": prompt}], session="stops",
                         max_tokens=64, stop=["<t"], stream=False)
            assert reply.choices[0].finish_reason == "stop"
            state = wait_for_state(stack, lambda s: s["in_flight"] == 0,
                                   "the turn to leave the router")
            program = programs(state).get("stops")
            assert program is not None, "the program was rolled back after a completed turn"
            assert program["steps"] == i + 1
            tokens.append(program["tokens"])
        assert tokens == sorted(set(tokens)), f"the program's tokens did not grow: {tokens}"
        after = get_state(stack)
        assert after["router"]["completed"] == before["router"]["completed"] + 3
        assert after["router"]["aborted"] == before["router"]["aborted"]
        end_session(client, "stops")
    wait_for_state(stack, idle, "the stop-string session to be released")


def test_serve_reads_the_workers_block_size_so_kv_routing_keeps_its_prefix_hits(
        tmp_path: Path) -> None:
    # Workers at 64 tokens a block (the mocker's own default) and serve run the way the
    # README shows it, without --block-size: it builds its KV router with the size the
    # workers' cards state. With 16 (the old fixed default) the KV router matched nothing,
    # and a repeated prompt without a session id went to the other worker half the time.
    policy = REPO_ROOT / "policies" / "thunderagent-extended.yaml"
    router_cmd = ["{python}", "-m", "dynamo_thunderagent", "serve",
                  "--router-policy-config", str(policy), "--endpoint", "{worker_endpoint}",
                  "--router-endpoint", "{router_endpoint}", "--model-name", "{model_name}",
                  "--model-path", "{model_path}"]
    with _stack(tmp_path / "run", None, block_size=64, speedup_ratio=10.0,
                router_cmd=router_cmd) as stack, _sync_client(stack) as client:
        prompt = " ".join(f"repeated{i}" for i in range(300))
        cached = []
        for _ in range(6):
            reply = chat(client, [{"role": "user", "content": prompt}], session=None,
                         max_tokens=4)
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
        router_log = (stack.run_dir / "logs" / "router.log").read_text(errors="replace")
        assert "block_size_mismatch" not in router_log


def test_the_workers_parsers_template_and_context_length_reach_the_frontend_via_the_router(
        tmp_path: Path) -> None:
    # One worker started with the Hermes tool-call parser, a custom chat template and a
    # 2,048-token context (``fault_engine.py``, which answers a tool call, or the prompt it
    # was sent, when max_tokens asks for one). The frontend sees only the router's card:
    # before, that card stated none of them, so the call came back as its text with finish
    # "stop" (stock's frontend, reading the worker's own card, answers with tool_calls),
    # prompts were rendered with the model's own template, and /v1/models said 131,072 (the
    # model's config).
    import json

    from fault_engine import ECHO, TOOL_CALL

    template = tmp_path / "agent.jinja"
    template.write_text("{% for m in messages %}AGENT[{{ m.role }}]: {{ m.content }}\n"
                        "{% endfor %}REPLY:", encoding="utf-8")
    stack = _stack(tmp_path / "run", REPO_ROOT / "policies" / "thunderagent-extended.yaml",
                   num_workers=1, speedup_ratio=10.0)
    fault_engine = [stack.config.python, str(Path(__file__).with_name("fault_engine.py")),
                    "--model-path", str(stack.model_path),
                    "--served-model-name", stack.config.model_name,
                    "--endpoint", stack.worker_endpoint, "--blocks", "256", "--block-size", "16",
                    "--tool-call-parser", "hermes", "--context-length", "2048",
                    "--custom-jinja-template", str(template)]
    stack._mocker_argv = lambda endpoint=None, index=None: fault_engine  # its one worker
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    with stack, _sync_client(stack) as client:
        (model,) = client.models.list().data
        assert (model.model_extra or {}).get("context_window") == 2048
        for turn in range(2):  # a program's first turn, then one of its later turns
            reply = client.chat.completions.create(
                model=MODEL, max_tokens=TOOL_CALL, tools=tools,
                messages=[{"role": "user", "content": turn_text("agent", turn)}],
                extra_headers={SESSION: "agent"})
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            assert choice.message.tool_calls is not None
            (call,) = choice.message.tool_calls
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris"}
        echoed = chat(client, [{"role": "user", "content": "what did you get?"}],
                      session="agent", max_tokens=ECHO).choices[0].message.content
        assert echoed is not None and "AGENT[user]: what did you get?" in echoed, echoed
        card = get_state(stack)["router_card"]
        assert card["tool_call_parser"] == "hermes" and card["context_length"] == 2048
        assert card["chat_template"] and card["mismatch"] is None


def test_a_disaggregated_deployments_prefill_worker_is_never_sent_a_request(
        tmp_path: Path) -> None:
    # A mocker started with --disaggregation-mode prefill answers a request with its first
    # token alone. Behind ours, requests without a session went there (the KV router saw the
    # prompts' cache on it, the decode worker publishes none): one token, finish "length",
    # where stock's frontend prefilled there and decoded on the decode worker. The router
    # leaves prefill-only workers out; the decode worker serves everything.
    stack = _stack(tmp_path / "run", REPO_ROOT / "policies" / "thunderagent-extended.yaml",
                   speedup_ratio=10.0, worker_args=[["--disaggregation-mode", "prefill"],
                                                    ["--disaggregation-mode", "decode"]])
    with stack, _sync_client(stack) as client:
        state = wait_for_state(stack, lambda s: len(s["prefill_only_workers"]) == 1
                               and len(s["live_workers"]) == 1, "the prefill worker's card")
        decoder = state["live_workers"][0]
        assert state["prefill_only_workers"] != [decoder]
        prompt = ""
        for step in range(4):  # a prompt that grows: its cache is on the prefill worker
            prompt += turn_text("disagg", step)
            for session in (None, "disagg"):
                reply = chat(client, [{"role": "user", "content": prompt}], session=session,
                             max_tokens=16)
                assert reply.usage is not None and reply.usage.completion_tokens == 16, (
                    session, step, reply)
                if session is not None:
                    assert serving_worker(reply) == decoder
        assert worker_of(programs(get_state(stack))["disagg"]) == decoder
        end_session(client, "disagg")


# ---- 7. a client that goes away mid-stream --------------------------------------------------
def test_client_disconnect_mid_stream_aborts_the_turn_and_keeps_the_program(stack: Any) -> None:
    session = "disconnect"
    with _sync_client(stack) as client:
        chat(client, [{"role": "user", "content": turn_text(session, 0)}], session=session,
             max_tokens=8)
        before = get_state(stack)

        stream = chat(client, [{"role": "user", "content": turn_text(session, 1)}],
                      session=session, max_tokens=3 * LONG_TURN_TOKENS, stream=True)
        first = next(iter(stream))
        assert first.choices
        stream.close()  # drop the connection with most of the turn still to come

        after = wait_for_state(
            stack, lambda s: s["router"]["aborted"] == before["router"]["aborted"] + 1
            and s["scheduler"]["tracked_requests"] == 0 and s["in_flight"] == 0,
            "the router to abort the disconnected turn", timeout=60)
        assert after["router"]["completed"] == before["router"]["completed"]
        program = programs(after)[session]
        assert program["phase"] == "acting" and program["lifecycle"] == "active"
        assert program["in_flight"] is None and program["waiting"] == 0

        reply = chat(client, [{"role": "user", "content": turn_text(session, 2)}],
                     session=session, max_tokens=8)
        assert reply.choices[0].message.content
        assert serving_worker(reply) == worker_of(program)
        assert programs(get_state(stack))[session]["steps"] == program["steps"] + 1
        end_session(client, session)


# ---- 4. pause and resume under KV pressure ---------------------------------------------------
@pytest.mark.parametrize("discovery", DISCOVERIES)
async def test_small_kv_capacity_pauses_and_resumes_programs_and_every_agent_finishes(
    tmp_path: Path, discovery: str
) -> None:
    agents, turns = 6, 6
    policy = write_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5,
                          resume_timeout_seconds=30)
    # 2 workers x 64 blocks x 16 tokens: about 1,000 tokens per worker, while six
    # agents grow to about 500 tokens each (plus 100 buffer per program).
    with _stack(tmp_path / "run", policy, num_gpu_blocks=64, discovery=discovery) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        client = _async_client(stack, timeout=120)

        async def agent(index: int) -> int:
            session = f"pressure-{index}"
            messages = [{"role": "system", "content": f"you are agent {index}"}]
            completed = 0
            for turn in range(turns):
                messages.append({"role": "user", "content": turn_text(session, turn, words=6)})
                reply = await client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=32,
                    extra_headers={SESSION: session})
                assert reply.usage is not None and reply.usage.completion_tokens == 32
                messages.append({"role": "assistant",
                                 "content": reply.choices[0].message.content or ""})
                completed += 1
                await asyncio.sleep(0.3)  # the tool runs
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "done"}], max_tokens=1,
                extra_headers={SESSION: session, SESSION_FINAL: "true"})
            return completed

        try:
            done = await asyncio.wait_for(
                asyncio.gather(*(agent(i) for i in range(agents))), 240)
        finally:
            await client.close()
        assert done == [turns] * agents

        state = await async_wait_for_state(stack, idle, "every program to be released")
        assert counters(state)["pauses"] > 0, "capacity pressure never paused a program"
        assert counters(state)["resumes"] > 0, "no paused program was resumed"
        assert state["router"]["errors"] == 0 and state["router"]["aborted"] == 0
        assert state["router"]["rejected"] == 0
        assert state["router"]["completed"] == agents * turns


# ---- 6. a worker dies mid-run -----------------------------------------------------------------
@pytest.mark.parametrize("discovery", DISCOVERIES)
async def test_killed_worker_moves_its_programs_and_leaves_nothing_behind(
    tmp_path: Path, discovery: str
) -> None:
    import openai

    policy = write_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5)
    with _stack(tmp_path / "run", policy, discovery=discovery) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        instances = stack.worker_instances()
        victim, survivor = instances[0], instances[1]
        client = _async_client(stack, timeout=30)  # a hang shows up as APITimeoutError
        stop = asyncio.Event()
        served: dict[str, list[int]] = {}
        failures: list[Exception] = []

        async def agent(session: str) -> None:
            served[session] = []
            turn = 0
            while not stop.is_set():
                try:
                    reply = await _async_turn(client, session, turn_text(session, turn), 120)
                except openai.APIError as error:
                    failures.append(error)
                    await asyncio.sleep(0.3)  # retry this turn
                    continue
                served[session].append(serving_worker(reply))
                turn += 1
                await asyncio.sleep(0.1)
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "done"}], max_tokens=1,
                extra_headers={SESSION: session, SESSION_FINAL: "true"})

        sessions = [f"survive-{i}" for i in range(4)]
        tasks = [asyncio.create_task(agent(s)) for s in sessions]
        try:
            # Kill the victim while a program that already ran there has a turn on it.
            def turn_on_victim(state: dict[str, Any]) -> bool:
                return any(worker_of(p) == victim and p["steps"] >= 1
                           and p["in_flight"] is not None for p in programs(state).values())

            before = await async_wait_for_state(stack, turn_on_victim,
                                                "a second turn in flight on worker 0")
            stack.kill_worker(0)
            on_victim = {s: p["steps"] for s, p in programs(before).items()
                         if worker_of(p) == victim}

            await async_wait_for_state(
                stack, lambda s: s["live_workers"] == [survivor],
                "the router to notice the killed worker", timeout=60)
            mark = {s: len(served[s]) for s in sessions}

            async def two_more_turns_each() -> None:
                while any(len(served[s]) < mark[s] + 2 for s in sessions):
                    assert not any(t.done() for t in tasks), "an agent stopped early"
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(two_more_turns_each(), 90)
            moved = await asyncio.to_thread(get_state, stack)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 90)
            await client.close()
        for task in tasks:
            task.result()  # an agent's unexpected exception fails the test here

        assert all(worker_of(p) == survivor for p in programs(moved).values()), programs(moved)
        for session, steps in on_victim.items():
            # The same program carried on (its step count kept growing), now elsewhere.
            assert programs(moved)[session]["steps"] > steps, programs(moved)[session]
        for session in sessions:
            assert set(served[session][mark[session]:]) == {survivor}, served[session]

        # The turn in flight on the killed worker went on on the survivor (failover): no
        # client saw an error, and nothing hung.
        assert not failures, f"turns failed or hung: {failures[:3]}"
        assert moved["router"]["failovers"] >= 1, moved["router"]

        final = await async_wait_for_state(stack, idle, "no program or request left behind")
        assert programs(final) == {} and final["scheduler"]["tracked_requests"] == 0


# ---- 8. the same policy file starts Dynamo's builtin plugin ---------------------------------
def test_project_policy_starts_dynamos_builtin_thunderagent(tmp_path: Path) -> None:
    from dynamo_thunderagent.stack.arms import BUILTIN_ADMISSION_LOG_LINE

    policy = REPO_ROOT / "policies" / "thunderagent.yaml"
    with _stack(tmp_path / "run", policy, arm="builtin") as stack:
        log = stack.frontend.log_path.read_text(errors="replace")
        assert BUILTIN_ADMISSION_LOG_LINE in log
        with _sync_client(stack) as client:
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": turn_text("builtin", 0)}],
                max_tokens=8, extra_headers={SESSION: "builtin-1"})
            assert reply.choices[0].message.content
            assert reply.usage is not None and reply.usage.completion_tokens == 8


# ---- 9. a bad policy stops `serve` with the message `validate` prints -----------------------
BAD_POLICIES = {
    "unknown-type": (
        "request_classifier:\n  type: no-such-classifier\n"
        "worker_selection:\n  instances: [{name: ta, type: thunderagent}]\n  aggregated: ta\n"
    ),
    "out-of-range": (
        "request_classifier:\n  type: thunderagent\n  parameters: {pause_threshold: 1.5}\n"
        "worker_selection:\n  instances: [{name: ta, type: thunderagent}]\n  aggregated: ta\n"
    ),
    "malformed-yaml": "request_classifier: [type: thunderagent\n",
    "string-number": (
        "request_classifier:\n  type: thunderagent\n  parameters: {pause_threshold: \"0.9\"}\n"
    ),
    "duplicate-key": (
        "request_classifier:\n  type: thunderagent\n"
        "request_classifier:\n  type: thunderagent\n"
    ),
    "empty": "",
    "busy-tick": (
        "request_classifier:\n  type: thunderagent\n"
        "  parameters: {scheduler_interval_seconds: 1.0e-9}\n"
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_POLICIES))
def test_bad_policy_stops_serve_with_the_message_validate_prints(
    tmp_path: Path, case: str
) -> None:
    policy = tmp_path / f"{case}.yaml"
    policy.write_text(BAD_POLICIES[case], encoding="utf-8")
    env = dict(os.environ)
    # If serve ever got as far as the runtime, file discovery keeps it off etcd.
    env.update({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv"),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                             env.get("PYTHONPATH")]))})
    cli = [sys.executable, "-m", "dynamo_thunderagent"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=60, check=False)

    validate = run("validate", str(policy))
    serve = run("serve", "--router-policy-config", str(policy),
                "--endpoint", "ta-workers.backend.generate", "--model-name", MODEL,
                "--model-path", str(tmp_path / "no-model"))

    assert validate.returncode != 0 and serve.returncode != 0
    message = validate.stderr.strip()
    assert message.startswith("error:") and str(policy) in message
    assert serve.stderr.strip() == message
    if case == "unknown-type":
        assert "no-such-classifier" in message
    if case in ("out-of-range", "string-number"):
        assert "pause_threshold" in message
    expected = {"duplicate-key": "appears twice", "empty": "the policy is empty",
                "busy-tick": "scheduler_interval_seconds"}
    if case in expected:
        assert expected[case] in message


@pytest.mark.parametrize("taken", ["--state-port", "--events-port"])
def test_a_port_taken_stops_serve_with_an_error_that_names_it(tmp_path: Path,
                                                               taken: str) -> None:
    # Before: a traceback (OSError from the state server, ZMQError from the events socket).
    import socket

    env = dict(os.environ)
    env.update({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv"),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                             env.get("PYTHONPATH")]))})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        serve = subprocess.run(
            [sys.executable, "-m", "dynamo_thunderagent", "serve",
             "--router-policy-config", str(REPO_ROOT / "policies" / "thunderagent.yaml"),
             "--endpoint", "ta-workers.backend.generate", "--model-name", MODEL,
             "--model-path", str(tmp_path / "no-model"), "--block-size", "16",
             taken, str(port)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90, check=False)
    assert serve.returncode == 2, serve.stderr[-2000:]
    said = [line for line in serve.stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1, serve.stderr[-2000:]
    assert said[0].startswith("error: cannot listen on 127.0.0.1") and f"{taken} {port}" in said[0]
    assert "in use" in said[0] and "Traceback" not in serve.stderr


# ---- 10. a rejected request says why -----------------------------------------------------------
def test_rejected_request_gets_an_http_error_that_says_why(tmp_path: Path) -> None:
    import openai

    policy = write_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5,
                          max_tracked_requests=1)
    with _stack(tmp_path / "run", policy) as stack:
        wait_until_ready(stack, 2)
        with _sync_client(stack, timeout=60) as client:
            stream = chat(client, [{"role": "user", "content": turn_text("holder", 0)}],
                          session="holder", max_tokens=LONG_TURN_TOKENS, stream=True)
            chunks = iter(stream)
            next(chunks)  # the holder's turn is on a worker now
            assert get_state(stack)["scheduler"]["tracked_requests"] == 1

            with pytest.raises(openai.BadRequestError) as rejected:
                chat(client, [{"role": "user", "content": turn_text("second", 0)}],
                     session="second", max_tokens=8)
            message = str(rejected.value)
            assert "max_tracked_requests=1" in message and "rejected" in message

            finish = [c.choices[0].finish_reason for c in chunks if c.choices]
            assert finish[-1] == "length"  # the holder was not disturbed
        state = get_state(stack)
        assert counters(state)["rejected"] == 1 and state["router"]["rejected"] == 1
        assert "second" not in programs(state)
