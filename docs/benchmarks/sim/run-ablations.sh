#!/usr/bin/env bash
# Re-runs the simulator ablations of docs/benchmarks.md: the baseline arms with the shipped
# extended policy, the parity policy, and one run of arm ours per file in policies/ablations/
# ("plus_X": parity + mechanism X; "minus_X": extended without X; "with_X": extended + X),
# in both regimes, and the sessionless_kv ones again beside other tenants' traffic
# (calibrated-background), then prints the ablation tables. About 8 minutes on 2 cores.
# Usage: docs/benchmarks/sim/run-ablations.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-bench-results/sim-ablations}
mkdir -p "$out"
dta=(.venv/bin/python -m dynamo_thunderagent bench sim --jobs 1 --json)
for regime in calibrated cheap-recompute; do
  "${dta[@]}" --regime "$regime" --arms ours,stock,ttl-pinning,upstream \
    --policy policies/thunderagent-extended.yaml > "$out/$regime.base.json"
  "${dta[@]}" --regime "$regime" --arms ours --policy policies/thunderagent.yaml \
    > "$out/$regime.parity.json"
  for policy in policies/ablations/*.yaml; do
    "${dta[@]}" --regime "$regime" --arms ours --policy "$policy" \
      > "$out/$regime.$(basename "$policy" .yaml).json"
  done
done
# The sessionless_kv rows measure something only beside other tenants' traffic: the calibrated
# regime again with 8 loops of sessionless requests (bench sim --background), those rows only.
bg=(--regime calibrated --background 8:8000:640)
"${dta[@]}" "${bg[@]}" --arms ours,stock,ttl-pinning,upstream \
  --policy policies/thunderagent-extended.yaml > "$out/calibrated-background.base.json"
"${dta[@]}" "${bg[@]}" --arms ours --policy policies/thunderagent.yaml \
  > "$out/calibrated-background.parity.json"
for policy in policies/ablations/*_sessionless_kv*.yaml; do
  "${dta[@]}" "${bg[@]}" --arms ours --policy "$policy" \
    > "$out/calibrated-background.$(basename "$policy" .yaml).json"
done
.venv/bin/python - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
# Every mechanism with an ablation file (python -m dynamo_thunderagent.bench.ablations).
MECHANISMS = sorted({p.stem.split("_", 1)[1] for p in Path("policies/ablations").glob("*.yaml")})
for regime in ("calibrated", "cheap-recompute", "calibrated-background"):
    base = json.loads((out / f"{regime}.base.json").read_text())
    top = base["agents"][-2:]
    stock = {r["agents"]: r for r in base["results"] if r["arm"] == "stock"}

    def cells(results, arm="ours"):
        rows = {r["agents"]: r for r in results if r["arm"] == arm}
        return " | ".join(
            f"{rows[n]['steps_per_min']:.0f} ({rows[n]['steps_per_min'] / stock[n]['steps_per_min']:.2f}x)"
            f" / {rows[n]['hit_rate']:.3f} / {rows[n]['wait_max_s'] or 0:.0f} s / {rows[n]['pauses']}"
            for n in top)

    print(f"\n### {regime}: steps/min (x stock) / hit rate / max wait / pauses, N = {top}\n")
    print("| variant | " + " | ".join(f"N={n}" for n in top) + " |")
    print("|---|" + "---|" * len(top))
    for arm in ("stock", "ttl-pinning", "upstream"):
        print(f"| {arm} | {cells(base['results'], arm)} |")
    print(f"| parity | {cells(json.loads((out / f'{regime}.parity.json').read_text())['results'])} |")
    print(f"| extended (default) | {cells(base['results'])} |")
    labels = {"plus": "parity + {}", "minus": "extended - {}", "with": "extended + {}"}
    for name in MECHANISMS:
        for kind, label in labels.items():
            path = out / f"{regime}.{kind}_{name}.json"
            if path.exists():
                print(f"| {label.format(name)} | {cells(json.loads(path.read_text())['results'])} |")
PY
