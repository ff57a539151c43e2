"""``dynamo-thunderagent bench clients``: the standard benchmark client (aiperf) against each arm.

What a Dynamo user runs first is NVIDIA's aiperf, not an agent harness. Its multi-turn mode
puts a session id on every request of a conversation (``--session-header
X-Dynamo-Session-ID``) and never sends ``X-Dynamo-Session-Final``: every conversation simply
stops. This command runs the same aiperf command line against a fresh local stack of each arm
(stock KV routing, ours, and optionally the ports), for each workload and concurrency, in an
order rotated between repeats, and reports requests/s, TTFT percentiles and errors side by
side, with ours' ratios to stock (over the repeats both ran), the hit rate the frontend
counted, and the router's state after the run (programs retained, tracked requests, pauses).

Workloads (the exact aiperf flags are in :data:`WORKLOADS`):

* ``one-turn``: 200 one-turn conversations, 200 input / 100 output tokens, streamed;
* ``multi-turn``: 40 conversations x 6 turns, 300 input / 16 output tokens, 400 ms between
  turns (aiperf re-sends the whole conversation each turn, so prompts grow to ~1.9k tokens);
* ``agentic-code``: aiperf's own coding-agent sessions (``aiperf synthesize agentic-code``,
  scaled to the calibrated regime, which its stacks then run; ``bench/agentic_code.py``),
  replayed 4, 8 or 16 sessions at a time for 120 s, tool and human gaps honoured.

aiperf is installed by the Makefile in a virtual environment of its own (``.venv-aiperf``),
because its dependencies (transformers, pandas, ...) are not the Dynamo processes' business;
``--aiperf`` or ``$DTA_AIPERF`` point at another installation.

Each run also reports the CPU time each role of the stack spent on its requests (frontend,
router, workers), read from ``/proc`` around the aiperf run: the router's hop, priced.
(About 560 lines: the workloads, the run, the summary and its table are one command; the
agentic-code workload's own parts are in ``bench/agentic_code.py``.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dynamo_thunderagent.bench.agentic_code import (
    AgenticCodeWorkload,
    scaled_config,
    synthesize,
    tokenizer_cache,
)
from dynamo_thunderagent.bench.live import code_version
from dynamo_thunderagent.bench.live_sweep import ArmSpec
from dynamo_thunderagent.bench.metrics import paired_ratio
from dynamo_thunderagent.bench.output import publish
from dynamo_thunderagent.dynamo.translate import SESSION_HEADER
from dynamo_thunderagent.flags import finite_float
from dynamo_thunderagent.policy_files import POLICY_CLOCKS
from dynamo_thunderagent.stack.arms import ARM_NAMES, BASELINE_ARM, HEADLINE_ARMS, arm_named
from dynamo_thunderagent.stack.launcher import LocalStack, StackConfig
from dynamo_thunderagent.stack.regime import StackRegime, prepare_stack_regime
from dynamo_thunderagent.stack.tiny_model import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
AIPERF_VENV = REPO_ROOT / ".venv-aiperf"
SUMMARY_FILE = "profile_export_aiperf.json"


@dataclass(frozen=True)
class AiperfWorkload:
    """One aiperf workload: its flags, less the target, concurrency and output folder."""

    name: str
    conversations: int
    turns: int
    input_tokens: int
    output_tokens: int
    turn_delay_ms: int = 0
    concurrency: tuple[int, ...] = (2,)

    @property
    def requests(self) -> int:
        return self.conversations * self.turns

    @property
    def tokenizer(self) -> str | None:
        """aiperf loads the stack's own tokenizer folder (None: no other source)."""
        return None

    def env_overrides(self) -> dict[str, str]:
        """aiperf needs no environment beyond :func:`aiperf_env`."""
        return {}

    def flags(self) -> list[str]:
        flags = [
            "--endpoint-type", "chat", "--streaming",
            "--conversation-num", str(self.conversations),
            "--conversation-turn-mean", str(self.turns),
            "--conversation-turn-stddev", "0",
            "--isl", str(self.input_tokens), "--isl-stddev", "0",
            "--osl", str(self.output_tokens), "--osl-stddev", "0",
            "--extra-inputs", "ignore_eos:true",
            "--session-header", SESSION_HEADER,
        ]
        if self.turns == 1:
            flags += ["--request-count", str(self.requests)]
        if self.turn_delay_ms:
            flags += ["--conversation-turn-delay-mean", str(self.turn_delay_ms),
                      "--conversation-turn-delay-stddev", "0"]
        return flags


