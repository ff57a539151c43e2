"""The simulator's recorded outputs: the reference a restructuring must reproduce exactly.

The simulator is deterministic, so ``bench sim`` with the same flags prints the same figures
byte for byte. Each case below is one ``bench sim`` command line; its recorded output (the
per-run results and the scenario, minus the machine-specific trace path) lives in
``tests/golden/sim/<name>.json``. ``tests/unit/test_golden_sim.py`` re-runs every case.

A change that is meant to alter a figure (a bug fixed on the way) re-records the files with
``python -m tests.golden.sim_cases`` and says in its commit which cases changed and why.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.sim.command import add_arguments, spec_from_args
from dynamo_thunderagent.bench.sim.run import run_sweep, to_json
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).resolve().parent / "sim"
POLICIES = ROOT / "policies"
ALL_ARMS = "ours,stock,ttl-pinning,upstream,dynamo-python"


def _cases() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    # The calibrated regime on the synthetic SWE-agent shape needs no trace file; the trace
    # replay is its own case (skipped where the shared trace is absent).
    regimes = {
        "calibrated": ["--regime", "calibrated", "--workload", "synthetic"],
        "cheap": ["--regime", "cheap-recompute"],
    }
    for regime, flags in regimes.items():
        # Every arm, ours with the shipped default policy; then ours with each policy file.
        cases[f"{regime}-arms"] = [*flags, "--arms", ALL_ARMS]
        cases[f"{regime}-parity"] = [
            *flags, "--arms", "ours", "--policy", str(POLICIES / "thunderagent.yaml")]
        cases[f"{regime}-extended"] = [
            *flags, "--arms", "ours", "--policy", str(POLICIES / "thunderagent-extended.yaml")]
        for ablation in sorted((POLICIES / "ablations").glob("*.yaml")):
            cases[f"{regime}-{ablation.stem}"] = [
                *flags, "--arms", "ours", "--policy", str(ablation)]
    trace = ["--regime", "calibrated", "--workload", "trace"]
    cases["trace-arms"] = [*trace, "--arms", ALL_ARMS]
    cases["trace-parity"] = [*trace, "--arms", "ours", "--policy",
                             str(POLICIES / "thunderagent.yaml")]
    # The tiered regime: every arm (ours told of the tier), and ours blind to it.
    tiered = ["--regime", "tiered", "--workload", "synthetic"]
    cases["tiered-arms"] = [*tiered, "--arms", ALL_ARMS]
    cases["tiered-minus_host_tier"] = [*tiered, "--arms", "ours", "--policy",
                                       str(POLICIES / "ablations" / "minus_host_tier.yaml")]
    # Other tenants' sessionless traffic beside the agents, with sessionless_kv's two settings.
    background = ["--regime", "calibrated", "--workload", "synthetic",
                  "--background", "8:8000:640"]
    cases["calibrated-background-arms"] = [*background, "--arms", "ours,stock"]
    for ablation in ("minus_sessionless_kv", "minus_sessionless_kv_full_loss"):
        cases[f"calibrated-background-{ablation}"] = [
            *background, "--arms", "ours", "--policy",
            str(POLICIES / "ablations" / f"{ablation}.yaml")]
    # A rollout (one batch run to its end), every arm, at 1x and 3x: its makespan and runs.
    cases["rollout-agentic-code-arms"] = [
        "--regime", "calibrated", "--workload", "agentic-code", "--agents", "5,14",
        "--arms", ALL_ARMS, "--rollout"]
    return cases


CASES = _cases()


def needs_trace(name: str) -> bool:
    return name.startswith("trace-")


def trace_available() -> bool:
    return DEFAULT_TRACE.is_file()


def record(argv: list[str]) -> dict[str, Any]:
    """Run one case in this process (parallel over the CPUs) and return what is compared."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = spec_from_args(parser.parse_args(argv))
    data = to_json(spec, run_sweep(spec))
    if data["scenario"].get("trace"):
        data["scenario"]["trace"] = Path(data["scenario"]["trace"]).name
    if data.get("policy"):
        data["policy"] = Path(data["policy"]).name
    # JSON round trip: floats compare exactly as they would in the recorded file.
    result: dict[str, Any] = json.loads(json.dumps({"argv": [_portable(a) for a in argv],
                                                    **data}))
    return result


def _portable(arg: str) -> str:
    return str(Path(arg).relative_to(ROOT)) if arg.startswith(str(ROOT)) else arg


def path_of(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.json"


def main() -> int:
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1:] or list(CASES)
    for name in names:
        if needs_trace(name) and not trace_available():
            print(f"skip {name}: no trace at {DEFAULT_TRACE}", file=sys.stderr)
            continue
        data = record(CASES[name])
        path_of(name).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                 encoding="utf-8")
        print(f"recorded {name} ({len(data['results'])} runs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
