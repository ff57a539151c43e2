"""The fault suite: faults and hostile input against real Dynamo processes, nothing lost.

Every case runs the real frontend, our router (the shipped extended policy, with a short
tick) and mocker workers (one adds a real worker whose engine fails on demand,
``fault_engine.py``), does something a production deployment meets (a worker or the
router killed mid-load, a worker hung, the router frozen past its discovery lease, clients
leaving in a storm, requests the engine refuses, oversize prompts, a flood of session ids,
malformed session headers, workers with data-parallel ranks, a worker replaced while agents
run, a worker's model card made unreadable, a session-final with every request slot
taken or whose client leaves, an engine that refuses, fails or cuts short one request,
also one queued behind another turn of its session, programs that outgrow a small
worker's pool) and ends with the same checks (:func:`settles`):

* every request the router took reached exactly one terminal state (its counters add up:
  completed + aborted + rejected + session-final + cancelled + orphaned + pass-through);
* nothing is tracked, in flight or waiting for room once clients are done, and no rank's
  capacity is still held for a request without a session id (``sessionless_kv: reserve``,
  on in the extended policy);
* every client got a response or an error with a message (no hang, no silent drop);
* nothing else was harmed: a fresh agent's turns succeed, and once every remaining
  session ends, the table is empty and every rank's usage is back to zero;
* the logs stay clean: no CancelledError in the router's (Dynamo's runtime logs a traceback
  for every error a handler raises to reach its client, which is how errors are returned),
  no request-tracker conflict in the frontend's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

# This folder's conftest.py: pytest puts a test folder without __init__.py on sys.path.
from conftest import (
    E2E_MARKS,
    ENGINE_DATA,
    MODEL,
    REPO_ROOT,
    SESSION,
    SESSION_FINAL,
    State,
    chat,
    end_session,
    get_state,
    programs,
    serving_worker,
    turn_text,
    wait_for_state,
    wait_until_ready,
)

pytestmark = E2E_MARKS

EXTENDED = REPO_ROOT / "policies" / "thunderagent-extended.yaml"


def extended_policy(path: Path, *, selector_slack: bool = True, **overrides: Any) -> Path:
    """The shipped extended policy with some parameters changed (``selector_slack=False``:
    its worker selector always honours a live preferred rank)."""
    data = yaml.safe_load(EXTENDED.read_text(encoding="utf-8"))
    data["request_classifier"]["parameters"].update(overrides)
    if not selector_slack:
        for instance in data["worker_selection"]["instances"]:
            instance.pop("parameters", None)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def start_stack(tmp_path: Path, **overrides: Any) -> Any:
    from dynamo_thunderagent.stack.launcher import LocalStack

    policy = extended_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5)
    config: dict[str, Any] = {
        "arm": "ours", "num_workers": 2, "num_gpu_blocks": 256, "block_size": 16,
        "speedup_ratio": 10.0, "policy": policy, "run_dir": tmp_path / "run",
        "startup_timeout_s": 120.0,
    }
    config.update(overrides)
    return LocalStack(**config)


def sync_client(stack: Any, timeout: float = 60.0) -> Any:
    import openai

    return openai.OpenAI(base_url=stack.url, api_key="unused", timeout=timeout, max_retries=0)


def async_client(stack: Any, timeout: float = 60.0) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=timeout,
                              max_retries=0)


class Outcomes:
    """What each client saw: a response, or an error that says something."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors: list[str] = []

    def record_error(self, error: Exception) -> None:
        import openai

        assert not isinstance(error, openai.APITimeoutError), f"a request hung: {error}"
        message = str(error)
        assert message.strip(), f"an error without a message: {error!r}"
        self.errors.append(message)


@contextlib.asynccontextmanager
async def agents_running(
        agent: Callable[[str], Awaitable[None]], sessions: list[str], client: Any,
        stop: asyncio.Event, *, timeout: float) -> AsyncIterator[None]:
    """Run ``agent(session)`` for each session until the block ends; then stop them, close
    the client, and fail on any agent's unexpected exception."""
    tasks = [asyncio.create_task(agent(session)) for session in sessions]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout)
        await client.close()
    for task in tasks:
        task.result()


async def agent_turns(client: Any, session: str, stop: asyncio.Event, outcomes: Outcomes,
                      served: Callable[[dict[str, Any]], None] | None = None, *,
                      max_tokens: int, retry_after: float = 0.2) -> None:
    """One agent's turns until ``stop``: each reply's routing data (its worker id and dp
    rank) goes to ``served``, if given; a failed turn is recorded and the agent tries again
    ``retry_after`` seconds later."""
    import openai

    turn = 0
    while not stop.is_set():
        try:
            reply = await client.chat.completions.create(
                model=MODEL, max_tokens=max_tokens, extra_body=ENGINE_DATA,
                messages=[{"role": "user", "content": turn_text(session, turn)}],
                extra_headers={SESSION: session})
        except openai.APIError as error:
            outcomes.record_error(error)
            await asyncio.sleep(retry_after)
            continue
        outcomes.ok += 1
        if served is not None:
            served((reply.model_extra or {})["nvext"]["engine_data"]["thunderagent"])
        turn += 1
        await asyncio.sleep(0.05)


def accounted(state: State) -> int:
    r = state["router"]
    return (r["passthrough"] + r["completed"] + r["aborted"] + r["rejected"]
            + r["session_final"] + r["cancelled"] + r["orphans"])


def settles(stack: Any, what: str, timeout: float = 60.0) -> State:
    """The end checks every fault case shares (see the module docstring)."""
    wait_for_state(
        stack,
        lambda s: (s["in_flight"] == 0 and s["scheduler"]["tracked_requests"] == 0
                   and s["scheduler"]["waiting_for_room"] == 0 and accounted(s) ==
                   s["router"]["requests"] and not s["scheduler"]["sessionless_tokens"]),
        f"{what}: nothing in flight, tracked, waiting or held for sessionless traffic, "
        "every request accounted for", timeout)
    with sync_client(stack, timeout=30) as client:
        fresh = f"fresh-after-{what.replace(' ', '-')}"
        for turn in range(2):
            reply = chat(client, [{"role": "user", "content": turn_text(fresh, turn)}],
                         session=fresh)
            assert reply.choices[0].finish_reason == "length"
        for session in [*programs(get_state(stack)), fresh]:
            end_session(client, session)
    final = wait_for_state(
        stack,
        lambda s: not programs(s) and all(
            r["usage_tokens"] == 0 for r in s["scheduler"]["ranks"].values())
        and s["scheduler"]["tracked_requests"] == 0,
        f"{what}: every session ended, the table empty and usage back to zero", timeout)
    router_log = stack.router.log_path.read_text(errors="replace")
    assert "CancelledError" not in router_log, router_log[-3000:]
    frontend_log = stack.frontend.log_path.read_text(errors="replace")
    assert "Conflicting request tracker write" not in frontend_log
    return final