Workload = AiperfWorkload | AgenticCodeWorkload

WORKLOADS: dict[str, Workload] = {
    "one-turn": AiperfWorkload("one-turn", conversations=200, turns=1, input_tokens=200,
                               output_tokens=100, concurrency=(2, 20, 64)),
    "multi-turn": AiperfWorkload("multi-turn", conversations=40, turns=6, input_tokens=300,
                                 output_tokens=16, turn_delay_ms=400, concurrency=(8, 20, 64)),
    "agentic-code": AgenticCodeWorkload(),
}


def find_aiperf(explicit: str | None = None) -> str:
    """The aiperf executable: ``explicit``, ``$DTA_AIPERF``, ``.venv-aiperf`` or PATH."""
    for candidate in (explicit, os.environ.get("DTA_AIPERF"),
                      str(AIPERF_VENV / "bin" / "aiperf"), shutil.which("aiperf")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "aiperf not found: run `make aiperf` (installs aiperf 0.13 into .venv-aiperf), or "
        "pass --aiperf PATH / set DTA_AIPERF")


def aiperf_command(aiperf: str, stack: LocalStack, workload: Workload, concurrency: int,
                   artifacts: Path, seed: int = 42) -> list[str]:
    """The aiperf command line for one run (the URL without /v1: aiperf appends the path)."""
    tokenizer = workload.tokenizer or str(stack.model_path)
    return [
        aiperf, "profile", "--model", stack.config.model_name,
        "--url", stack.url.removesuffix("/v1"), "--tokenizer", tokenizer,
        *workload.flags(), "--concurrency", str(concurrency),
        "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
        "--random-seed", str(seed), "--output-artifact-dir", str(artifacts),
    ]


