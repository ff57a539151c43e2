"""The router's Prometheus metrics against real Dynamo processes (docs/metrics.md).

A run that pauses and resumes programs (agents past the KV capacity of two tiny mocker
workers) is scraped while it runs and after it ends, on both places the metrics are served:
the router's state port (GET /metrics) and its Dynamo system server (DYN_SYSTEM_PORT, where
the runtime's metrics callback adds ours to the component's own). The counters must equal
the decisions the scheduler reports in /state, and the gauges its state.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from conftest import (
    E2E_MARKS,
    MODEL,
    async_wait_for_state,
    counters,
    get_state,
    idle,
    run_agents,
    wait_until_ready,
    write_policy,
)

pytestmark = E2E_MARKS

PREFIX = "dynamo_component_thunderagent"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of ours at ``url``, by (name, labels less dynamo_namespace and model)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX):
                continue
            labels = dict(sample.labels)
            assert labels.pop("model") == MODEL and labels.pop("dynamo_namespace")
            found[sample.name, tuple(sorted(labels.items()))] = sample.value
    return found


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items()
               if n == f"{PREFIX}_{name}" and want <= set(ls))


def reasons(samples: Samples, name: str) -> dict[str, float]:
    return {dict(ls)["reason"]: v for (n, ls), v in samples.items() if n == f"{PREFIX}_{name}"}


async def test_metrics_move_as_the_scheduler_decided_during_a_run_that_pauses_and_resumes(
    tmp_path: Path,
) -> None:
    from dynamo_thunderagent.stack.launcher import LocalStack

    agents, turns = 6, 6
    policy = write_policy(tmp_path / "policy.yaml", scheduler_interval_seconds=0.5,
                          resume_timeout_seconds=30)
    # 2 workers x 64 blocks x 16 tokens (about 1,000 tokens each) for six agents of about
    # 500 tokens each: the scheduler must pause some and resume them later.
    stack = LocalStack(arm="ours", num_workers=2, num_gpu_blocks=64, block_size=16,
                       speedup_ratio=1.0, policy=policy, run_dir=tmp_path / "run",
                       startup_timeout_s=120.0)
    with stack:
        await asyncio.to_thread(wait_until_ready, stack, 2)
        assert stack.state_url is not None
        state_metrics = stack.state_url.replace("/state", "/metrics")
        system_metrics = stack.metrics_urls["router"]
        # Scrape while the agents run: the paused-programs gauge and the pause counter
        # must be seen moving, and counters never go back.
        seen_paused = 0.0
        pauses_seen: list[float] = []
        run = asyncio.ensure_future(run_agents(stack, "metrics", agents, turns))
        while not run.done():
            during = await asyncio.to_thread(scrape, state_metrics)
            seen_paused = max(seen_paused, total(during, "programs", lifecycle="paused"))
            pauses_seen.append(total(during, "program_pauses_total"))
            await asyncio.wait({run}, timeout=0.2)
        await run
        assert pauses_seen == sorted(pauses_seen), f"a counter went back: {pauses_seen}"
        assert seen_paused > 0, "no scrape saw a paused program"

        state = await async_wait_for_state(stack, idle, "every program to be released")
        after = await asyncio.to_thread(scrape, state_metrics)
        c = counters(state)
        assert c["pauses"] > 0 and c["resumes"] > 0, f"the run did not pause and resume: {c}"

        # Counters: the decisions the scheduler made, reason by reason.
        pauses = reasons(after, "program_pauses_total")
        assert sum(v for r, v in pauses.items() if r != "idle") == c["pauses"], (pauses, c)
        assert pauses.get("idle", 0) == c["idle_pauses"]
        resumes = reasons(after, "program_resumes_total")
        assert sum(resumes.values()) == c["resumes"], (resumes, c)
        assert resumes.get("resume_timeout", 0) == c["forced_resumes"]
        assert total(after, "program_moves_total") == c["moves"]
        assert total(after, "program_expiries_total") == c["expired"]
        assert total(after, "program_evictions_total") == c["evicted"]
        assert total(after, "rejections_total") == c["rejected"] == 0
        assert total(after, "program_ends_total", reason="session_final") == agents
        router = state["router"]
        assert total(after, "requests_total", outcome="completed") == router["completed"]
        assert router["completed"] == agents * turns
        assert total(after, "admission_wait_seconds_count") == agents * turns
        assert total(after, "prompt_tokens_total") == router["prompt_tokens"] > 0
        assert total(after, "cached_tokens_total") == router["cached_tokens"]
        assert total(after, "tick_duration_seconds_count") > 0

        # Gauges: the scheduler's state now (idle: nothing tracked, nothing charged).
        assert total(after, "programs") == 0 and total(after, "tracked_requests") == 0
        assert total(after, "waiting_requests") == 0
        for rank, figures in get_state(stack)["scheduler"]["ranks"].items():
            worker_id, dp_rank = rank.split("/")
            labels = {"worker_id": worker_id, "dp_rank": dp_rank}
            assert total(after, "worker_capacity_tokens", **labels) == figures["capacity_tokens"]
            assert total(after, "worker_usage_tokens", **labels) == figures["usage_tokens"] == 0

        # The same registry on the component's Dynamo system server.
        assert system_metrics is not None
        system = await asyncio.to_thread(scrape, system_metrics)
        assert reasons(system, "program_pauses_total") == pauses
        assert total(system, "program_resumes_total") == c["resumes"]
