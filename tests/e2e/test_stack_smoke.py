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