def aiperf_env() -> dict[str, str]:
    """aiperf's environment: no hub lookups, nothing but loopback traffic.

    aiperf 0.13 resolves a local tokenizer folder through the hub cache when
    ``HF_HUB_OFFLINE`` is set (and then fails), so that variable is removed; any
    stray hub request goes to a closed loopback proxy instead of the network.
    """
    env = dict(os.environ)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    closed = "http://127.0.0.1:9"
    env.update(HTTP_PROXY=closed, HTTPS_PROXY=closed, http_proxy=closed, https_proxy=closed,
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    return env


@dataclass
class ClientRun:
    """One aiperf run against one arm, as aiperf and (arm ours) the router reported it."""

    workload: str
    concurrency: int
    arm: str
    repeat: int
    requests_per_s: float | None = None
    ttft_ms: dict[str, float] = field(default_factory=dict)  # p50, p90, p99, max
    itl_ms: dict[str, float] = field(default_factory=dict)  # inter-token latency p50, p99
    completed: int = 0
    errors: int = 0
    duration_s: float | None = None
    returncode: int = 0
    failure: str | None = None
    router: dict[str, Any] | None = None  # arm ours: /state after the run
    # Prompt tokens the engines found cached, over all prompt tokens (the frontend's counters).
    hit_rate: float | None = None
    # CPU seconds each role of the stack used during the aiperf run (workers summed): what
    # the router's hop costs beside the frontend's own work, on the same requests.
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.returncode == 0


def parse_summary(path: Path) -> dict[str, Any]:
    """requests/s, TTFT percentiles, completed and errored requests from aiperf's summary."""
    data = json.loads(path.read_text(encoding="utf-8"))

    def avg(key: str) -> float | None:
        value = (data.get(key) or {}).get("avg")
        return None if value is None else float(value)

    ttft = data.get("time_to_first_token") or {}
    itl = data.get("inter_token_latency") or {}
    return {
        "requests_per_s": avg("request_throughput"),
        "ttft_ms": {k: float(ttft[k]) for k in ("p50", "p90", "p99", "max") if k in ttft},
        "itl_ms": {k: float(itl[k]) for k in ("p50", "p99") if k in itl},
        "completed": int(avg("request_count") or 0),
        # aiperf leaves the key out when nothing failed.
        "errors": int(avg("error_request_count") or 0),
        "duration_s": avg("benchmark_duration"),
    }


def run_aiperf(stack: LocalStack, workload: Workload, concurrency: int, artifacts: Path,
               *, aiperf: str, timeout_s: float = 300.0, seed: int = 42) -> dict[str, Any]:
    """Run aiperf once against ``stack``; the parsed summary plus ``returncode``/``failure``.
    ``command.txt`` beside the results holds the command line, prefixed with the environment
    it needs beyond the usual, so that it reruns by hand."""
    artifacts.mkdir(parents=True, exist_ok=True)
    command = aiperf_command(aiperf, stack, workload, concurrency, artifacts, seed)
    extra = workload.env_overrides()
    (artifacts / "command.txt").write_text(
        shlex.join([f"{k}={v}" for k, v in extra.items()] + command) + "\n", encoding="utf-8")
    with open(artifacts / "aiperf.log", "wb") as log:
        # Its own process group: aiperf runs worker processes, and a timeout must stop them all.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**aiperf_env(), **extra}, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return {"returncode": 124, "failure": f"aiperf ran past {timeout_s:.0f} s"}
    summary = artifacts / SUMMARY_FILE
    if not summary.is_file():
        tail = (artifacts / "aiperf.log").read_text(errors="replace")[-600:]
        return {"returncode": returncode,
                "failure": f"aiperf wrote no {SUMMARY_FILE} (rc={returncode}): {tail}"}
    return {"returncode": returncode, "failure": None, **parse_summary(summary)}


def router_state(stack: LocalStack) -> dict[str, Any] | None:
    """The parts of our router's /state a reader needs after a run (None: not arm ours)."""
    if stack.state_url is None:
        return None
    with urllib.request.urlopen(stack.state_url, timeout=10) as response:
        state = json.loads(response.read())
    scheduler = state["scheduler"]
    moved = sum(1 for p in scheduler["programs"].values() if p["moves"])
    return {
        "programs": len(scheduler["programs"]),
        "programs_moved": moved,
        "tracked_requests": scheduler["tracked_requests"],
        "in_flight": state["in_flight"],
        "waiting_for_room": scheduler.get("waiting_for_room"),
        "dormant": scheduler.get("dormant"),
        "counters": scheduler["counters"],
        "router": {k: state["router"][k] for k in
                   ("requests", "passthrough", "completed", "aborted", "rejected",
                    "session_final", "cancelled", "orphans", "errors")},
        "usage_tokens": {rank: r["usage_tokens"] for rank, r in scheduler["ranks"].items()},
        "costs": scheduler.get("costs"),  # the engine costs the pause rule priced with
    }


def hit_rate_from_metrics(text: str) -> float | None:
    """Cached over all prompt tokens, from the frontend's Prometheus text (None: no prompt)."""
    wanted = {"dynamo_frontend_cached_tokens_sum", "dynamo_frontend_input_sequence_tokens_sum"}
    sums = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                sums[sample.name] += sample.value
    prompt = sums["dynamo_frontend_input_sequence_tokens_sum"]
    return sums["dynamo_frontend_cached_tokens_sum"] / prompt if prompt > 0 else None


def frontend_hit_rate(stack: LocalStack) -> float | None:
    """The stack's hit rate so far, as its frontend counts it (None if unreadable)."""
    try:
        with urllib.request.urlopen(stack.metrics_urls["frontend-http"], timeout=10) as reply:
            return hit_rate_from_metrics(reply.read().decode("utf-8", errors="replace"))
    except (OSError, KeyError, ValueError):
        return None


def cpu_by_role(stack: LocalStack) -> dict[str, float]:
    """CPU seconds used so far by the stack's processes, summed by role (Linux; else {})."""
    used: dict[str, float] = {}
    for process in stack.processes:
        seconds = process.cpu_seconds()
        if seconds is not None:
            used[process.role] = used.get(process.role, 0.0) + seconds
    return used


def run_one(arm: str, workload: Workload, concurrency: int, repeat: int, out: Path,
            *, aiperf: str, policy: Path | None, timeout_s: float,
            regime: StackRegime | None = None) -> ClientRun:
    """A fresh stack of ``arm`` (sized and timed as ``regime`` when given), one aiperf run,
    the router's state and the hit rate, the stack stopped."""
    name = f"{workload.name}-c{concurrency}-r{repeat}-{arm}"
    result = ClientRun(workload.name, concurrency, arm, repeat)
    config = StackConfig(arm=arm, run_dir=out / "runs" / name,
                         policy=policy if arm_named(arm).takes_policy else None)
    if regime is not None:
        regime.apply(config)
    try:
        with LocalStack(config) as stack:
            before = cpu_by_role(stack)
            outcome = run_aiperf(stack, workload, concurrency, out / "aiperf" / name,
                                 aiperf=aiperf, timeout_s=timeout_s)
            after = cpu_by_role(stack)
            result.cpu_s = {role: after[role] - before[role] for role in after if role in before}
            result.router = router_state(stack)
            result.hit_rate = frontend_hit_rate(stack)
    except Exception as error:  # a stack that failed to start is a failed run, not a crash
        result.failure = f"{type(error).__name__}: {error}"
        return result
    result.returncode = int(outcome.pop("returncode"))
    result.failure = outcome.pop("failure")
    for key, value in outcome.items():
        setattr(result, key, value)
    return result


# ---- report ----------------------------------------------------------------------------
def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(runs: list[ClientRun]) -> list[dict[str, Any]]:
    """One row per (workload, concurrency, arm): means over repeats, ratios to stock over
    the repeats both ran."""
    groups: dict[tuple[str, int, str], list[ClientRun]] = {}
    for run in runs:
        groups.setdefault((run.workload, run.concurrency, run.arm), []).append(run)
    rows = []
    for (workload, concurrency, arm), group in groups.items():
        good = [r for r in group if r.ok and r.requests_per_s is not None]
        row: dict[str, Any] = {
            "workload": workload, "concurrency": concurrency, "arm": arm,
            "runs": len(group), "failed_runs": len(group) - len(good),
            "requests_per_s": _mean([r.requests_per_s or 0.0 for r in good]),
            "requests_per_s_each": [r.requests_per_s for r in good],
            "errors": sum(r.errors for r in group),
            "hit_rate": _mean([r.hit_rate for r in good if r.hit_rate is not None]),
        }
        for key in ("p50", "p90", "p99", "max"):
            row[f"ttft_{key}_ms"] = _mean([r.ttft_ms[key] for r in good if key in r.ttft_ms])
        for key in ("p50", "p99"):
            row[f"itl_{key}_ms"] = _mean([r.itl_ms[key] for r in good if key in r.itl_ms])
        for role in ("frontend", "router", "worker"):
            row[f"cpu_{role}_ms_per_request"] = _mean(
                [1e3 * r.cpu_s[role] / r.completed for r in good
                 if role in r.cpu_s and r.completed])
        rows.append(row)
    # Ratios to stock over the repeats both ran: a repeat one arm lost would otherwise
    # divide a mean over some runs by a mean over others.
    for row in rows:
        stock = groups.get((row["workload"], row["concurrency"], BASELINE_ARM), [])
        own = groups[(row["workload"], row["concurrency"], row["arm"])]
        row["rps_vs_stock"] = paired_ratio(_by_repeat(own, _rps), _by_repeat(stock, _rps))
        row["ttft_p99_vs_stock"] = paired_ratio(_by_repeat(own, _ttft_p99),
                                                _by_repeat(stock, _ttft_p99))
    return rows


def _rps(run: ClientRun) -> float | None:
    return run.requests_per_s


def _ttft_p99(run: ClientRun) -> float | None:
    return run.ttft_ms.get("p99")


def _by_repeat(runs: list[ClientRun], figure: Callable[[ClientRun], float | None]
               ) -> dict[int, float]:
    """``figure`` of each repeat that ran to its end and reported it."""
    return {r.repeat: value for r in runs if r.ok and (value := figure(r)) is not None}


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[dict[str, Any]], runs: list[ClientRun]) -> str:
    lines = [
        "| workload | concurrency | arm | requests/s | vs stock | TTFT p50 / p90 / p99 / max (ms)"
        " | p99 vs stock | inter-token p50 / p99 (ms) | hit rate | CPU ms/request: frontend /"
        " router / workers | errors | failed runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ttft = " / ".join(_fmt(row[f"ttft_{k}_ms"], ",.0f") for k in ("p50", "p90", "p99", "max"))
        cpu = " / ".join(_fmt(row.get(f"cpu_{role}_ms_per_request"), ".1f")
                         for role in ("frontend", "router", "worker"))
        lines.append(
            f"| {row['workload']} | {row['concurrency']} | {row['arm']} | "
            f"{_fmt(row['requests_per_s'], '.2f')} | {_fmt(row['rps_vs_stock'], '.2f', 'x')} | "
            f"{ttft} | "
            f"{_fmt(row['ttft_p99_vs_stock'], '.2f', 'x')} | "
            f"{_fmt(row.get('itl_p50_ms'), '.2f')} / {_fmt(row.get('itl_p99_ms'), '.2f')} | "
            f"{_fmt(row.get('hit_rate'), '.3f')} | {cpu} | {row['errors']} | "
            f"{row['failed_runs']} |")
    if any(row["failed_runs"] for row in rows):
        lines += ["", "A run failed: the ratios to stock cover only the repeats both arms ran, "
                  "so they can differ from the ratio of the means shown."]
    ours = [r for r in runs if r.router is not None]
    if ours:
        lines += ["", "Our router after each run (programs retained, tracked requests, pauses "
                  "under pressure / idle programs paused to make room, programs that moved):", "",
                  "| run | programs | tracked | waiting for room | dormant | pauses / idle pauses"
                  " | moved | router completed / aborted / rejected |",
                  "|---|---|---|---|---|---|---|---|"]
        for run in ours:
            s = run.router or {}
            c, r = s.get("counters", {}), s.get("router", {})
            lines.append(
                f"| {run.workload} c{run.concurrency} r{run.repeat} | {s.get('programs')} | "
                f"{s.get('tracked_requests')} | {s.get('waiting_for_room')} | {s.get('dormant')}"
                f" | {c.get('pauses')} / {c.get('idle_pauses')} | {s.get('programs_moved')} | "
                f"{r.get('completed')} / {r.get('aborted')} / {r.get('rejected')} |")
    failures = [r for r in runs if r.failure]
    if failures:
        lines += ["", "Failed runs:", ""]
        lines += [f"- {r.workload} c{r.concurrency} r{r.repeat} {r.arm}: {r.failure}"
                  for r in failures]
    return "\n".join(lines)


# ---- CLI -------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(HEADLINE_ARMS),
                        help=f"comma-separated arms from {', '.join(ARM_NAMES)} "
                             "(default: stock,ours)")
    parser.add_argument("--workloads", default="one-turn,multi-turn",
                        help=f"comma-separated from {', '.join(WORKLOADS)} (default: "
                             "one-turn,multi-turn)")
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated concurrencies for every workload (default: "
                             "one-turn 2,20,64; multi-turn 8,20,64; agentic-code 4,8,16 "
                             "sessions)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each (workload, concurrency, arm), arms rotated")
    parser.add_argument("--policy", type=Path, default=None,
                        help="router-policy YAML for arm ours (default: the extended policy)")
    parser.add_argument("--policy-clock", choices=POLICY_CLOCKS, default="regime",
                        help="agentic-code: the routers' durations on the regime's clock "
                             "(regime, default) or as written (wall); see bench live")
    parser.add_argument("--aiperf", default=None, help="aiperf executable (default: "
                        ".venv-aiperf/bin/aiperf, $DTA_AIPERF, or PATH)")
    parser.add_argument("--timeout", type=finite_float, default=300.0,
                        help="seconds one aiperf run may take (default: 300)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default bench-results/clients-<UTC time>/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _choices(text: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    bad = [item for item in items if item not in allowed]
    if bad or not items:
        raise ValueError(f"--{what}: {', '.join(bad) or 'empty'} not in "
                         f"{', '.join(allowed)}")
    return items


def prepare_agentic_code(workload: AgenticCodeWorkload, out: Path, aiperf: str,
                         seed: int = 42, policy_clock: str = "regime",
                         arms: Sequence[str] = (), policy: Path | None = None,
                         ) -> tuple[AgenticCodeWorkload, StackRegime]:
    """Size the workload's regime, derive the policy each of ``arms`` will run (``policy``:
    arm ours'; a file that cannot be read or put on the regime's clock raises ValueError
    before anything slow), synthesize the trace at the regime's scales and make the
    tokenizer's hub cache, once for every arm; the workload with both set, and the regime."""
    regime = prepare_stack_regime(workload.regime, (out / "regime").resolve(),
                                  policy_clock=policy_clock)
    regime.prepared.check_policies(
        ArmSpec(arm, arm, policy if arm_named(arm).takes_policy else None) for arm in arms)
    config = scaled_config(regime.token_scale, regime.time_scale, workload.block_size,
                           regime.num_gpu_blocks * regime.block_size)
    trace = synthesize(aiperf, config, (out / "trace").resolve(), sessions=workload.sessions,
                       seed=seed, env=aiperf_env())
    model = (out / "tokenizer-model").resolve()
    build_tiny_model(model)
    hub_cache = (out / "hub-cache").resolve()
    tokenizer_cache(model, hub_cache)
    return dataclasses.replace(workload, trace=trace, hub_cache=hub_cache), regime


def _concurrency(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        levels = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        raise ValueError("--concurrency takes integers, e.g. 2,20,64") from None
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency values must be >= 1")
    return levels


def run_clients_cli(args: argparse.Namespace) -> int:
    try:
        arms = _choices(args.arms, ARM_NAMES, "arms")
        workloads: list[Workload] = [WORKLOADS[w] for w in
                                     _choices(args.workloads, list(WORKLOADS), "workloads")]
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {args.timeout}")
        concurrency = _concurrency(args.concurrency)
        aiperf = find_aiperf(args.aiperf)
    except (ValueError, FileNotFoundError) as error:  # bad flags: exit 2, as every command
        print(f"error: {error}", file=sys.stderr)
        return 2
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out: Path = args.out or Path("bench-results") / f"clients-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    # Prepared before any run, so that a trace that cannot be made loses no finished run.
    regimes: dict[str, StackRegime] = {}
    for index, workload in enumerate(workloads):
        if isinstance(workload, AgenticCodeWorkload):
            try:
                workloads[index], regimes[workload.name] = prepare_agentic_code(
                    workload, out, aiperf, policy_clock=args.policy_clock, arms=arms,
                    policy=args.policy)
            except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as error:
                print(f"error: {workload.name}: {error}", file=sys.stderr)
                return 2
    runs: list[ClientRun] = []
    for workload in workloads:
        for level in concurrency or workload.concurrency:
            for repeat in range(args.repeats):
                shift = repeat % len(arms)  # rotate the order so noise is not one arm's bias
                for arm in arms[shift:] + arms[:shift]:
                    run = run_one(arm, workload, level, repeat, out, aiperf=aiperf,
                                  policy=args.policy, timeout_s=args.timeout,
                                  regime=regimes.get(workload.name))
                    runs.append(run)
                    if not args.json:
                        print(f"{workload.name} c{level} r{repeat} {arm}: "
                              f"{_fmt(run.requests_per_s, '.2f')} req/s, TTFT p99 "
                              f"{_fmt(run.ttft_ms.get('p99'), '.0f')} ms, errors {run.errors}"
                              + (f", FAILED: {run.failure.splitlines()[0]}"
                                 if run.failure else ""),
                              flush=True)
    rows = summarize(runs)
    report = {
        "command": " ".join(sys.argv),
        "aiperf": aiperf,
        "workloads": {w.name: {k: str(v) if isinstance(v, Path) else v
                               for k, v in asdict(w).items()} for w in workloads},
        # The clock the routers' durations ran on, per workload run on a regime.
        "policy_clock": {name: regime.prepared.policy_clock for name, regime in regimes.items()},
        "code": code_version(),
        "rows": rows,
        "runs": [asdict(r) for r in runs],
    }
    publish(out, report, markdown(rows, runs), as_json=args.json,
            where=f"aiperf artifacts under {out}/aiperf/")
    return 0 if all(r.ok for r in runs) else 1
