"""Where the shipped router-policy files are: ``policies/`` of a checkout (an editable install
reads it through the package's ``policies`` link to it) or the copy a wheel ships in the
package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dynamo_thunderagent.config import ThunderAgentParameters, load_policy_yaml

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


# Dynamo's timing parameters: both its builtin plugin and ours read them, so a copy may set
# them where the file leaves them at their defaults.
PARITY_SECONDS = ("resume_timeout_seconds", "session_retention_seconds",
                  "scheduler_interval_seconds", "acting_decay_tau_seconds")


def seconds_on_clock(parameters: dict[str, Any], time_scale: float) -> dict[str, Any]:
    """``parameters`` with every duration (a ``*_seconds`` parameter; the parity ones at
    their defaults when left out) multiplied by ``time_scale``: the same policy on a clock
    that runs ``1 / time_scale`` times as fast. Pure; raises ValueError for a scale that is
    not a positive number or a duration that is not one."""
    if not (isinstance(time_scale, (int, float)) and 0 < time_scale < float("inf")):
        raise ValueError(f"time scale must be a positive number, got {time_scale!r}")
    fields = ThunderAgentParameters.model_fields
    scaled = dict(parameters)
    for name in PARITY_SECONDS:
        scaled.setdefault(name, fields[name].default)
    for name, value in scaled.items():
        if not name.endswith("_seconds") or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number of seconds, got {value!r}")
        scaled[name] = value * time_scale
    return scaled


def policy_on_clock(policy: Path, time_scale: float, out_dir: Path) -> Path:
    """The policy file to run on a benchmark clock of ``time_scale`` wall seconds per real
    second (agents' tools and the engine both run that much faster): ``policy`` itself at
    scale 1 or without a thunderagent classifier, else a copy under ``out_dir`` whose
    durations are scaled alike (:func:`seconds_on_clock`), so that a 60 s wait in the file
    is as long, against the agents' turns, as 60 s is in production."""
    data: Any = load_policy_yaml(policy.read_text(encoding="utf-8"))
    classifier = data.get("request_classifier") if isinstance(data, dict) else None
    if time_scale == 1 or not isinstance(classifier, dict):
        return policy
    if classifier.get("type") != "thunderagent":
        return policy
    params = classifier.get("parameters") or {}
    if not isinstance(params, dict):
        return policy  # the router's own loader names what is wrong with it
    try:
        classifier["parameters"] = seconds_on_clock(params, time_scale)
    except ValueError as error:
        raise ValueError(f"{policy}: {error}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    told = out_dir / f"{policy.stem}-clock{time_scale:g}.yaml"
    header = (f"# {policy.name} with every duration x{time_scale:g}: the benchmark's clock "
              f"runs {1 / time_scale:g}x as fast as production\n")
    told.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return told
