#!/usr/bin/env bash
# The simulator's view of other tenants' traffic (docs/benchmarks.md, "Other tenants' traffic
# beside the agents"): the three calibrated shapes at 3x, seeds 0-2, beside 8 loops of
# sessionless requests (8,000 unique prompt and 640 output tokens each: live's --background 8
# at the simulator's token scale), for stock, upstream and ours ignoring that traffic, reserving
# all of its room, and reserving it as far as the engine loses caches (the extended policy);
# and stock and ours without the traffic. About 2 minutes on 2 cores.
# Usage: docs/benchmarks/background-20261201/sim/run.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
out=${1:-bench-results/sim-background}
mkdir -p "$out"
dta=(.venv/bin/python -m dynamo_thunderagent bench sim --regime calibrated --jobs 2 --json)
bg=(--background 8:8000:640)
for seed in 0 1 2; do
  for shape in trace long fanout; do
    n=36; [ "$shape" = fanout ] && n=22
    f=(--workload "$shape" --agents "$n" --seed "$seed")
    "${dta[@]}" "${f[@]}" --arms ours,stock > "$out/$shape.$seed.quiet.json"
    "${dta[@]}" "${f[@]}" "${bg[@]}" --arms ours,stock,upstream > "$out/$shape.$seed.adaptive.json"
    "${dta[@]}" "${f[@]}" "${bg[@]}" --arms ours \
      --policy policies/ablations/minus_sessionless_kv_full_loss.yaml > "$out/$shape.$seed.full.json"
    "${dta[@]}" "${f[@]}" "${bg[@]}" --arms ours \
      --policy policies/ablations/minus_sessionless_kv.yaml > "$out/$shape.$seed.ignore.json"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])

def run(shape, seed, kind, arm="ours"):
    data = json.loads((out / f"{shape}.{seed}.{kind}.json").read_text())
    return next(r for r in data["results"] if r["arm"] == arm)

print("| shape, N | stock | upstream | ours, `ignore` | ours, `reserve` (all) | ours, `reserve` + "
      "`full_loss: 0.1` (extended) | ours without the traffic (x its stock) | hit rate: stock / "
      "ignore / all / extended | other tenants done: stock / ignore / all / extended |")
print("|---|---|---|---|---|---|---|---|---|")
for shape in ("trace", "long", "fanout"):
    seeds = (0, 1, 2)
    def mean(kind, arm="ours", key="steps_per_min"):
        return sum(run(shape, s, kind, arm)[key] for s in seeds) / len(seeds)
    def each(kind, arm="ours"):
        return ", ".join(f"{run(shape, s, kind, arm)['steps_per_min']:.0f}" for s in seeds)
    def done(kind, arm="ours"):
        return sum(run(shape, s, kind, arm)["background"]["completed"] for s in seeds) / len(seeds)
    stock = mean("adaptive", "stock")
    n = run(shape, 0, "adaptive", "stock")["agents"]
    cells = [f"{mean('adaptive', 'upstream') / stock:.2f}x"]
    for kind in ("ignore", "full", "adaptive"):
        cells.append(f"{mean(kind) / stock:.2f}x ({each(kind)})")
    quiet = mean("quiet") / mean("quiet", "stock")
    hits = " / ".join(f"{mean(k, a, 'hit_rate'):.2f}" for k, a in
                      (("adaptive", "stock"), ("ignore", "ours"), ("full", "ours"),
                       ("adaptive", "ours")))
    dones = " / ".join(f"{done(k, a):.0f}" for k, a in
                       (("adaptive", "stock"), ("ignore", "ours"), ("full", "ours"),
                        ("adaptive", "ours")))
    print(f"| {shape}, {n} | {stock:.0f} ({each('adaptive', 'stock')}) | {' | '.join(cells)} | "
          f"{quiet:.2f}x | {hits} | {dones} |")
PY
