"""The ablation policies: one mechanism on or off at a time, derived from the shipped files.

For every extension the extended policy turns on, ``plus_<name>.yaml`` is the parity policy
with that one setting added and ``minus_<name>.yaml`` is the extended policy with it back at
its parity default; for each extension the extended policy leaves off (:data:`LEFT_OFF`),
``plus_<name>.yaml`` adds it to parity and ``with_<name>.yaml`` adds it to the extended
policy. A parameter of Dynamo's own that the extended policy sets to another value than parity
(``resume_timeout_seconds``) gets both files too: ``plus_`` is parity with the extended value,
``minus_`` the extended policy with parity's. The worker selector's parameters that the
extended policy sets get a ``plus_`` and a ``minus_`` file the same way.
``minus_host_tier.yaml`` is the extended policy blind to a host KV tier: it sets
``host_kv_blocks: 0`` on purpose, so a benchmark with a tier does not tell it the size.
The files in ``policies/ablations/`` are written by ``python -m
dynamo_thunderagent.bench.ablations`` and a test checks that they match, so they follow the
shipped policies instead of drifting from them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from dynamo_thunderagent.config import load_policy_yaml
from dynamo_thunderagent.policy_files import EXTENDED_POLICY, PARITY_POLICY, POLICY_DIR

ABLATION_DIR = POLICY_DIR / "ablations"
# Extensions the extended policy leaves off: ablation label -> the parameters tried (with
# what they need: aging_makes_room works on max_wait_seconds, which parity leaves off).
LEFT_OFF: dict[str, dict[str, Any]] = {
    "pressure_decay": {"pressure_decay": True},
    "pause_order": {"pause_order": "longest_idle"},
    "expected_return": {"pause_order": "expected_return"},
    "cache_loss_gate": {"pause_min_cache_loss": 0.05},
    "acting_hold": {"acting_hold_factor": 1.0},
    "aging_makes_room": {"aging_makes_room": True, "max_wait_seconds": 60},
    "let_in_excluded": {"hold_excludes_let_in": True, "hold_max_cache_loss": 0.5},
}
# Extended-policy parameters that work only beside others: their ``plus_`` file adds what
# they need too, and the ``minus_`` file of what they need drops them as well.
NEEDS: dict[str, tuple[str, ...]] = {"sessionless_kv_full_loss": ("sessionless_kv",)}


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = load_policy_yaml(path.read_text(encoding="utf-8"))
    return data


def _with_parameters(policy: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    out = dict(policy)
    out["request_classifier"] = {**policy["request_classifier"], "parameters": parameters}
    return out


def _selector_parameters(policy: dict[str, Any]) -> dict[str, Any]:
    """The parameters of the worker-selector instance the aggregated stage uses."""
    selection = policy.get("worker_selection") or {}
    for instance in selection.get("instances") or []:
        if instance.get("name") == selection.get("aggregated"):
            return dict(instance.get("parameters") or {})
    return {}


def _with_selector_parameters(policy: dict[str, Any],
                              parameters: dict[str, Any]) -> dict[str, Any]:
    selection = dict(policy["worker_selection"])
    instances = []
    for instance in selection["instances"]:
        if instance["name"] == selection["aggregated"]:
            instance = {k: v for k, v in instance.items() if k != "parameters"}
            if parameters:
                instance["parameters"] = parameters
        instances.append(instance)
    return {**policy, "worker_selection": {**selection, "instances": instances}}


def ablations() -> dict[str, dict[str, Any]]:
    """File stem -> policy, for every ablation (see the module docstring)."""
    parity = _load(PARITY_POLICY)
    extended = _load(EXTENDED_POLICY)
    base = parity["request_classifier"]["parameters"]
    full = extended["request_classifier"]["parameters"]
    if dropped := sorted(set(base) - set(full)):
        raise ValueError(f"{EXTENDED_POLICY} leaves out parity parameters {dropped}: set them "
                         "there too, so that every ablation starts from the same values")
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(full) - set(base)):
        needed = {n: full[n] for n in NEEDS.get(name, ())}
        out[f"plus_{name}"] = _with_parameters(parity, {**base, **needed, name: full[name]})
        gone = {name, *(n for n, needs in NEEDS.items() if name in needs)}
        out[f"minus_{name}"] = _with_parameters(
            extended, {k: v for k, v in full.items() if k not in gone})
    # Dynamo's own parameters that the extended policy sets to other values: ``plus_`` is
    # parity with the extended value, ``minus_`` the extended policy with parity's.
    for name in sorted(n for n in set(full) & set(base) if full[n] != base[n]):
        out[f"plus_{name}"] = _with_parameters(parity, {**base, name: full[name]})
        out[f"minus_{name}"] = _with_parameters(extended, {**full, name: base[name]})
    for label, tried in sorted(LEFT_OFF.items()):
        out[f"plus_{label}"] = _with_parameters(parity, {**base, **tried})
        out[f"with_{label}"] = _with_parameters(extended, {**full, **tried})
    # The worker selector's own extensions, the same way.
    chosen, plain = _selector_parameters(extended), _selector_parameters(parity)
    for name in sorted(set(chosen) - set(plain)):
        out[f"plus_{name}"] = _with_selector_parameters(parity, {**plain, name: chosen[name]})
        out[f"minus_{name}"] = _with_selector_parameters(
            extended, {k: v for k, v in chosen.items() if k != name})
    out["minus_host_tier"] = _with_parameters(extended, {**full, "host_kv_blocks": 0})
    return out


def render(policy: dict[str, Any]) -> str:
    return yaml.safe_dump(policy, sort_keys=True)


def main() -> int:
    """Rewrite ``policies/ablations/`` from the shipped policies."""
    ABLATION_DIR.mkdir(exist_ok=True)
    wanted = ablations()
    for stale in ABLATION_DIR.glob("*.yaml"):
        if stale.stem not in wanted:
            stale.unlink()
    for stem, policy in wanted.items():
        (ABLATION_DIR / f"{stem}.yaml").write_text(render(policy), encoding="utf-8")
    print(f"wrote {len(wanted)} ablation policies into {ABLATION_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
