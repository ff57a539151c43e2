"""Where the shipped router-policy files are: ``policies/`` of a checkout (an editable install
reads it through the package's ``policies`` link to it) or the copy a wheel ships in the
package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dynamo_thunderagent.config import describe_validation_error, load_policy_yaml
from dynamo_thunderagent.parameters import ThunderAgentParameters

POLICY_DIR = (Path(__file__).resolve().parent / "policies").resolve()
# Dynamo's parameter set only: the file both Dynamo's builtin plugin and ours read.
PARITY_POLICY = POLICY_DIR / "thunderagent.yaml"
# Our mechanisms on top; what arm `ours` runs unless told otherwise.
EXTENDED_POLICY = POLICY_DIR / "thunderagent-extended.yaml"


# How benchmarks run the routers' durations (--policy-clock): on the regime's clock, or as written.
POLICY_CLOCKS = ("regime", "wall")


def _our_classifier(policy: Path) -> tuple[Any, dict[str, Any] | None]:
    """The parsed file and its thunderagent classifier's parameters (a new dict; None when the
    file has no thunderagent classifier). Raises ValueError naming the file when it cannot be
    read or parsed."""
    try:
        data: Any = load_policy_yaml(policy.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{policy}: {error}") from None
    classifier = data.get("request_classifier") if isinstance(data, dict) else None
    if not isinstance(classifier, dict) or classifier.get("type") != "thunderagent":
        return data, None
    params = classifier.get("parameters") or {}
    if not isinstance(params, dict):
        return data, None  # the router's own loader names what is wrong with it
    return data, dict(params)


def _write_copy(data: Any, params: dict[str, Any], path: Path, header: str) -> Path:
    """``data`` with its classifier's parameters replaced, written to ``path``."""
    data["request_classifier"]["parameters"] = params
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def policy_with_host_tier(policy: Path, host_blocks: int, out_dir: Path) -> Path:
    """The policy file to run where a host KV tier of ``host_blocks`` per worker/rank
    exists: ``policy`` itself when it sets ``host_kv_blocks`` (its operator chose) or has
    no thunderagent classifier, else a copy under ``out_dir`` that sets it.

    The same rule as :func:`dynamo_thunderagent.config.with_host_tier`, for harnesses that
    hand a file to a router process.
    """
    if host_blocks <= 0:
        return policy
    data, params = _our_classifier(policy)
    if params is None or "host_kv_blocks" in params:
        return policy
    header = (f"# {policy.name} with the host KV tier the benchmark runs "
              f"({host_blocks} blocks per worker/rank)\n")
    return _write_copy(data, {**params, "host_kv_blocks": host_blocks},
                       out_dir / f"{policy.stem}-host{host_blocks}.yaml", header)


# The parameters Dynamo 1.6's builtin plugin knows (it rejects any other name): the parity set.
DYNAMO_PARAMETERS = frozenset({
    "pause_threshold", "pause_target", "resume_hysteresis", "resume_timeout_seconds",
    "session_retention_seconds", "scheduler_interval_seconds", "acting_token_weight",
    "acting_decay_tau_seconds", "buffer_per_program", "max_tracked_requests",
})


def seconds_on_clock(parameters: dict[str, Any], time_scale: float, *,
                     ours: bool = True) -> dict[str, Any]:
    """``parameters`` with every duration multiplied by ``time_scale``: the same policy on a
    clock that runs ``1 / time_scale`` times as fast. A duration is a ``*_seconds``
    parameter; those left at their defaults are written out, scaled: Dynamo's timing ones
    always, ours too when the file already uses a parameter only our router reads (Dynamo's
    plugin rejects names it does not know). ``parameters`` is left as it is; raises
    ValueError for a scale that is not a positive number, a duration that is not a number,
    or, with ``ours`` (the file is for our router), a result our router would refuse; a file
    for Dynamo's plugin is its to judge (scaling keeps a positive duration positive)."""
    if not (isinstance(time_scale, (int, float)) and 0 < time_scale < float("inf")):
        raise ValueError(f"time scale must be a positive number, got {time_scale!r}")
    fields = ThunderAgentParameters.model_fields
    parity = DYNAMO_PARAMETERS
    ours_only = any(name not in parity for name in parameters)
    scaled = dict(parameters)
    for name, field in fields.items():
        if name.endswith("_seconds") and field.default is not None and (
                name in parity or ours_only):
            scaled.setdefault(name, field.default)
    for name, value in scaled.items():
        if not name.endswith("_seconds") or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number of seconds, got {value!r}")
        scaled[name] = value * time_scale
    if not ours:
        return scaled
    try:
        ThunderAgentParameters.model_validate(scaled)
    except ValidationError as error:
        problems = describe_validation_error("parameters", error)
        raise ValueError(f"at time scale {time_scale:g}: {problems}") from None
    return scaled


def policy_on_clock(policy: Path, time_scale: float, out_dir: Path, *,
                    ours: bool = True) -> Path:
    """The policy file to run on a benchmark clock of ``time_scale`` wall seconds per real
    second (agents' tools and the engine both run that much faster): ``policy`` itself at
    scale 1 or without a thunderagent classifier, else a copy under ``out_dir`` whose
    durations are scaled alike (:func:`seconds_on_clock`), so that a 60 s wait in the file
    is as long, against the agents' turns, as 60 s is in production; ``ours``: the file is
    for our router (validated as it would read it). Raises ValueError naming the file."""
    if time_scale == 1:
        return policy
    data, params = _our_classifier(policy)
    if params is None:
        return policy
    try:
        scaled = seconds_on_clock(params, time_scale, ours=ours)
    except ValueError as error:
        raise ValueError(f"{policy}: {error}") from None
    header = (f"# {policy.name} with every duration x{time_scale:g}: the benchmark's clock "
              f"runs {1 / time_scale:g}x as fast as real time\n")
    return _write_copy(data, scaled, out_dir / f"{policy.stem}-clock{time_scale:g}.yaml", header)
