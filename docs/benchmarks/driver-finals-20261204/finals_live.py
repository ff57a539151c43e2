"""``bench live`` that also prints, per run, how long its session-finals took.

Usage: ``python finals_live.py <bench live options>``, from a checkout (run from another
commit's checkout with ``PYTHONPATH`` pointing at it to time that commit's driver). One line
``FINALS {...}`` on stderr per run and kind (an agent's final, a subagent's), counting the
finals sent inside the window: count, total seconds, p50, p90, max.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import dynamo_thunderagent.bench.live as live
from dynamo_thunderagent.cli import main
from dynamo_thunderagent.quantile import percentile

_run_stack = live.run_stack


def _timed(spec: Any, *args: Any, **kwargs: Any) -> Any:
    result = _run_stack(spec, *args, **kwargs)
    if result.run is None:
        return result
    for kind, of_subagent in (("agent", False), ("subagent", True)):
        took = sorted(r.end - r.start for r in result.run.records
                      if r.kind == "final" and (r.parent_session_id is not None) == of_subagent
                      and r.start < spec.window_s)
        row = {"arm": spec.label, "kind": kind, "finals": len(took),
               "sum_s": round(sum(took), 1), "p50": percentile(took, 0.5),
               "p90": percentile(took, 0.9), "max": took[-1] if took else None}
        print("FINALS", json.dumps(row), file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    live.run_stack = _timed  # type: ignore[assignment]
    sys.exit(main(["bench", "live", *sys.argv[1:]]))
