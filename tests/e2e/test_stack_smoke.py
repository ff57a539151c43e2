"""End-to-end smoke test of the local stack: real mocker workers and the real Dynamo frontend."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import E2E_MARKS, group_gone

pytestmark = E2E_MARKS


def test_stock_stack_serves_a_chat_turn_and_stop_leaves_no_process(tmp_path: Path) -> None:
    import openai

    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig

    config = StackConfig(arm="stock", num_workers=2, run_dir=tmp_path / "run", startup_timeout_s=45)
    started = time.monotonic()
    with LocalStack(config) as stack:
        assert stack.url.startswith("http://127.0.0.1:")
        assert len(stack.workers) == 2
        assert len(stack.worker_instances()) == 2
        client = openai.OpenAI(base_url=stack.url, api_key="unused", timeout=20)
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "list the changed files"}],
            max_tokens=8,
            extra_headers={"X-Dynamo-Session-ID": "smoke-1"},
            extra_body={"nvext": {"extra_fields": ["worker_id"]}},
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 8
        served_by = (reply.model_extra or {}).get("nvext", {}).get("worker_id", {})
        assert served_by.get("decode_worker_id") in stack.worker_instances().values()
        pgids = [proc.pid for proc in stack.processes]
    assert all(group_gone(pgid) for pgid in pgids), "a stack process outlived stop()"
    assert time.monotonic() - started < 60


def test_stock_soft_affinity_keeps_each_session_on_its_worker_under_uneven_load(
        tmp_path: Path) -> None:
    """The simulator's stock arm routes a session's later turns where its first went
    (bench/sim/contract.py, ``kv_route``): this is the live behaviour it copies. Sessions
    bound to one worker decode long replies, those bound to the other short ones, and every
    later turn of a heavy session arrives while other heavy turns decode there: stock's soft
    affinity (default selector) still sends each turn to its session's worker."""
    import asyncio

    import openai

    from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig

    sessions, turns = 8, 3
    config = StackConfig(arm="stock", num_workers=2, run_dir=tmp_path / "run", startup_timeout_s=60)
    with LocalStack(config) as stack:
        client = openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=120)
        in_flight_heavy = 0
        overlapped = 0

        async def turn(session: int, max_tokens: int) -> int:
            reply = await client.chat.completions.create(
                model="tiny", max_tokens=max_tokens,
                messages=[{"role": "user", "content": f"agent {session} turn"}],
                extra_headers={"X-Dynamo-Session-ID": f"affinity-{session}"},
                extra_body={"nvext": {"extra_fields": ["worker_id"]}, "ignore_eos": True})
            served = (reply.model_extra or {}).get("nvext", {}).get("worker_id", {})
            return int(served["decode_worker_id"])

        async def run() -> tuple[dict[int, int], dict[int, list[int]]]:
            nonlocal in_flight_heavy, overlapped
            bound = dict(enumerate(await asyncio.gather(*(turn(s, 4) for s in range(sessions)))))
            heavy = min(bound.values())
            served: dict[int, list[int]] = {s: [] for s in range(sessions)}

            async def agent(session: int) -> None:
                nonlocal in_flight_heavy, overlapped
                is_heavy = bound[session] == heavy
                await asyncio.sleep(0.2 * session)
                for _ in range(turns):
                    if is_heavy:
                        overlapped += in_flight_heavy >= 1
                        in_flight_heavy += 1
                    try:
                        served[session].append(await turn(session, 300 if is_heavy else 4))
                    finally:
                        in_flight_heavy -= is_heavy

            await asyncio.gather(*(agent(s) for s in range(sessions)))
            return bound, served

        bound, served = asyncio.run(run())
    assert len(set(bound.values())) == 2, f"the first turns all went to one worker: {bound}"
    assert overlapped >= 3, "the heavy sessions' turns never overlapped: nothing was uneven"
    moved = {s: (bound[s], ws) for s, ws in served.items() if set(ws) != {bound[s]}}
    assert not moved, f"stock moved sessions off their first worker: {moved}"
