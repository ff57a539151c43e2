#!/usr/bin/env bash
# The simulator's view of other tenants' traffic (docs/benchmarks.md, "Other tenants' traffic
# beside the agents"): every calibrated shape, with and without 8 loops of sessionless requests
# (8,000 unique prompt and 640 output tokens each: live's --background 8 at the simulator's
# token scale), ours with sessionless_kv reserve (the extended policy) and ignore, stock and
# upstream. About a minute on 2 cores.
# Usage: docs/benchmarks/background-20261201/sim/run.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=${1:-bench-results/sim-background}
mkdir -p "$out"
dta=(.venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --jobs 2 --json)
for shape in trace long fanout; do
  "${dta[@]}" --workload "$shape" --arms ours,stock,upstream > "$out/$shape.none.json"
  "${dta[@]}" --workload "$shape" --arms ours,stock,upstream --background 8:8000:640 \
    > "$out/$shape.reserve.json"
  "${dta[@]}" --workload "$shape" --arms ours --background 8:8000:640 \
    --policy policies/ablations/minus_sessionless_kv.yaml > "$out/$shape.ignore.json"
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("| shape | N | stock | upstream | ours, ignore | ours, reserve | ours, no traffic (x its stock) | hit rate: stock / ignore / reserve | other tenants done: stock / ignore / reserve |")
print("|---|---|---|---|---|---|---|---|---|")
for shape in ("trace", "long", "fanout"):
    runs = {k: json.loads((out / f"{shape}.{k}.json").read_text())
            for k in ("none", "reserve", "ignore")}
    def row(kind, arm, n):
        return next(r for r in runs[kind]["results"] if r["arm"] == arm and r["agents"] == n)
    for n in runs["reserve"]["agents"][-3:]:
        stock = row("reserve", "stock", n)
        s = stock["steps_per_min"]
        up, ign, res = row("reserve", "upstream", n), row("ignore", "ours", n), row("reserve", "ours", n)
        quiet, quiet_stock = row("none", "ours", n), row("none", "stock", n)
        print(f"| {shape} | {n} | {s:.0f} | {up['steps_per_min'] / s:.2f}x | "
              f"{ign['steps_per_min'] / s:.2f}x | **{res['steps_per_min'] / s:.2f}x** | "
              f"{quiet['steps_per_min'] / quiet_stock['steps_per_min']:.2f}x | "
              f"{stock['hit_rate']:.2f} / {ign['hit_rate']:.2f} / {res['hit_rate']:.2f} | "
              f"{stock['background']['completed']} / {ign['background']['completed']} / "
              f"{res['background']['completed']} |")
PY
