"""``python -m dynamo_thunderagent.bench.calibration``: write a profile, show the fit, or
measure both regimes on a live mocker (see the package docstring)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from dynamo_thunderagent.bench.calibration.fit import fit_trace
from dynamo_thunderagent.bench.calibration.mocker import StackGeometry, calibrated_mocker_args
from dynamo_thunderagent.bench.calibration.verify import cmd_verify
from dynamo_thunderagent.bench.regimes import REGIMES
from dynamo_thunderagent.bench.trace import DEFAULT_TRACE
from dynamo_thunderagent.flags import finite_float

DESCRIPTION = "Timing regimes for the Dynamo 1.6.1 mocker: GPU-calibrated and cheap-recompute."


def _cmd_write(ns: argparse.Namespace) -> int:
    geometry = None
    if ns.num_gpu_blocks is not None:
        geometry = StackGeometry(ns.num_gpu_blocks, ns.block_size, ns.speedup_ratio)
    args = calibrated_mocker_args(
        ns.out_dir,
        ns.token_scale,
        ns.time_scale,
        speedup_ratio=ns.speedup_ratio,
        geometry=geometry,
        transport=ns.transport,
    )
    print(" ".join(args))
    return 0


def _cmd_fit(ns: argparse.Namespace) -> int:
    fit = fit_trace(Path(ns.trace))
    print(json.dumps({"fit": asdict(fit), "timing": asdict(fit.timing())}, indent=2))
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_thunderagent.bench.calibration", description=DESCRIPTION
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    w = sub.add_parser("write", help="write a calibrated profile and print the mocker flags")
    w.add_argument("out_dir")
    w.add_argument("--token-scale", type=finite_float, default=0.1)
    w.add_argument("--time-scale", type=finite_float, default=1.0)
    w.add_argument("--speedup-ratio", type=finite_float, default=1.0)
    w.add_argument("--num-gpu-blocks", type=int, default=None)
    w.add_argument("--block-size", type=int, default=16)
    w.add_argument("--transport", choices=["auto", "profile", "engine-json"], default="auto")
    w.set_defaults(func=_cmd_write)

    f = sub.add_parser("fit", help="fit the timing model to the trace and print it")
    f.add_argument("--trace", default=str(DEFAULT_TRACE))
    f.set_defaults(func=_cmd_fit)

    v = sub.add_parser("verify", help="measure prefill/decode on a live mocker in each regime")
    v.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=sorted(REGIMES))
    v.add_argument("--token-scale", type=finite_float, default=0.1)
    v.add_argument("--time-scale", type=finite_float, default=0.1)
    v.add_argument("--speedup-ratio", type=finite_float, default=1.0)
    v.add_argument("--num-gpu-blocks", type=int, default=1408)
    v.add_argument("--block-size", type=int, default=16)
    v.add_argument("--words", type=int, default=1200, help="prompt size (about 3 tokens a word)")
    v.add_argument("--decode-tokens", type=int, default=16)
    v.add_argument("--batches", type=int, nargs="*", default=[1, 4])
    v.add_argument("--batch-words", type=int, default=400, help="prompt size of each decoder")
    v.add_argument("--repeats", type=int, default=3)
    v.add_argument(
        "--turn-output-tokens",
        type=int,
        default=None,
        help="output tokens of one agent turn (default: the trace median x token scale)",
    )
    v.add_argument("--work-dir", default="/tmp/dta-calibration")
    v.add_argument("--json", default=None, help="also write the results here")
    v.set_defaults(func=cmd_verify)  # measures a live stack

    ns = parser.parse_args(list(argv) if argv is not None else None)
    return int(ns.func(ns))


if __name__ == "__main__":
    raise SystemExit(main())