# ---- workers with data-parallel ranks: the preferred rank, then a worker killed ------------
async def test_dp_ranks_honour_the_preferred_rank_and_survive_a_killed_worker(
        tmp_path: Path) -> None:
    import openai

    # The selector's load slack would send some turns to another rank by choice; this case
    # checks that the rank a turn is pinned to is the rank that serves it.
    policy = extended_policy(tmp_path / "no-slack.yaml", selector_slack=False,
                             scheduler_interval_seconds=0.5)
    stack_cm = start_stack(tmp_path, mocker_args=["--data-parallel-size", "2"],
                           speedup_ratio=2.0, policy=policy)
    with stack_cm as stack:
        await asyncio.to_thread(
            wait_for_state, stack,
            lambda s: sum(1 for r in s["scheduler"]["ranks"].values()
                          if r["capacity_tokens"]) == 4,
            "the router to see 2 workers x 2 ranks")
        client = async_client(stack, timeout=60)
        outcomes = Outcomes()
        seen: dict[str, set[tuple[int, int]]] = {}
        stop = asyncio.Event()

        async def agent(session: str) -> None:
            def served(data: dict[str, Any]) -> None:
                seen.setdefault(session, set()).add((data["worker_id"], data["dp_rank"]))

            await agent_turns(client, session, stop, outcomes, served, max_tokens=24)

        tenants_ok = Outcomes()  # apart, so that agents' turns are counted as such

        async def other_tenant(name: str) -> None:
            # Requests without a session id beside the agents: some are running on the
            # worker that is killed, and the room they hold must come back.
            n = 0
            while not stop.is_set():
                try:
                    await client.chat.completions.create(
                        model=MODEL, max_tokens=48,
                        messages=[{"role": "user", "content": turn_text(name, n)}])
                    tenants_ok.ok += 1
                except openai.APIError as error:
                    tenants_ok.record_error(error)
                    await asyncio.sleep(0.2)
                n += 1

        async def anyone(name: str) -> None:
            await (other_tenant(name) if name.startswith("tenant-") else agent(name))

        sessions = [f"dp-{i}" for i in range(6)]
        tenants = [f"tenant-{i}" for i in range(3)]
        async with agents_running(anyone, [*sessions, *tenants], client, stop,
                                  timeout=90):
            await asyncio.to_thread(
                wait_for_state, stack,
                lambda s: all(programs(s).get(x, {}).get("steps", 0) >= 3 for x in sessions),
                "three turns of every agent")
            before = await asyncio.to_thread(get_state, stack)
            # Each program ran on exactly the worker/rank the scheduler holds for it.
            for session in sessions:
                assert seen[session] == {_rank_of(programs(before)[session])}, seen[session]
            ranks = {_rank_of(p) for p in programs(before).values()}
            assert any(rank for _, rank in ranks), f"no program on a rank other than 0: {ranks}"
            victim = stack.worker_instances()[0]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: any(
                    key.startswith(f"{victim}/") for key in s["scheduler"]["sessionless_tokens"]),
                "room held for a sessionless request running on the worker to be killed", 60)
            stack.kill_worker(0)
            survivor = stack.worker_instances()[1]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: s["live_workers"] == [survivor],
                "the router to notice the killed worker", 60)
            mark = outcomes.ok
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: outcomes.ok >= mark + 2 * len(sessions),
                "two more turns per agent after the kill", 90)
        # Nobody saw the kill: what the killed worker was serving went on on the survivor.
        assert outcomes.errors == [] and tenants_ok.errors == [], (
            outcomes.errors, tenants_ok.errors)
        # A replacement worker joins with a new instance id and both of its ranks.
        stack.restart_worker(0)
        wait_for_state(stack, lambda s: len(s["live_workers"]) == 2 and sum(
            1 for r in s["scheduler"]["ranks"].values() if r["capacity_tokens"]) == 4,
            "the replacement worker's two ranks in the router's view", 60)
        settles(stack, "a killed dp worker")


def _rank_of(program: dict[str, Any]) -> tuple[int, int]:
    worker, rank = str(program["worker"]).split("/")
    return int(worker), int(rank)


# ---- a worker replaced while agents run, with the selector's load slack -------------------
async def test_a_worker_replaced_mid_load_takes_new_programs_and_loses_nothing(
        tmp_path: Path) -> None:
    # The shipped extended policy, load slack included: every tracked turn with a live home
    # asks the KV router for its loads, and the replacement worker may be in the router's
    # view before the KV router's (such turns go home, counted in loads_unavailable; not
    # asserted, since the order the two learn of a worker in is up to the runtime).
    with start_stack(tmp_path) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        outcomes = Outcomes()
        served_by: dict[str, list[int]] = {}

        def agent_on(client: Any, stop: asyncio.Event) -> Callable[[str], Awaitable[None]]:
            return lambda session: agent_turns(
                client, session, stop, outcomes,
                lambda data: served_by.setdefault(session, []).append(data["worker_id"]),
                max_tokens=48)  # turns long enough to be caught by the kill

        first = [f"replace-{i}" for i in range(6)]
        later = [f"after-{i}" for i in range(4)]
        client, stop = async_client(stack, timeout=60), asyncio.Event()
        async with agents_running(agent_on(client, stop), first, client, stop, timeout=90):
            await asyncio.to_thread(
                wait_for_state, stack,
                lambda s: all(programs(s).get(x, {}).get("steps", 0) >= 3 for x in first),
                "three turns of every agent")
            victim = stack.worker_instances()[0]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: any(
                    p["phase"] == "reasoning" and str(p["worker"]).startswith(f"{victim}/")
                    for p in programs(s).values()),
                "a turn in flight on the worker to be killed")
            stack.kill_worker(0)
            survivor = stack.worker_instances()[1]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: s["live_workers"] == [survivor],
                "the router to notice the killed worker", 60)
            # The replacement registers while the agents keep sending turns.
            await asyncio.to_thread(stack.restart_worker, 0)
            replacement = stack.worker_instances()[0]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: sorted(s["live_workers"]) == sorted(
                    [survivor, replacement]) and sum(
                    1 for r in s["scheduler"]["ranks"].values() if r["capacity_tokens"]) == 2,
                "the replacement worker and its capacity in the router's view", 60)
            served_before = {x: len(served_by[x]) for x in first}
            # New agents arrive: the replacement, if the first agents have not filled it
            # yet, is the least busy rank with room.
            later_client, stop_later = async_client(stack, timeout=60), asyncio.Event()
            async with agents_running(agent_on(later_client, stop_later), later, later_client,
                                      stop_later, timeout=90):
                await asyncio.to_thread(
                    wait_for_state, stack,
                    lambda s: all(programs(s).get(x, {}).get("steps", 0) >= 3 for x in later),
                    "three turns of every new agent", 90)
                await asyncio.to_thread(
                    wait_for_state, stack, lambda _: all(
                        len(served_by[x]) >= served_before[x] + 2 for x in first),
                    "two more turns of every first agent since the replacement joined", 60)
        # Every turn has ended and no session has: each program's worker is where its last
        # turn ran. The replacement holds programs: new ones placed on the least busy rank,
        # or first ones the selector's load slack sent there from the busy survivor (which
        # of the two depends on how many turns ran before the new agents came: once the
        # slack has moved most first agents there, the survivor is the less busy rank).
        placed = {x: programs(get_state(stack))[x]["worker"] for x in [*first, *later]}
        on_replacement = [x for x, w in placed.items() if str(w).startswith(f"{replacement}/")]
        assert on_replacement, f"no program on the replacement {replacement}: {placed}"
        for session in on_replacement:
            assert replacement in served_by[session], served_by[session]
        # No turn failed: those the killed worker was serving went on on the survivor
        # (failover), and those sent before the router noticed went there at once.
        assert outcomes.errors == [], outcomes.errors
        assert get_state(stack)["router"]["failovers"] >= 1
        settles(stack, "a worker replaced mid-load")


