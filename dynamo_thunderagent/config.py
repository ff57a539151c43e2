"""Router-policy YAML: the schema of Dynamo 1.6's ``--router-policy-config``.

The file names one request classifier and a set of worker-selection instances
that the aggregated/prefill/decode stages refer to by name (the llm-d style:
declare instances once, reference them by name). Every level rejects unknown
keys. Type-specific ``parameters`` are validated against the parameter model
the catalog registers for that type, so a typo fails at load time, never at the
first request.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from dynamo_thunderagent.parameters import StrictModel

RESERVED_INSTANCE_NAME = "default"
STAGES = ("aggregated", "prefill", "decode")
# A policy file is a few dozen lines; anything far larger is a mistake (or an attack on
# the YAML parser), refused before it is parsed.
MAX_POLICY_BYTES = 64 * 1024


class PolicyError(ValueError):
    """A router-policy file that cannot be used; the message names file and key."""


class ComponentSpec(StrictModel):
    """``{type, parameters}`` of the request classifier."""

    type: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value


class InstanceSpec(ComponentSpec):
    """One named worker-selection instance."""

    name: str = Field(min_length=1)


class WorkerSelectionSpec(StrictModel):
    aggregated: str | None = None
    prefill: str | None = None
    decode: str | None = None
    instances: list[InstanceSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _stages_name_instances(self) -> WorkerSelectionSpec:
        names = [instance.name for instance in self.instances]
        for name in names:
            if name == RESERVED_INSTANCE_NAME:
                raise ValueError(
                    f"instance name {name!r} is reserved; choose another name"
                )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"instance names must be unique; repeated: {duplicates}")
        for stage in STAGES:
            ref = getattr(self, stage)
            if ref is not None and ref not in names:
                raise ValueError(
                    f"{stage}: {ref!r} is not a configured instance; "
                    f"configured instances: {names or 'none'}"
                )
        return self


class PolicyConfig(StrictModel):
    request_classifier: ComponentSpec | None = None
    worker_selection: WorkerSelectionSpec | None = None


def format_number(value: float) -> str:
    """``1,800`` for whole numbers below a billion, ``0.95`` or ``1e12`` otherwise."""
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e9):
        return f"{int(value):,}"
    return f"{value:g}".replace("e+", "e")


def allowed_values(field: FieldInfo) -> str:
    """What a parameter accepts, in words: ``number in [0, 1]`` (a bracket closed where
    the bound is allowed), ``off, or integer in (0, 100]`` for one that may be null, the
    choices of a literal, ``true, false`` for a flag."""
    args = typing.get_args(field.annotation)
    optional = type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else field.annotation
    if typing.get_origin(base) is typing.Literal:
        words = ", ".join(str(a) for a in typing.get_args(base))
    elif base is bool:
        words = "true, false"
    elif base in (int, float):
        low, high, lower, upper = "(", ")", "-inf", "inf"
        for m in field.metadata:
            if getattr(m, "ge", None) is not None:
                low, lower = "[", format_number(m.ge)
            if getattr(m, "gt", None) is not None:
                low, lower = "(", format_number(m.gt)
            if getattr(m, "le", None) is not None:
                high, upper = "]", format_number(m.le)
            if getattr(m, "lt", None) is not None:
                high, upper = ")", format_number(m.lt)
        kind = "integer" if base is int else "number"
        words = f"{kind} in {low}{lower}, {upper}{high}"
    else:
        words = getattr(base, "__name__", str(base))
    return f"off, or {words}" if optional else words


def describe_validation_error(where: str, error: ValidationError,
                              model: type[BaseModel] | None = None) -> str:
    """One line per problem: ``where.key: message (got value)``. Given the ``model`` that
    was validated, a bad value of one of its fields also says what the field accepts, and
    an unknown key names the closest known one."""
    fields = model.model_fields if model is not None else {}
    lines = []
    for problem in error.errors():
        loc = ".".join(str(part) for part in problem["loc"])
        key = f"{where}.{loc}" if loc else where
        message = problem["msg"].removeprefix("Value error, ")
        field = fields.get(loc)
        if problem["type"] == "extra_forbidden":
            message = "unknown key"
            close = difflib.get_close_matches(loc, fields, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
            lines.append(f"{key}: {message}")
            continue
        got = problem.get("input")
        notes = [] if isinstance(got, (dict, list)) else [f"got {got!r}"]
        if field is not None:
            notes.append(f"allowed: {allowed_values(field)}")
        suffix = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"{key}: {message}{suffix}")
    return "; ".join(lines)


def has_unknown_key(error: ValidationError) -> bool:
    return any(problem["type"] == "extra_forbidden" for problem in error.errors())


def parse_policy(data: Any, source: str) -> PolicyConfig:
    """Validate the generic schema (not the type-specific parameters)."""
    if data is None or data == {}:
        raise PolicyError(f"{source}: the policy is empty; the router needs request_classifier "
                          "and worker_selection (see policies/thunderagent.yaml)")
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: top level must be a mapping with request_classifier "
                          f"and worker_selection, got {type(data).__name__}")
    try:
        return PolicyConfig.model_validate(data)
    except ValidationError as error:
        raise PolicyError(f"{source}: {describe_validation_error('', error).lstrip('.')}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses a key given twice in one mapping, and reads numbers the
    way YAML 1.2 (and Dynamo's own policy loader) does.

    Plain YAML keeps the last of two equal keys, so a second ``request_classifier:``
    block would silently drop the first one's parameters. PyYAML follows YAML 1.1, where
    ``1e12`` or ``5e-3`` (no dot, or no exponent sign) are text, so a strict number field
    would refuse them.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key (<<: *anchor): the base loader merges it
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                repeated = key in seen
            except TypeError:
                continue  # unhashable: the base loader refuses it with a YAML error
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (lines {seen[key]} and {line}); "
                    "give each key once", key_node.start_mark)
            seen[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


# YAML 1.2's core-schema floats that YAML 1.1 reads as text: an exponent without a dot
# (1e12) or without a sign (1.5e3).
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_policy_yaml(text: str) -> Any:
    """Policy YAML as data: safe, no repeated keys, YAML 1.2 numbers (raises
    ``yaml.YAMLError`` for text that is not such YAML)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects


def read_policy_file(path: str | Path) -> PolicyConfig:
    source = str(path)
    try:
        # Only a regular file: opening a FIFO blocks until someone writes to it, and a
        # reload runs on the router's event loop (a SIGHUP with the policy swapped for a
        # FIFO froze every request until a write came; found by a hostile-input probe).
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise PolicyError(f"{source}: not a regular file ({_file_kind(mode)}); a router "
                              "policy is a YAML file")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_POLICY_BYTES + 1)
    except OSError as error:
        raise PolicyError(f"{source}: cannot read policy file: {error.strerror}") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"{source}: the file is larger than {MAX_POLICY_BYTES // 1024} KiB; "
                          "a router policy is a few dozen lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PolicyError(f"{source}: not UTF-8 text: {error}") from None
    try:
        data = load_policy_yaml(text)
    except yaml.YAMLError as error:
        # PyYAML names its stream "<unicode string>"; the message leads with the file.
        where = str(error).replace('in "<unicode string>", ', "at ")
        raise PolicyError(f"{source}: not valid YAML: {where}") from None
    except (ValueError, RecursionError) as error:  # parsed, but not into values Python holds:
        # a date such as 2020-13-45, an integer of thousands of digits, brackets nested deep
        why = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise PolicyError(f"{source}: not valid YAML: a value cannot be read: {why}") from None
    return parse_policy(data, source)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a plain file")


@dataclass(frozen=True)
class ResolvedComponent:
    """A catalog type with its validated parameters."""

    role: str
    name: str
    type: str
    parameters: BaseModel


def with_host_tier(classifier: ResolvedComponent, host_blocks: int) -> ResolvedComponent:
    """``classifier`` told of a host KV tier of ``host_blocks`` per worker/rank, unless its
    parameters already say (or the type has no ``host_kv_blocks``, or there is no tier)."""
    params = classifier.parameters
    if host_blocks <= 0 or getattr(params, "host_kv_blocks", None) != 0:
        return classifier
    if "host_kv_blocks" in params.model_fields_set:
        return classifier  # the policy chose 0 on purpose: tier-blind
    return dataclasses.replace(
        classifier, parameters=params.model_copy(update={"host_kv_blocks": host_blocks})
    )
