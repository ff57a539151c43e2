"""``bench trace``: write a JSONL trace (bench/trace.py's format) that ``bench sim --trace``
and ``bench live --trace`` replay, from a generated workload or from public agent traces
(bench/trace_import.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dynamo_thunderagent.bench.shapes import ALL_SYNTHETIC
from dynamo_thunderagent.bench.trace import trace_rows, write_trace
from dynamo_thunderagent.bench.trace_import import (
    DEFAULT_MAX_CONTEXT_TOKENS,
    DEFAULT_MAX_GAP_SECONDS,
    import_rows,
)
from dynamo_thunderagent.bench.workload import make_agents
from dynamo_thunderagent.flags import finite_float

# --workload's defaults: how many top-level agents, and the seed that draws them.
DEFAULT_AGENTS = 64
DEFAULT_SEED = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", choices=sorted(ALL_SYNTHETIC),
                        help="a generated workload's agents (with --agents and --seed)")
    source.add_argument("--from-kv-cache-tester", nargs="+", metavar="PATH",
                        help="Claude Code conversations in kv-cache-tester's trace format: "
                        "JSON files, or directories of them (*.json)")
    parser.add_argument("--agents", type=int,
                        help=f"--workload: top-level agents (default {DEFAULT_AGENTS})")
    parser.add_argument("--seed", type=int, help=f"--workload: seed (default {DEFAULT_SEED})")
    parser.add_argument("--max-gap-seconds", type=finite_float,
                        help="import: cap on the wait between two calls "
                        f"(default {DEFAULT_MAX_GAP_SECONDS:g})")
    parser.add_argument("--max-context-tokens", type=int,
                        help="import: cut a conversation before its first prompt above this "
                        f"(default {DEFAULT_MAX_CONTEXT_TOKENS})")
    parser.add_argument("--out", required=True, help="JSONL file to write")


def run_trace_cli(args: argparse.Namespace) -> int:
    try:
        rows, summary = _rows(args)
        count = write_trace(args.out, rows)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {count} rows to {args.out}: {summary}", file=sys.stderr)
    return 0


def _rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """Every row, read and checked before anything is written, and a line about them."""
    if args.workload is not None:
        _refuse(args, ("max_gap_seconds", "max_context_tokens"), "--from-kv-cache-tester")
        agents = DEFAULT_AGENTS if args.agents is None else args.agents
        if agents < 1:
            raise ValueError(f"--agents must be >= 1, got {agents}")
        plans = make_agents(ALL_SYNTHETIC[args.workload], agents,
                            DEFAULT_SEED if args.seed is None else args.seed)
        programs = sum(1 for p in plans for _ in p.programs())
        return (list(trace_rows(plans)),
                f"{len(plans)} {args.workload} agents, {programs} programs with subagents")
    _refuse(args, ("agents", "seed"), "--workload")
    max_gap = DEFAULT_MAX_GAP_SECONDS if args.max_gap_seconds is None else args.max_gap_seconds
    max_context = (DEFAULT_MAX_CONTEXT_TOKENS if args.max_context_tokens is None
                   else args.max_context_tokens)
    if not max_gap >= 0:
        raise ValueError(f"--max-gap-seconds must be >= 0, got {max_gap}")
    if max_context < 1:
        raise ValueError(f"--max-context-tokens must be >= 1, got {max_context}")
    rows, notes = import_rows(_documents(args.from_kv_cache_tester),
                              max_gap_seconds=max_gap, max_context_tokens=max_context)
    if not rows:
        raise ValueError("no conversation left to write (" + notes.describe() + ")")
    return rows, notes.describe()


def _refuse(args: argparse.Namespace, names: tuple[str, ...], source: str) -> None:
    for name in names:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} applies to {source} only")


def _documents(paths: list[str]) -> Iterator[tuple[str, Any]]:
    """(file name, parsed JSON) of every file named, directories' *.json in name order."""
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files = sorted(path.glob("*.json"))
            if not files:
                raise ValueError(f"{path}: no *.json files in this directory")
        elif path.is_file():
            files = [path]
        else:
            raise ValueError(f"{path}: no such file or directory")
        for file in files:
            try:
                doc = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"{file}: not a readable JSON file ({error})") from None
            yield str(file), doc
