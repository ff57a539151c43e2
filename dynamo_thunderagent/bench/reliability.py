"""``dynamo-thunderagent bench reliability``: the long fault variants, with figures.

The fault suite in ``make test`` checks that nothing is lost in short, bounded cases. This
command runs the long ones on a fresh local stack (arm ours, the shipped extended policy)
and reports what an operator wants to know about each:

* ``flood``: ``--flood`` one-turn sessions (distinct session ids, none ever ends) at
  ``--flood-concurrency``, far past ``max_tracked_requests``;
* ``soak``: ``--agents`` agents looping turns and tool calls for ``--soak`` seconds while a
  random fault strikes every ``--fault-every`` seconds: a worker SIGKILLed (and a new one
  started), a worker hung (SIGSTOPped for ``HANG_SECONDS``, then replaced the same way), the
  router SIGKILLed and restarted, a burst of clients that leave mid-request,
  a burst of bad input (oversize prompts, prompts the engine refuses, over-long session ids).

During both, a well-behaved probe agent takes a turn every ``PROBE_PERIOD`` seconds; its turn
latency is the service a normal user got. Reported per phase: load held (requests and
requests/s), faults survived, bad inputs tried, errors by kind, whether every request the
router took reached exactly one terminal state and the table drained, the router's resident
memory (start, peak, end) and the probe's p50/p99 turn latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.output import publish
from dynamo_thunderagent.dynamo.translate import FINAL_HEADER, SESSION_HEADER
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.policy_files import EXTENDED_POLICY
from dynamo_thunderagent.quantile import percentile
from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig
from dynamo_thunderagent.stack.process import signal_group

PROBE_PERIOD = 0.25
FAULTS = ("worker-kill", "worker-hang", "router-restart", "router-freeze", "disconnects",
          "bad-input")
# How long a hung worker stays stopped: past discovery's lease (about 10 s) and the
# router's stall watch (5 s more), so the turns it held have gone on elsewhere.
HANG_SECONDS = 20.0
# How long a frozen router stays stopped: past file discovery's 10 s lease, so its
# registration expires and it must write it back when it wakes.
FREEZE_SECONDS = 15.0
MAX_MODEL_LEN = 3072


@dataclass
class PhaseReport:
    phase: str
    seconds: float = 0.0
    requests: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    bad_inputs: int = 0
    probe_turns: int = 0
    probe_latency_p50_s: float | None = None
    probe_latency_p99_s: float | None = None
    probe_errors: int = 0
    router_rss_mb: dict[str, float] = field(default_factory=dict)  # start, peak, end
    programs_end: int | None = None
    evicted: int | None = None
    accounted: bool | None = None  # every request the (last) router took: one terminal state
    drained: bool | None = None  # nothing tracked, in flight or waiting at the end
    router_counters: dict[str, Any] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _state(stack: LocalStack) -> dict[str, Any]:
    assert stack.state_url is not None
    with urllib.request.urlopen(stack.state_url, timeout=10) as response:
        state: dict[str, Any] = json.loads(response.read())
    return state


def _accounted(state: dict[str, Any]) -> bool:
    r = state["router"]
    return bool(r["requests"] == r["passthrough"] + r["completed"] + r["aborted"]
                + r["rejected"] + r["session_final"] + r["cancelled"] + r["orphans"])


def _drained(state: dict[str, Any]) -> bool:
    s = state["scheduler"]
    return bool(state["in_flight"] == 0 and s["tracked_requests"] == 0
                and s.get("waiting_for_room", 0) == 0)


class Bench:
    def __init__(self, stack: LocalStack, report: PhaseReport, seed: int) -> None:
        import openai

        self.stack = stack
        self.report = report
        self.rng = random.Random(seed)
        self.client = openai.AsyncOpenAI(base_url=stack.url, api_key="unused", timeout=60,
                                         max_retries=0)
        self.stop = asyncio.Event()
        self.probe_latencies: list[float] = []
        self.rss: list[float] = []

    async def turn(self, session: str, text: str, max_tokens: int = 8,
                   final: bool = False, **kwargs: Any) -> bool:
        import openai

        headers = {SESSION_HEADER: session}
        if final:
            headers[FINAL_HEADER] = "true"
        self.report.requests += 1
        try:
            await self.client.chat.completions.create(
                model=self.stack.config.model_name, max_tokens=max_tokens,
                messages=[{"role": "user", "content": text}], extra_headers=headers, **kwargs)
        except openai.APITimeoutError:
            self.report.error("timeout (a hang)")
            return False
        except openai.APIStatusError as error:
            self.report.error(f"HTTP {error.status_code}")
            return False
        except openai.APIError as error:
            self.report.error(type(error).__name__)
            return False
        self.report.ok += 1
        return True

    async def probe(self) -> None:
        """A well-behaved agent: a turn every PROBE_PERIOD, its context growing."""
        turn = 0
        session = "probe"
        while not self.stop.is_set():
            started = time.monotonic()
            text = " ".join(f"probe{turn}-{i}" for i in range(20 + turn % 40))
            if await self.turn(session, text):
                self.probe_latencies.append(time.monotonic() - started)
            else:
                self.report.probe_errors += 1
            turn += 1
            if turn % 40 == 0:
                await self.turn(session, "done", max_tokens=1, final=True)
                session = f"probe-{turn}"
            await asyncio.sleep(PROBE_PERIOD)

    async def watch_memory(self) -> None:
        while not self.stop.is_set():
            router = self.stack.router
            rss = _rss_mb(router.pid) if router is not None else None
            if rss is not None:
                self.rss.append(rss)
            await asyncio.sleep(1.0)

    def finish(self, started: float) -> None:
        report = self.report
        report.seconds = round(time.monotonic() - started, 1)
        report.probe_turns = len(self.probe_latencies)
        report.probe_latency_p50_s = percentile(self.probe_latencies, 0.5)
        report.probe_latency_p99_s = percentile(self.probe_latencies, 0.99)
        if self.rss:
            report.router_rss_mb = {"start": round(self.rss[0], 1),
                                    "peak": round(max(self.rss), 1),
                                    "end": round(self.rss[-1], 1)}


async def run_flood(stack: LocalStack, sessions: int, concurrency: int, seed: int,
                    report: PhaseReport) -> None:
    bench = Bench(stack, report, seed)
    started = time.monotonic()
    background = [asyncio.create_task(bench.probe()), asyncio.create_task(bench.watch_memory())]
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limit:
            await bench.turn(f"flood-{i:07d}", f"flood request {i}", max_tokens=4)

    await asyncio.gather(*(one(i) for i in range(sessions)))
    await _settle_and_close(bench, background, started)


async def run_soak(stack: LocalStack, seconds: float, agents: int, fault_every: float,
                   seed: int, report: PhaseReport) -> None:
    bench = Bench(stack, report, seed)
    started = time.monotonic()
    background = [asyncio.create_task(bench.probe()), asyncio.create_task(bench.watch_memory())]

    async def agent(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        generation = 0
        while not bench.stop.is_set():
            session = f"agent-{index}-{generation}"
            history = ""
            for turn in range(rng.randint(5, 15)):
                if bench.stop.is_set():
                    break
                history += " " + " ".join(f"t{turn}w{i}" for i in range(rng.randint(20, 60)))
                # Kept well under the workers' --max-model-len: only the bad-input fault
                # sends prompts the engine refuses.
                await bench.turn(session, history[-1200:], max_tokens=rng.randint(8, 32))
                await asyncio.sleep(rng.lognormvariate(-1.0, 0.8))  # the tool call
            await bench.turn(session, "done", max_tokens=1, final=True)
            generation += 1

    workers = [asyncio.create_task(agent(i)) for i in range(agents)]
    deadline = started + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(min(fault_every, max(0.0, deadline - time.monotonic())))
        if time.monotonic() >= deadline:
            break
        fault = bench.rng.choice(FAULTS)
        report.faults.append(fault)
        await _inject(bench, fault)
    bench.stop.set()
    await asyncio.gather(*workers, return_exceptions=True)
    await _settle_and_close(bench, background, started)


async def _inject(bench: Bench, fault: str) -> None:
    stack = bench.stack
    if fault == "worker-kill":
        index = bench.rng.randrange(stack.config.num_workers)
        stack.kill_worker(index)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(stack.restart_worker, index)
    elif fault == "worker-hang":  # stopped, not dead: its connections stay open
        index = bench.rng.randrange(stack.config.num_workers)
        stack.kill_worker(index, signal.SIGSTOP)
        await asyncio.sleep(HANG_SECONDS)
        await asyncio.to_thread(stack.restart_worker, index)  # SIGKILLs it first
    elif fault == "router-restart":
        await asyncio.to_thread(stack.restart_router)
    elif fault == "router-freeze":  # a machine-wide stall, as far as the router can tell
        router = stack.router
        assert router is not None
        signal_group(router, signal.SIGSTOP)
        try:
            await asyncio.sleep(FREEZE_SECONDS)
        finally:
            signal_group(router, signal.SIGCONT)
    elif fault == "disconnects":
        tasks = [asyncio.create_task(bench.turn(f"leaver-{bench.rng.random():.9f}",
                                                "leaving " * 200, max_tokens=200,
                                                stream=bool(i % 2)))
                 for i in range(20)]
        await asyncio.sleep(0.3)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    elif fault == "bad-input":
        tries = [
            bench.turn("bad-oversize", "word " * 6000),  # larger than any worker
            bench.turn("bad-engine", "word " * 1100),  # over the engine's --max-model-len
            bench.turn("x" * 8192, "an over-long session id"),
            bench.turn("bad id with spaces", "spaces in the id"),
        ]
        bench.report.bad_inputs += len(tries)
        await asyncio.gather(*tries)


async def _settle_and_close(bench: Bench, background: list[asyncio.Task[None]],
                            started: float) -> None:
    bench.stop.set()
    await asyncio.gather(*background, return_exceptions=True)
    report = bench.report
    deadline = time.monotonic() + 60
    state = await asyncio.to_thread(_state, bench.stack)
    while not (_drained(state) and _accounted(state)) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        state = await asyncio.to_thread(_state, bench.stack)
    report.accounted = _accounted(state)
    report.drained = _drained(state)
    report.programs_end = len(state["scheduler"]["programs"])
    report.evicted = state["scheduler"]["counters"]["evicted"]
    report.router_counters = state["router"]
    bench.finish(started)
    await bench.client.close()


def _markdown(reports: list[PhaseReport]) -> str:
    def fmt(value: float | None, spec: str = ".3f") -> str:
        return "-" if value is None else f"{value:{spec}}"

    lines = ["| phase | seconds | requests (ok) | faults | bad inputs | errors seen by clients"
             " | every request one terminal state | drained | programs at end (evicted) "
             "| router RSS start / peak / end (MB) | probe turns | probe p50 / p99 (s) "
             "| probe errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        faults = ", ".join(f"{f} x{r.faults.count(f)}" for f in sorted(set(r.faults))) or "-"
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "none"
        rss = " / ".join(fmt(r.router_rss_mb.get(k), ".0f") for k in ("start", "peak", "end"))
        lines.append(
            f"| {r.phase} | {r.seconds:.0f} | {r.requests:,} ({r.ok:,}) | {faults} | "
            f"{r.bad_inputs} | {errors} | {'yes' if r.accounted else 'NO'} | "
            f"{'yes' if r.drained else 'NO'} | {r.programs_end} ({r.evicted}) | {rss} | "
            f"{r.probe_turns} | {fmt(r.probe_latency_p50_s)} / {fmt(r.probe_latency_p99_s)} | "
            f"{r.probe_errors} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phases", default="flood,soak",
                        help="comma-separated from flood, soak (default: both)")
    parser.add_argument("--flood", type=int, default=100_000,
                        help="one-turn sessions in the flood (default 100,000)")
    parser.add_argument("--flood-concurrency", type=int, default=64)
    parser.add_argument("--soak", type=finite_float, default=600.0,
                        help="seconds of the soak (default 600)")
    parser.add_argument("--agents", type=int, default=8, help="agents in the soak")
    parser.add_argument("--fault-every", type=finite_float, default=30.0,
                        help="seconds between faults in the soak (default 30)")
    parser.add_argument("--policy", type=Path, default=None,
                        help="router-policy YAML (default: the extended policy)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default bench-results/reliability-<UTC time>/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _bad_flag(args: argparse.Namespace, phases: list[str]) -> str | None:
    """What is wrong with ``bench reliability``'s flags (None: nothing)."""
    unknown = [p for p in phases if p not in ("flood", "soak")]
    if unknown or not phases:
        return f"--phases: {', '.join(unknown) or 'empty'}; choose from flood, soak"
    for name in ("flood", "flood_concurrency", "agents"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
    for name in ("soak", "fault_every"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}"
    return None


def run_reliability_cli(args: argparse.Namespace) -> int:
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = _bad_flag(args, phases)
    if bad is not None:  # exit 2, as every command's bad flags
        print(f"error: {bad}", file=sys.stderr)
        return 2
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out: Path = (args.out or Path("bench-results") / f"reliability-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    reports: list[PhaseReport] = []
    for phase in phases:
        report = PhaseReport(phase)
        # The soak's workers refuse prompts over 3,072 tokens (the engine-refusal fault),
        # below their KV capacity (4,096), which the router itself enforces.
        mocker_args = ["--max-model-len", str(MAX_MODEL_LEN)] if phase == "soak" else []
        config = StackConfig(arm="ours", run_dir=out / f"run-{phase}", mocker_args=mocker_args,
                             policy=args.policy or EXTENDED_POLICY, startup_timeout_s=120)
        with LocalStack(config) as stack:
            if phase == "flood":
                asyncio.run(run_flood(stack, args.flood, args.flood_concurrency, args.seed,
                                      report))
            else:
                asyncio.run(run_soak(stack, args.soak, args.agents, args.fault_every,
                                     args.seed, report))
        reports.append(report)
        if not args.json:
            print(f"{phase}: {json.dumps(asdict(report))}", flush=True)
    result = {"command": " ".join(sys.argv), "phases": [asdict(r) for r in reports]}
    publish(out, result, _markdown(reports), as_json=args.json,
            where=f"logs under {out}/run-*/logs/")
    ok = all(r.accounted and r.drained and "timeout (a hang)" not in r.errors for r in reports)
    return 0 if ok else 1
