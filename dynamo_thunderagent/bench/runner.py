"""One benchmark run: start a local stack for an arm, drive closed-loop agents, stop, summarise.

Shared by ``dynamo-thunderagent demo`` (one run per arm) and ``bench live`` (arms x agent
counts x repeats). :func:`run_stack` never raises: a failing stack or driver is recorded in
:attr:`ArmResult.error` so that one bad arm does not hide the others.

A run is bounded in time: the stack's start-up timeout, then ``window_s`` of turns, at most
``drain_s`` for turns in flight, the driver's bounded release of unfinished agents, and the
stack's stop grace.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dynamo_thunderagent.bench.metrics import ArmMetrics, summarize
from dynamo_thunderagent.bench.workload import AgentPlan
from dynamo_thunderagent.stack.arms import arm_named
from dynamo_thunderagent.stack.figures import scheduler_figures

if TYPE_CHECKING:
    from dynamo_thunderagent.bench.records import RunResult
    from dynamo_thunderagent.bench.workload import Background
    from dynamo_thunderagent.stack.launcher import LocalStack


@dataclass
class ArmResult:
    """One run's outcome: metrics, scheduler figures, or why it failed.

    ``run`` keeps the driver's raw records for callers that need more than the summary (it is
    not part of :meth:`to_dict`).
    """

    arm: str
    metrics: ArmMetrics | None = None
    scheduler: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    agents_started: int = 0
    error: str | None = None
    run: RunResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "arm": self.arm,
            "elapsed_s": round(self.elapsed_s, 2),
            "agents_started": self.agents_started,
            "error": self.error,
        }
        if self.metrics is not None:
            data.update(self.metrics.to_dict())
        if self.scheduler:
            data["scheduler"] = self.scheduler
        return data


class RunObserver(Protocol):
    """Hooks around the driven part of a run (e.g. sampling a router's state, reading logs).

    ``start`` is called once the stack serves the model, right before the agents start;
    ``finish`` after the driver returned and before the stack stops (logs are still there).
    Whatever ``finish`` returns is merged into :attr:`ArmResult.scheduler`. Neither may raise
    for ordinary failures (a missing log, an unreachable endpoint): report ``None`` instead.
    """

    def start(self, stack: LocalStack) -> None: ...

    def finish(self, stack: LocalStack, run: RunResult) -> dict[str, Any]: ...


@dataclass
class RunSpec:
    """Everything one run depends on."""

    arm: str  # a name in stack.arms.ARMS
    plans: Callable[[], Iterator[AgentPlan]]  # a fresh stream per call (same seed, same agents)
    agents: int
    window_s: float
    warmup_s: float
    drain_s: float = 10.0
    tail_s: float = 0.0
    request_timeout_s: float = 60.0
    label: str | None = None  # name in results (default: arm)
    num_workers: int = 2
    num_gpu_blocks: int = 256
    block_size: int = 16
    speedup_ratio: float = 1.0
    policy: Path | None = None  # router-policy YAML (arms that take one; ignored by others)
    router_args: list[str] = field(default_factory=list)  # extra flags for its router
    mocker_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    job: str = "job"
    progress_interval_s: float = 10.0
    background: Background | None = None  # sessionless requests beside the agents
    # One batch: ``plans`` yields exactly ``agents`` plans and the window caps the batch
    # (``bench live --rollout``); the figures cover it up to its makespan.
    rollout: bool = False

    @property
    def name(self) -> str:
        return self.label or self.arm


def get_json(url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """GET ``url`` and parse a JSON object; None on any failure."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_stack(
    spec: RunSpec, say: Callable[[str], None], observer: RunObserver | None = None
) -> ArmResult:
    """Start the stack for ``spec.arm``, drive the agents, read state, stop; never raises.

    Without an observer, a stack that serves ``/state`` (arm ``ours``) gets
    :func:`~dynamo_thunderagent.stack.figures.scheduler_figures` of it at the end of the run
    (what the demo reports).
    """
    from dynamo_thunderagent.bench.driver import run_closed_loop
    from dynamo_thunderagent.bench.prompts import PromptText
    from dynamo_thunderagent.stack.launcher import LocalStack

    name = spec.name
    started = time.monotonic()
    result = ArmResult(name)
    takes_policy = arm_named(spec.arm).takes_policy

    def make_stack() -> LocalStack:
        return LocalStack(
            arm=spec.arm,
            num_workers=spec.num_workers,
            num_gpu_blocks=spec.num_gpu_blocks,
            block_size=spec.block_size,
            speedup_ratio=spec.speedup_ratio,
            policy=spec.policy if takes_policy else None,
            router_args=list(spec.router_args),
            mocker_args=list(spec.mocker_args),
            extra_env=dict(spec.extra_env),
            keep_run_dir=False,
        )

    try:
        stack = start_stack(make_stack, say, name)
        try:
            say(
                f"[{name}] stack up in {time.monotonic() - started:.1f}s; "
                f"driving {spec.agents} agents for {spec.window_s:.0f}s"
            )
            text = PromptText.from_tokenizer(stack.model_path / "tokenizer.json")

            def progress(p: Any) -> None:
                say(
                    f"[{name}] t={p.elapsed_s:5.1f}s turns={p.turns_ok} errors={p.errors} "
                    f"in-flight={p.in_flight} agents started={p.agents_started} "
                    f"done={p.agents_completed}"
                )

            if observer is not None:
                observer.start(stack)
            run = asyncio.run(run_closed_loop(
                stack.url, spec.plans(), agents=spec.agents, window_s=spec.window_s,
                drain_s=spec.drain_s, request_timeout_s=spec.request_timeout_s,
                text=text, job=spec.job, on_progress=progress,
                progress_interval_s=spec.progress_interval_s, background=spec.background,
            ))  # fmt: skip
            result.run = run
            if observer is not None:
                result.scheduler = observer.finish(stack, run)
            elif stack.state_url is not None:
                state = get_json(stack.state_url)
                result.scheduler = scheduler_figures(state) if state else {"error": "no state"}
        finally:
            stack.stop()
        result.agents_started = run.agents_started
        result.metrics = summarize(
            run.records, warmup_s=spec.warmup_s, window_s=spec.window_s, tail_s=spec.tail_s,
            block_size=spec.block_size, reuse_completion=False,
            batch=spec.agents if spec.rollout else None,
        )  # fmt: skip
    except Exception as error:  # one arm failing must not hide the others
        lines = str(error).splitlines()
        result.error = f"{type(error).__name__}: {lines[0] if lines else ''}"
    result.elapsed_s = time.monotonic() - started
    say(
        f"[{name}] finished in {result.elapsed_s:.1f}s"
        + (f" with error: {result.error}" if result.error else "")
    )
    return result


#: A stack that does not come up is started afresh this many times in all before the run
#: counts as failed: on a cold 2-core machine the first start of a sweep can miss the
#: start-up timeout (every process importing from a cold disk at once), and one slow start
#: must not cost a sweep its run.
START_ATTEMPTS = 2


def start_stack(
    make: Callable[[], LocalStack],
    say: Callable[[str], None],
    name: str,
    attempts: int = START_ATTEMPTS,
) -> LocalStack:
    """Start a stack from ``make``; a fresh one after a failed start, ``attempts`` in all.

    Each failed start is stopped (its processes gone) and reported through ``say`` with the
    processes' log tails, so that the reason is on record even when a later attempt works.
    Raises the last StackError when no attempt started.
    """
    from dynamo_thunderagent.stack.process import StackError

    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        stack = make()
        try:
            return stack.start()
        except StackError as error:
            stack.stop()
            headline, _, tails = str(error).partition("\n")
            again = "starting a fresh one" if attempt < attempts else "giving up"
            say(f"[{name}] stack start {attempt}/{attempts} failed: {headline}; {again}")
            if tails:
                say(tails)
            if attempt == attempts:
                raise
        except BaseException:
            stack.stop()
            raise
    raise AssertionError("unreachable")  # pragma: no cover