async def test_a_hung_worker_s_turns_go_on_on_another_worker_and_nobody_waits_for_it(
        tmp_path: Path) -> None:
    # A worker stopped, not killed, keeps its connections open: without the stall watch its
    # streams would wait for the client's timeout (60 s here, when Outcomes calls it a hang).
    with start_stack(tmp_path) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        outcomes = Outcomes()
        sessions = [f"hung-{i}" for i in range(6)]
        client, stop = async_client(stack, timeout=60), asyncio.Event()
        victim = stack.worker_instances()[0]
        try:
            async with agents_running(
                    lambda session: agent_turns(client, session, stop, outcomes,
                                                max_tokens=400),  # turns mostly streaming
                    sessions, client, stop, timeout=90):
                await asyncio.to_thread(
                    wait_for_state, stack,
                    lambda s: all(programs(s).get(x, {}).get("steps", 0) >= 2 for x in sessions),
                    "two turns of every agent")
                await asyncio.to_thread(
                    wait_for_state, stack, lambda s: sum(
                        p["phase"] == "reasoning" and str(p["worker"]).startswith(f"{victim}/")
                        for p in programs(s).values()) >= 2,
                    "two turns in flight on the worker to be stopped")
                stack.kill_worker(0, signal.SIGSTOP)
                # Discovery drops it once its registration lapses (about 10 s); its streams,
                # silent since, are cut 5 s later and fail over.
                await asyncio.to_thread(
                    wait_for_state, stack, lambda s: s["router"]["stalled"] >= 1,
                    "the router to cut a stream stalled on the stopped worker", 45)
        finally:
            stack.kill_worker(0)  # a stopped process would not stop on the stack's SIGTERM
        assert outcomes.errors == [], outcomes.errors
        state = get_state(stack)
        assert state["router"]["failovers"] >= 1 and state["router"]["stalled"] >= 1
        assert victim not in state["live_workers"]
        settles(stack, "a hung worker")


async def test_a_hung_lone_worker_s_turn_ends_with_an_error_that_names_it_not_a_hang(
        tmp_path: Path) -> None:
    # With nowhere to fail over to, the stall watch's cut ends the turn with WorkerLeft: the
    # client gets a 500 well before its 60 s timeout (Outcomes would call a timeout a hang;
    # Dynamo 1.6.1's frontend answers a component's error with a canned message and logs the
    # component's, which names the worker), the request ends once, and a replacement worker
    # serves again.
    import openai

    with start_stack(tmp_path, num_workers=1) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 1)
        victim = stack.worker_instances()[0]
        client, outcomes = async_client(stack, timeout=60), Outcomes()
        try:
            turn = asyncio.create_task(client.chat.completions.create(
                model=MODEL, max_tokens=3000, extra_body=ENGINE_DATA,
                messages=[{"role": "user", "content": turn_text("lone", 0)}],
                extra_headers={SESSION: "lone"}))
            await asyncio.to_thread(
                wait_for_state, stack,
                lambda s: programs(s).get("lone", {}).get("phase") == "reasoning",
                "the turn in flight on the only worker")
            await asyncio.sleep(0.5)  # past its prefill: streaming tokens
            stack.kill_worker(0, signal.SIGSTOP)
            with pytest.raises(openai.APIError) as raised:
                await turn
            outcomes.record_error(raised.value)
        finally:
            stack.kill_worker(0)
            await client.close()
        assert isinstance(raised.value, openai.InternalServerError), outcomes.errors
        frontend_log = stack.frontend.log_path.read_text(errors="replace")
        assert f"WorkerLeft: worker {victim} left discovery" in frontend_log
        assert get_state(stack)["router"]["stalled"] == 1
        await asyncio.to_thread(stack.restart_worker, 0)
        await asyncio.to_thread(wait_until_ready, stack, 1)
        settles(stack, "a hung lone worker")


# ---- a worker's model card that cannot be read -----------------------------------------------
def capacity_known(state: State, worker_id: int) -> bool:
    """Whether the router knows the KV capacity of any of ``worker_id``'s ranks."""
    return any(key.startswith(f"{worker_id}/") and rank["capacity_tokens"]
               for key, rank in state["scheduler"]["ranks"].items())


