"""Where the shipped router-policy files are: ``policies/`` of a checkout (an editable install
reads it through the package's ``policies`` link to it) or the copy a wheel ships in the
package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dynamo_thunderagent.config import load_policy_yaml

POLICY_DIR = (Path(__file__).resolve().parent / "policies").resolve()
# Dynamo's parameter set only: the file both Dynamo's builtin plugin and ours read.
PARITY_POLICY = POLICY_DIR / "thunderagent.yaml"
# Our mechanisms on top; what arm `ours` runs unless told otherwise.
EXTENDED_POLICY = POLICY_DIR / "thunderagent-extended.yaml"


def policy_with_host_tier(policy: Path, host_blocks: int, out_dir: Path) -> Path:
    """The policy file to run where a host KV tier of ``host_blocks`` per worker/rank
    exists: ``policy`` itself when it sets ``host_kv_blocks`` (its operator chose) or has
    no thunderagent classifier, else a copy under ``out_dir`` that sets it.

    The same rule as :func:`dynamo_thunderagent.config.with_host_tier`, for harnesses that
    hand a file to a router process.
    """
    data: Any = load_policy_yaml(policy.read_text(encoding="utf-8"))
    classifier = data.get("request_classifier") if isinstance(data, dict) else None
    if host_blocks <= 0 or not isinstance(classifier, dict):
        return policy
    params = classifier.get("parameters") or {}
    if classifier.get("type") != "thunderagent" or "host_kv_blocks" in params:
        return policy
    classifier["parameters"] = {**params, "host_kv_blocks": host_blocks}
    out_dir.mkdir(parents=True, exist_ok=True)
    told = out_dir / f"{policy.stem}-host{host_blocks}.yaml"
    header = (f"# {policy.name} with the host KV tier the benchmark runs "
              f"({host_blocks} blocks per worker/rank)\n")
    told.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return told