def rewrite_card(stack: Any, worker_id: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Register ``worker_id``'s model card again with ``change`` applied, as the file store
    sees a worker re-register: the card goes (the router sees the worker without one), then
    comes back changed. Dynamo's file store notices neither an edit in place nor a file
    replaced before its watch has seen it go."""
    from dynamo_thunderagent.stack.discovery import MODEL_CARD_PREFIX

    for path in sorted((stack.kv_dir / MODEL_CARD_PREFIX).iterdir()):
        registration = json.loads(path.read_text(encoding="utf-8"))
        if registration.get("instance_id") == worker_id:
            change(registration["card_json"])
            staged = path.with_name(path.name + ".new")
            staged.write_text(json.dumps(registration), encoding="utf-8")
            path.unlink()
            # (A card that does not read leaves the capacity unknown already: wait until
            # the router names no unreadable card for the worker either, or the changed
            # card may replace the file before the store's watch has seen it go.)
            wait_for_state(stack, lambda s: not capacity_known(s, worker_id)
                           and str(worker_id) not in s["unreadable_cards"],
                           f"the router to see worker {worker_id} without a card", 30)
            staged.rename(path)
            return
    raise AssertionError(f"no model card of worker {worker_id} in {stack.kv_dir}")


async def test_a_worker_s_unreadable_model_card_costs_only_that_worker(
        tmp_path: Path) -> None:
    # One live worker's card stops reading (a field that is not a whole number): the router
    # names it in /state and its log, and its worker watch goes on for every other worker.
    # Before, the bad card made every refresh fail, so the router never saw the other worker
    # die or come back. Dynamo's own KV router cannot read that card either and stops
    # routing to the worker, so while the other worker is down, turns fail, each with an
    # error that says so, and none hangs.
    with start_stack(tmp_path) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        outcomes = Outcomes()
        sessions = [f"card-{i}" for i in range(4)]
        client, stop = async_client(stack, timeout=60), asyncio.Event()
        spoilt, other = stack.worker_instances()[0], stack.worker_instances()[1]
        saved: dict[str, Any] = {}

        def spoil(card: dict[str, Any]) -> None:
            saved.update(card["runtime_config"])
            card["runtime_config"]["total_kv_blocks"] = "lots"

        async def served_again(what: str) -> None:
            mark = outcomes.ok
            await asyncio.to_thread(
                wait_for_state, stack, lambda _: outcomes.ok >= mark + 2 * len(sessions),
                what, 90)

        async with agents_running(
                lambda session: agent_turns(client, session, stop, outcomes, max_tokens=24),
                sessions, client, stop, timeout=90):
            await asyncio.to_thread(
                wait_for_state, stack,
                lambda s: all(programs(s).get(x, {}).get("steps", 0) >= 2 for x in sessions),
                "two turns of every agent")
            await asyncio.to_thread(rewrite_card, stack, spoilt, spoil)
            state = await asyncio.to_thread(
                wait_for_state, stack, lambda s: str(spoilt) in s["unreadable_cards"],
                "the router to name the unreadable card", 30)
            assert "total_kv_blocks" in state["unreadable_cards"][str(spoilt)]
            assert "'lots'" in state["unreadable_cards"][str(spoilt)]
            await served_again("two more turns per agent beside the unreadable card")
            assert outcomes.errors == [], outcomes.errors
            # The watch still follows the other worker: killed, noticed; back, counted.
            stack.kill_worker(1)
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: s["live_workers"] == [spoilt],
                "the router to notice the killed worker despite the unreadable card", 60)
            await asyncio.to_thread(stack.restart_worker, 1)
            replacement = stack.worker_instances()[1]
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: capacity_known(s, replacement),
                "the replacement worker's capacity in the router's view", 60)
            await served_again("two more turns per agent on the replacement worker")
        # Turns sent while no worker Dynamo could route to was up failed with an error (a
        # timeout or an empty message would have failed the agent).
        log = stack.router.log_path.read_text(errors="replace")
        assert "workers.card_unreadable" in log and str(spoilt) in log
        # A readable card again: the worker's capacity is back and nothing is named.
        rewrite_card(stack, spoilt, lambda card: card["runtime_config"].update(saved))
        await asyncio.to_thread(
            wait_for_state, stack,
            lambda s: not s["unreadable_cards"] and capacity_known(s, spoilt),
            "the worker's capacity back once its card reads", 30)
        assert other not in get_state(stack)["live_workers"]
        settles(stack, "an unreadable model card")


# ---- the router killed and restarted -------------------------------------------------------
async def test_router_killed_and_restarted_mid_load_serves_again_with_a_fresh_table(
        tmp_path: Path) -> None:
    with start_stack(tmp_path) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        client = async_client(stack, timeout=30)
        outcomes = Outcomes()
        stop = asyncio.Event()

        async def agent(session: str) -> None:
            await agent_turns(client, session, stop, outcomes, max_tokens=16, retry_after=0.35)

        sessions = [f"restart-{i}" for i in range(4)]
        async with agents_running(agent, sessions, client, stop, timeout=60):
            await asyncio.to_thread(wait_for_state, stack,
                                    lambda s: s["router"]["completed"] >= 12, "some turns")
            await asyncio.to_thread(stack.restart_router)
            mark = outcomes.ok
            # The frontend finds the new router (the old one's registration lapses).
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: outcomes.ok >= mark + 8,
                "agents served again after the restart", 90)
        # The new router knows only what it saw since it started (no persisted table).
        settles(stack, "a router restart")


# ---- the router frozen past its discovery lease ----------------------------------------------
async def test_a_router_frozen_past_its_discovery_lease_is_routed_to_again(
        tmp_path: Path) -> None:
    # File discovery deletes a registration not renewed for 10 s, and Dynamo 1.6.1 never
    # writes it again: the frontend answered 404 for the model until the router was
    # restarted (a machine-wide stall did it once in CI). The router writes it back.
    import openai

    from dynamo_thunderagent.stack.process import signal_group

    with start_stack(tmp_path) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        router = stack.router
        instances = stack.kv_dir / "v1" / "instances"

        def router_listed() -> bool:
            return any("router" in unquote(path.name) for path in instances.iterdir())

        with sync_client(stack, timeout=30) as client:
            chat(client, [{"role": "user", "content": turn_text("frozen", 0)}],
                 session="frozen")
            assert router_listed()
            # The router has copied its registration (both files) before it freezes.
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: len(s["registration"]["keys"]) == 2,
                "the router's copy of its registration")
            signal_group(router, signal.SIGSTOP)
            try:
                # Another process expires it once it is 10 s old.
                await asyncio.to_thread(
                    wait_for_condition, lambda: not router_listed(),
                    "the frozen router's registration to expire", 60)
            finally:
                signal_group(router, signal.SIGCONT)
            def served_again() -> bool:
                try:
                    chat(client, [{"role": "user", "content": turn_text("frozen", 1)}],
                         session="frozen")
                except (openai.NotFoundError, openai.InternalServerError) as error:
                    # Not routed to yet: 404 until the frontend lists the model again, then
                    # a 503 or two while its new client for the router finds the instance
                    # (seen once in CI, 0.2 s after the model came back).
                    if getattr(error, "status_code", None) not in (404, 503):
                        raise
                    return False
                return True

            await asyncio.to_thread(wait_for_condition, served_again,
                                    "the router to be routed to again", 20)
        state = get_state(stack)
        assert state["registration"]["restored"] >= 2, state["registration"]
        assert router_listed()
        settles(stack, "a frozen router")


def wait_for_condition(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


# ---- a storm of clients leaving: streaming or not, running or waiting for admission -------
async def test_a_storm_of_disconnects_leaves_nothing_behind(tmp_path: Path) -> None:
    # Small KV pools and slow decoding: many requests wait for admission or are mid-stream
    # when their client goes.
    # Pausing on (as in the parity policy) so that the admission gate holds requests back.
    policy = extended_policy(tmp_path / "storm.yaml", scheduler_interval_seconds=0.5,
                             pause_min_recompute_ratio=None)
    with start_stack(tmp_path, num_gpu_blocks=96, speedup_ratio=1.0, policy=policy) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        client = async_client(stack, timeout=60)
        rng = random.Random(7)
        outcomes = Outcomes()

        async def request(session: str, stream: bool, sessionless: bool) -> None:
            import openai

            try:
                reply = await client.chat.completions.create(
                    model=MODEL, max_tokens=120, stream=stream,
                    messages=[{"role": "user", "content": turn_text(session, 0, words=150)}],
                    extra_headers={} if sessionless else {SESSION: session})
                if stream:
                    async for _ in reply:
                        pass
                outcomes.ok += 1
            except openai.APIError as error:
                outcomes.record_error(error)

        # One in five is another tenant's request without a session id: while it runs,
        # its prompt's room is held off its rank (sessionless_kv: reserve).
        sessionless = {i for i in range(40) if i % 5 == 0}
        tasks = [asyncio.create_task(request(f"storm-{i}", stream=i % 2 == 0,
                                             sessionless=i in sessionless))
                 for i in range(40)]
        await asyncio.sleep(0.5)
        deferred = (await asyncio.to_thread(get_state, stack))["scheduler"]["deferred_requests"]
        # A sessionless request's room is held from its first chunk (its prefill is done).
        await asyncio.to_thread(
            wait_for_state, stack, lambda s: any(s["scheduler"]["sessionless_tokens"]),
            "room held for a running sessionless request", 20)
        # Every sessionless client leaves, with 22 of the others.
        others = [task for i, task in enumerate(tasks) if i not in sessionless]
        leaving = [tasks[i] for i in sorted(sessionless)] + rng.sample(others, 22)
        rng.shuffle(leaving)
        for task in leaving:
            task.cancel()  # the connection closes: the client went away
            await asyncio.sleep(rng.uniform(0.0, 0.05))
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        state = settles(stack, "a disconnect storm", timeout=90)
        assert deferred > 0, "no request was waiting for admission during the storm"
        assert state["router"]["aborted"] + state["router"]["cancelled"] > 0


# ---- requests the engine refuses, prompts larger than any worker ---------------------------
def test_engine_refusals_and_oversize_prompts_get_clear_errors_and_book_nothing(
        tmp_path: Path) -> None:
    import openai

    with start_stack(tmp_path, mocker_args=["--max-model-len", "1024"]) as stack:
        wait_until_ready(stack, 2)
        with sync_client(stack) as client:
            chat(client, [{"role": "user", "content": turn_text("agent", 0)}], session="agent")
            baseline = sum(r["usage_tokens"] for r in get_state(stack)["scheduler"]
                           ["ranks"].values())
            for i in range(9):  # ~1,500 tokens: fits the KV pool, not the engine's limit
                with pytest.raises(openai.BadRequestError) as refused:
                    chat(client, [{"role": "user", "content": "word " * 450}],
                         session=f"too-long-{i}" if i % 3 else "agent")
                assert "refused by the engine" in str(refused.value)
                assert "exceeds worker admission limits" in str(refused.value)
            for words in (1_500, 5_000):  # more tokens than any worker's 4,096
                with pytest.raises(openai.BadRequestError) as refused:
                    chat(client, [{"role": "user", "content": "word " * words}],
                         session="huge")
                message = str(refused.value)
                assert "more than the KV capacity of any worker/rank" in message
                assert "largest: 4096 tokens" in message
            state = get_state(stack)
            usage = sum(r["usage_tokens"] for r in state["scheduler"]["ranks"].values())
            assert usage == baseline, "refused requests were booked as usage"
            assert set(programs(state)) == {"agent"}
        settles(stack, "engine refusals")


# Each worker's own mocker flags. "pools": 128 and 1,024 blocks (2,048 and 16,384 tokens);
# "context": 512 blocks each, the first engine limited to 2,048 tokens.
UNEQUAL_WORKERS = {
    "pools": [["--num-gpu-blocks-override", "128"], ["--num-gpu-blocks-override", "1024"]],
    "context": [["--num-gpu-blocks-override", "512", "--max-model-len", "2048"],
                ["--num-gpu-blocks-override", "512"]],
}


@pytest.mark.parametrize("unequal", sorted(UNEQUAL_WORKERS))
def test_programs_that_outgrow_a_small_worker_carry_on_on_a_larger_one(
        tmp_path: Path, unequal: str) -> None:
    # Four sessions whose prompts grow by about 800 tokens a turn to about 8,000 ("pools")
    # or 5,000 ("context"). Before, a program placed on the small worker stayed pinned there
    # once it outgrew its 2,048 tokens, and its engine refused every later turn ("request
    # exceeds worker admission limits"): a wedged session (found by a probe; stock's KV
    # router answered those turns with a 500).
    stack = start_stack(tmp_path, worker_args=UNEQUAL_WORKERS[unequal])
    steps = 10 if unequal == "pools" else 6
    with stack:
        wait_until_ready(stack, 2)
        small = str(sorted(stack.worker_instances().items())[0][1])
        with sync_client(stack) as client:
            prompts = {f"g{i}": "" for i in range(4)}
            placed_small = set()
            for step in range(steps):
                for session in prompts:
                    prompts[session] += f" step {step} " + " ".join(
                        f"{session}w{j}" for j in range(150))
                    reply = chat(client, [{"role": "user", "content": prompts[session]}],
                                 session=session)
                    assert reply.choices[0].finish_reason == "length", reply
                    worker = programs(get_state(stack))[session]["worker"]
                    if step == 0 and worker.startswith(f"{small}/"):
                        placed_small.add(session)
            assert placed_small, "no program started on the small worker"
            state = get_state(stack)
            assert not any(p["worker"].startswith(f"{small}/")
                           for p in programs(state).values())
            assert state["scheduler"]["counters"]["outgrown_moves"] >= len(placed_small)
            assert state["router"]["errors"] == 0
        settles(stack, f"programs outgrowing a small worker ({unequal})")


def test_a_deployment_whose_only_worker_prefills_answers_with_an_error_not_one_token(
        tmp_path: Path) -> None:
    # The router sends a prefill-only worker nothing (it would answer with the first token
    # alone); with no other worker, a request gets an error that says why, whether or not
    # it has a session, and a decode-capable worker that joins serves the next ones.
    import openai

    with start_stack(tmp_path, num_workers=1,
                     worker_args=[["--disaggregation-mode", "prefill"]]) as stack:
        wait_for_state(stack, lambda s: len(s["prefill_only_workers"]) == 1,
                       "the prefill worker's card")
        with sync_client(stack, timeout=30) as client:
            for session in (None, "waits-for-a-decoder"):
                with pytest.raises(openai.InternalServerError):
                    chat(client, [{"role": "user", "content": "hi"}], session=session)
        router_log = stack.router.log_path.read_text(errors="replace")
        assert "no live worker that decodes serves this model" in router_log
        stack.start_worker_command("aggregated", stack._mocker_argv())
        wait_until_ready(stack, 1)
        settles(stack, "a prefill-only worker alone")


# ---- an engine that refuses, fails or cuts one request ---------------------------------------
def start_fault_worker(stack: Any) -> int:
    """Add a worker whose engine fails requests on demand (``fault_engine.py``, a real Dynamo
    worker); return its instance id once the router sees every worker live."""
    argv = [stack.config.python, str(Path(__file__).with_name("fault_engine.py")),
            "--model-path", str(stack.model_path),
            "--served-model-name", stack.config.model_name,
            "--endpoint", stack.worker_endpoint,
            "--blocks", str(stack.config.num_gpu_blocks),
            "--block-size", str(stack.config.block_size)]
    stack.start_worker_command("fault-worker", argv)
    wait_until_ready(stack, len(stack.workers))
    return int(stack.worker_instances()[len(stack.workers) - 1])


def sessions_on(client: Any, worker: int, count: int) -> list[str]:
    """Start new sessions (``agent-0``, ``agent-1``, ...; one turn each) until ``count`` of
    them run on ``worker``, at most 12; return those."""
    on_worker: list[str] = []
    for i in range(12):  # new programs go to the less busy worker: about every other
        session = f"agent-{i}"
        reply = chat(client, [{"role": "user", "content": turn_text(session, 0)}],
                     session=session)
        if serving_worker(reply) == worker:
            on_worker.append(session)
        if len(on_worker) == count:
            return on_worker
    pytest.fail(f"fewer than {count} of 12 new programs on {worker}")


def test_an_engine_s_refusal_failure_and_cut_stream_each_end_once_and_cost_no_worker(
        tmp_path: Path) -> None:
    # A mocker and a worker whose engine, asked by max_tokens, refuses a request
    # (InvalidArgument), fails one (Unknown) or stops streaming midway. A refusal reaches
    # the client as a 400 with the engine's reason; a failed request goes on on the other
    # worker, and the worker that failed it is not put aside (it is there and answers); a
    # cut stream goes on on the other worker, so the client sees one whole answer, or, with
    # no other worker, ends in a 500 rather than a 200 that looks whole.
    import openai
    from fault_engine import CUT, FAIL, REFUSAL_TEXT, REFUSE

    with start_stack(tmp_path, num_workers=1) as stack:
        fault = start_fault_worker(stack)
        with sync_client(stack) as client:
            def turn(session: str, k: int, max_tokens: int = 8) -> Any:
                return chat(client, [{"role": "user", "content": turn_text(session, k)}],
                            session=session, max_tokens=max_tokens)

            refused, failed, cut = sessions_on(client, fault, 3)

            with pytest.raises(openai.BadRequestError) as refusal:
                turn(refused, 1, REFUSE)
            assert REFUSAL_TEXT in str(refusal.value) and str(fault) in str(refusal.value)
            assert programs(get_state(stack))[refused]["worker"].startswith(f"{fault}/")

            def failovers() -> int:
                return int(get_state(stack)["router"]["failovers"])

            before = failovers()
            reply = turn(failed, 1, FAIL)  # its program is on the fault worker until now
            assert reply.choices[0].finish_reason == "length"
            assert serving_worker(reply) != fault and failovers() == before + 1
            state = get_state(stack)
            assert state["unreachable_workers"] == [] and fault in state["live_workers"]
            assert serving_worker(turn(refused, 1)) == fault  # still served there at once

            reply = turn(cut, 1, CUT)
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage is not None and reply.usage.completion_tokens == CUT
            assert serving_worker(reply) != fault and failovers() == before + 2
            state = get_state(stack)
            assert state["unreachable_workers"] == [] and fault in state["live_workers"]
            assert serving_worker(turn(refused, 2)) == fault

            stack.end_process(stack.workers[0])  # the mocker: the fault worker is alone
            wait_for_state(stack, lambda s: s["live_workers"] == [fault],
                           "the router to see only the fault worker", 60)
            with pytest.raises(openai.InternalServerError):
                turn(refused, 3, CUT)
        failed_lines = [line for line in stack.router.log_path.read_text(
            errors="replace").splitlines() if "request.failed" in line]
        assert any("StreamCut" in line for line in failed_lines), failed_lines
        settles(stack, "an engine's refusal, failure and cut stream")


async def test_queued_turns_the_engine_refuses_fails_or_cuts_end_once_and_free_the_queue(
        tmp_path: Path) -> None:
    # With ``concurrent_turns: queue``, a turn sent while its session's turn runs waits for
    # it. A queued turn that the engine then refuses, fails or cuts short ends as one sent on
    # its own would (a 400 with the engine's reason; a whole answer from the other worker)
    # and lets the turn queued behind it run: nothing waits on a turn that ended in error.
    import openai
    from fault_engine import CUT, FAIL, REFUSAL_TEXT, REFUSE

    policy = extended_policy(tmp_path / "queue.yaml", scheduler_interval_seconds=0.5,
                             concurrent_turns="queue")
    with start_stack(tmp_path, num_workers=1, policy=policy) as stack:
        fault = start_fault_worker(stack)
        with sync_client(stack) as sync:
            sessions = sessions_on(sync, fault, 3)
        client = async_client(stack, timeout=60)

        async def turn(session: str, max_tokens: int) -> Any:
            return await client.chat.completions.create(
                model=MODEL, max_tokens=max_tokens, extra_headers={SESSION: session},
                extra_body=ENGINE_DATA,
                messages=[{"role": "user", "content": turn_text(session, max_tokens)}])

        def tracked(count: int) -> Callable[[State], bool]:
            return lambda s: s["scheduler"]["tracked_requests"] == count

        try:
            for session, fault_kind in zip(sessions, (REFUSE, FAIL, CUT), strict=True):
                running = asyncio.create_task(turn(session, 3_000))  # ~3 s on the engine
                await asyncio.to_thread(wait_for_state, stack, tracked(1), "a turn running")
                queued = asyncio.create_task(turn(session, fault_kind))
                await asyncio.to_thread(wait_for_state, stack, tracked(2), "a turn queued")
                behind = asyncio.create_task(turn(session, 8))
                await asyncio.to_thread(wait_for_state, stack, tracked(3), "another queued")
                assert not running.done() and not queued.done()
                assert (await running).usage.completion_tokens == 3_000
                if fault_kind == REFUSE:
                    with pytest.raises(openai.BadRequestError, match=REFUSAL_TEXT):
                        await queued
                else:  # failed over: a whole answer from the mocker
                    reply = await queued
                    assert reply.usage.completion_tokens == fault_kind
                    assert serving_worker(reply) != fault
                assert (await behind).usage.completion_tokens == 8
        finally:
            await client.close()
        state = await asyncio.to_thread(settles, stack, "queued turns that fail")
        assert state["router"]["failovers"] == 2


def test_a_client_that_leaves_a_turn_its_engine_never_answers_ends_it_and_its_session_goes_on(
        tmp_path: Path) -> None:
    # The engine sends nothing for the turn and never ends it; its client gives up. Dynamo
    # stops the request's context but cancels nothing of a handler waiting for a chunk:
    # before the fix the turn stayed in flight for ever, its room booked, and the session's
    # final (and, with queued turns, its next turns) waited behind it. The engine's own
    # request is cancelled once the router drops the stream (read on demand).
    import openai
    from fault_engine import SILENT

    with start_stack(tmp_path, num_workers=1) as stack:
        fault = start_fault_worker(stack)
        with sync_client(stack) as client:
            (session,) = sessions_on(client, fault, 1)
        with sync_client(stack, timeout=3) as impatient, pytest.raises(openai.APITimeoutError):
            chat(impatient, [{"role": "user", "content": turn_text(session, 1)}],
                 session=session, max_tokens=SILENT)
        wait_for_state(stack, lambda s: s["in_flight"] == 0
                       and s["scheduler"]["tracked_requests"] == 0,
                       "the abandoned turn to end", 30)
        # ...and the worker is told: its request is cancelled, as stock's frontend cancels it
        # (before, the engine kept it for ever: a stuck engine stayed stuck behind it).
        worker_log = stack.workers[-1].log_path
        deadline = time.monotonic() + 15
        while "request cancellation received" not in worker_log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                pytest.fail("the fault worker was never told its abandoned request was "
                            "cancelled; its log ends:\n"
                            + worker_log.read_text(errors="replace")[-2000:])
            time.sleep(0.2)
        with sync_client(stack, timeout=30) as client:
            reply = chat(client, [{"role": "user", "content": turn_text(session, 2)}],
                         session=session)
            assert reply.choices[0].finish_reason == "length"
        settles(stack, "a turn its engine never answered")


def test_a_turn_its_mocker_never_starts_is_cancelled_when_its_client_leaves(
        tmp_path: Path) -> None:
    # A turn that asks for more tokens than the worker's whole KV pool is never started:
    # the mocker holds it and sends nothing. Its client gives up. Before the router read
    # the worker's stream on demand, that request stayed on the worker (nothing told it
    # the client had left), and turns placed there after it hung behind it (a
    # hostile-input probe: 4 of 8 new sessions on 2 workers timed out; stock served all 8).
    import openai

    with start_stack(tmp_path, num_workers=1) as stack:
        wait_until_ready(stack, 1)
        never_started = 60_000  # tokens: about 15 times the pool (256 blocks x 16)
        # Streamed, as agents ask: the frontend then stops the request when its client
        # leaves (a unary request is killed, which reached the worker before).
        with sync_client(stack, timeout=3) as impatient, pytest.raises(
                openai.APITimeoutError):
            for _ in chat(impatient, [{"role": "user", "content": turn_text("never-started", 0)}],
                          session="never-started", max_tokens=never_started, stream=True):
                pass
        wait_for_state(stack, lambda s: s["in_flight"] == 0
                       and s["scheduler"]["tracked_requests"] == 0,
                       "the abandoned turn to end", 30)
        with sync_client(stack, timeout=30) as client:
            for i in range(4):  # every one on the worker that held the abandoned turn
                session = f"after-never-started-{i}"
                reply = chat(client, [{"role": "user", "content": turn_text(session, 0)}],
                             session=session)
                assert reply.choices[0].finish_reason == "length"
        settles(stack, "a turn its mocker never started")


# ---- a bounded flood of session ids -----------------------------------------------------------
async def test_a_flood_of_session_ids_stays_bounded_and_loses_nothing(tmp_path: Path) -> None:
    with start_stack(tmp_path, policy=extended_policy(
            tmp_path / "flood.yaml", scheduler_interval_seconds=0.5,
            max_tracked_requests=150)) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        client = async_client(stack, timeout=60)
        outcomes = Outcomes()
        limit = asyncio.Semaphore(24)

        async def one(i: int) -> None:
            import openai

            async with limit:
                try:
                    await client.chat.completions.create(
                        model=MODEL, max_tokens=4,
                        messages=[{"role": "user", "content": f"flood {i}"}],
                        extra_headers={SESSION: f"flood-{i}"})
                    outcomes.ok += 1
                except openai.APIError as error:
                    outcomes.record_error(error)

        await asyncio.gather(*(one(i) for i in range(600)))
        await client.close()
        state = await asyncio.to_thread(get_state, stack)
        assert outcomes.ok == 600, outcomes.errors[:5]
        assert len(programs(state)) <= 150
        assert state["scheduler"]["counters"]["evicted"] >= 450
        await asyncio.to_thread(settles, stack, "a session-id flood")


# ---- malformed session headers -------------------------------------------------------------
def test_session_headers_outside_the_accepted_syntax(tmp_path: Path) -> None:
    import openai

    with start_stack(tmp_path) as stack:
        wait_until_ready(stack, 2)
        with sync_client(stack) as client:
            for bad in ("x" * 257, "x" * 8192, "x" * 65536):
                with pytest.raises(openai.BadRequestError) as refused:
                    chat(client, [{"role": "user", "content": "hi"}], session=bad)
                assert "must be 1 to 256 printable ASCII characters" in str(refused.value)
            # Dynamo's frontend drops blank and non-ASCII ids before the router sees them:
            # such requests are served without a session (documented in docs/reliability.md).
            for dropped in ("",):
                reply = chat(client, [{"role": "user", "content": "hi"}], session=dropped)
                assert reply.choices[0].finish_reason == "length"
            # The final header: "true" ends the session; anything else is an ordinary turn
            # (the frontend keeps only true-like values).
            chat(client, [{"role": "user", "content": "hi"}], session="finals")
            for value in ("garbage", "", "false"):
                reply = client.chat.completions.create(
                    model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                    extra_headers={SESSION: "finals", SESSION_FINAL: value})
                assert reply.choices[0].finish_reason == "length"
            assert "finals" in programs(get_state(stack))
            end_session(client, "finals")
            assert "finals" not in programs(get_state(stack))
            served = serving_worker(chat(client, [{"role": "user", "content": "x"}],
                                         session="ok-" + "a" * 253))
            assert served in stack.worker_instances().values()
            # A readable id with spaces is a session like any (stock serves it too).
            chat(client, [{"role": "user", "content": "x"}], session="user 42 task 7")
            assert "user 42 task 7" in programs(get_state(stack))
        state = settles(stack, "bad session headers")
        assert state["router"]["rejected"] == 3


# ---- one session flooding its own queue ------------------------------------------------------
def session_turns(client: Any, outcomes: Outcomes,
                  session: str) -> Callable[[int], Awaitable[None]]:
    """Sends one turn of ``session`` asking for ``max_tokens``; records what came back."""
    import openai

    async def turn(max_tokens: int) -> None:
        try:
            await client.chat.completions.create(
                model=MODEL, max_tokens=max_tokens, extra_headers={SESSION: session},
                messages=[{"role": "user", "content": "again"}])
            outcomes.ok += 1
        except openai.APIError as error:
            outcomes.record_error(error)

    return turn


@contextlib.asynccontextmanager
async def a_long_turn_in_flight(
        tmp_path: Path, session: str, **policy: Any,
) -> AsyncIterator[tuple[Any, Callable[[int], Awaitable[None]], Outcomes, asyncio.Task[None]]]:
    """A stack at speedup 1 (the extended policy with ``policy`` changed) with one long
    turn of ``session`` on a worker; yields the stack, a function sending more turns of the
    session, what they got back, and the long turn's task. The client closes at the end."""
    path = extended_policy(tmp_path / "session.yaml", scheduler_interval_seconds=0.5, **policy)
    with start_stack(tmp_path, policy=path, speedup_ratio=1.0) as stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        client = async_client(stack, timeout=60)
        outcomes = Outcomes()
        turn = session_turns(client, outcomes, session)
        holder = asyncio.create_task(turn(300))  # seconds on the worker at speedup 1
        await asyncio.to_thread(
            wait_for_state, stack, lambda s: s["in_flight"] == 1, "the first turn in flight")
        try:
            yield stack, turn, outcomes, holder
        finally:
            await client.close()


async def test_a_session_cannot_queue_more_than_its_bound_and_its_queue_still_drains(
        tmp_path: Path) -> None:
    async with a_long_turn_in_flight(tmp_path, "greedy", max_turns_per_session=4,
                                     concurrent_turns="queue") as (stack, turn, outcomes, holder):
        await asyncio.gather(*(turn(4) for _ in range(6)), holder)
        assert outcomes.ok == 4, outcomes.errors  # the turn in flight and 3 queued behind it
        assert len(outcomes.errors) == 3
        assert all("max_turns_per_session=4" in e for e in outcomes.errors), outcomes.errors
        await asyncio.to_thread(settles, stack, "a session over its turn bound")


async def test_a_session_final_goes_through_while_every_request_slot_is_taken(
        tmp_path: Path) -> None:
    # Every tracked-request slot held by turns running or queued: ending an idle session, or
    # one the router never saw, needs no slot and is served; a new session's turn is
    # refused naming the limit. (Before, the finals got "retry later" too, and the finished
    # program kept its charge on its rank until it expired.)
    import openai

    async with a_long_turn_in_flight(tmp_path, "greedy", max_tracked_requests=3,
                                     concurrent_turns="queue") as (stack, turn, outcomes, holder):
        client = async_client(stack, timeout=60)
        try:
            await session_turns(client, outcomes, "idle")(4)  # one turn, then idle
            other = asyncio.create_task(session_turns(client, outcomes, "other")(300))
            queued = asyncio.create_task(turn(4))  # behind greedy's running turn
            await asyncio.to_thread(
                wait_for_state, stack,
                lambda s: s["scheduler"]["tracked_requests"] == 3 and s["in_flight"] == 2,
                "three requests tracked: two running, one queued")
            for session in ("idle", "never-seen"):
                reply = await client.chat.completions.create(
                    model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "done"}],
                    extra_headers={SESSION: session, SESSION_FINAL: "true"})
                assert reply.usage is not None and reply.usage.completion_tokens == 0, reply
            state = get_state(stack)
            assert "idle" not in programs(state) and state["router"]["session_final"] == 2
            with pytest.raises(openai.BadRequestError, match="max_tracked_requests=3"):
                await client.chat.completions.create(
                    model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                    extra_headers={SESSION: "newcomer"})
            await asyncio.gather(holder, other, queued)
        finally:
            await client.close()
        assert outcomes.errors == [] and outcomes.ok == 4
        await asyncio.to_thread(settles, stack, "a session-final at the request bound")


async def test_a_second_session_final_is_answered_at_once_while_the_first_waits(
        tmp_path: Path) -> None:
    # A final sent twice (a retry, a harness's cleanup beside the agent's own) while the
    # session's turn runs: the first waits for the turn, the second is answered at once
    # (before: 400 "already ending" while the first waited, 200 after, by timing alone).
    async with a_long_turn_in_flight(tmp_path, "ending") as (stack, _turn, outcomes, holder):
        client = async_client(stack, timeout=60)

        async def final() -> Any:
            return await client.chat.completions.create(
                model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "done"}],
                extra_headers={SESSION: "ending", SESSION_FINAL: "true"})

        try:
            first = asyncio.create_task(final())
            await asyncio.to_thread(
                wait_for_state, stack, lambda s: s["scheduler"]["tracked_requests"] == 2,
                "the first final waiting behind the turn")
            again = await final()
            assert again.usage is not None and again.usage.completion_tokens == 0, again
            assert not first.done() and not holder.done()
            await asyncio.gather(holder, first)
        finally:
            await client.close()
        assert outcomes.ok == 1 and outcomes.errors == []
        state = await asyncio.to_thread(settles, stack, "a session-final sent twice")
        assert state["router"]["session_final"] >= 2 and state["router"]["rejected"] == 0


async def test_a_session_final_whose_client_leaves_still_ends_the_session(
        tmp_path: Path) -> None:
    # A harness that sends the final and gives up on it at once (it exits, or its timeout
    # is short) while the session's last turn runs: the session still ends when that turn
    # does (before: the final was dropped with its client, and the finished program stayed
    # in the table, with its charge, until retention expired it).
    import openai

    async with a_long_turn_in_flight(tmp_path, "leaving") as (stack, _turn, outcomes, holder):
        impatient = async_client(stack, timeout=2)
        try:
            with pytest.raises(openai.APITimeoutError):
                await impatient.chat.completions.create(
                    model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "done"}],
                    extra_headers={SESSION: "leaving", SESSION_FINAL: "true"})
        finally:
            await impatient.close()
        await asyncio.to_thread(
            wait_for_state, stack, lambda s: s["router"]["cancelled"] == 1,
            "the final's client gone")
        assert not holder.done() and "leaving" in programs(get_state(stack))
        await holder
        await asyncio.to_thread(
            wait_for_state, stack, lambda s: "leaving" not in programs(s),
            "the session ended with its turn")
        assert outcomes.ok == 1 and outcomes.errors == []
        await asyncio.to_thread(settles, stack, "a session-final whose client left")


async def test_a_sessions_concurrent_turns_run_alongside_with_the_extended_policy(
        tmp_path: Path) -> None:
    # The shipped extended policy (concurrent_turns: alongside): a turn sent while its
    # session's turn is on a worker runs at once, beside it on the same worker/rank;
    # every turn completes and nothing is left tracked.
    async with a_long_turn_in_flight(tmp_path, "parallel") as (stack, turn, outcomes, holder):
        others = [asyncio.create_task(turn(300)) for _ in range(3)]
        both = await asyncio.to_thread(
            wait_for_state, stack, lambda s: s["in_flight"] == 4,
            "the three later turns forwarded while the first runs")
        assert both["scheduler"]["counters"]["alongside"] == 3
        assert not holder.done()
        await asyncio.gather(holder, *others)
        assert outcomes.ok == 4 and outcomes.errors == []
        await asyncio.to_thread(settles, stack, "turns alongside")


# ---- the frontend's port taken before it binds it ---------------------------------------------
def test_a_frontend_port_taken_before_the_frontend_binds_it_gets_another(tmp_path: Path) -> None:
    import socket

    stack = start_stack(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        stack.http_port = taken  # as when another process takes the port picked for it
        with stack:
            wait_until_ready(stack, 2)
            assert stack.http_port != taken
            assert "already in use" in (tmp_path / "run" / "logs" / "frontend.log").read_text()
            with sync_client(stack) as client:
                chat(client, [{"role": "user", "content": turn_text("a", 0)}], session="a")
            settles(stack, "a frontend restarted on another port")
