"""The plugin catalog: one registry per role, filled by us and by entry points.

Dynamo's own catalog is Rust and statically linked, so a team cannot add an
admission or selection policy without rebuilding Dynamo. Here a policy is a
Python class; another package makes it available by declaring an entry point
in one of these groups::

    [project.entry-points."dynamo_thunderagent.request_classifiers"]
    my-gate = "my_package.gate:MyGate"

A plugin class declares ``Parameters`` (a pydantic model, validated when the
policy file loads) and is constructed as ``cls(parameters)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from dynamo_thunderagent.classifier import RequestClassifier, ThunderAgentClassifier
from dynamo_thunderagent.config import (
    RESERVED_INSTANCE_NAME,
    STAGES,
    PolicyConfig,
    PolicyError,
    ResolvedComponent,
    describe_validation_error,
    has_unknown_key,
    read_policy_file,
)
from dynamo_thunderagent.selector import ThunderAgentSelector, WorkerSelector

CLASSIFIER_GROUP = "dynamo_thunderagent.request_classifiers"
SELECTOR_GROUP = "dynamo_thunderagent.worker_selectors"

P = TypeVar("P")


class PluginError(ValueError):
    """A plugin type that cannot be registered or found."""


@dataclass
class Registry(Generic[P]):
    """Named plugin types for one role."""

    role: str
    group: str
    base: type[Any]  # the role's abstract base class
    _types: dict[str, type[P]] = field(default_factory=dict)

    def register(self, name: str, plugin: type[P]) -> None:
        """Add ``plugin`` under ``name``; empty, reserved and duplicate names fail."""
        if not isinstance(name, str) or not name.strip():
            raise PluginError(f"{self.role}: a plugin type name must be a non-empty string")
        if name == RESERVED_INSTANCE_NAME:
            raise PluginError(f"{self.role}: type name {name!r} is reserved")
        if name in self._types:
            raise PluginError(
                f"{self.role}: type {name!r} is already registered "
                f"(by {_qualname(self._types[name])})"
            )
        if not (isinstance(plugin, type) and issubclass(plugin, self.base)):
            raise PluginError(
                f"{self.role}: type {name!r} must be a subclass of {_qualname(self.base)}, "
                f"got {plugin!r}"
            )
        params = getattr(plugin, "Parameters", None)
        if not (isinstance(params, type) and issubclass(params, BaseModel)):
            raise PluginError(
                f"{self.role}: type {name!r} must declare Parameters as a pydantic model"
            )
        self._types[name] = plugin

    def get(self, name: str) -> type[P]:
        try:
            return self._types[name]
        except KeyError:
            raise PluginError(
                f"{self.role}: unknown type {name!r}; registered types: {self.names()}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._types)

    def load_entry_points(self) -> None:
        """Register every entry point of this role's group (sorted, so errors are stable)."""
        for point in sorted(entry_points(group=self.group), key=lambda p: p.name):
            try:
                plugin = point.load()
            except Exception as error:  # a broken plugin package must name itself
                raise PluginError(
                    f"{self.role}: entry point {point.name!r} ({point.value}) failed to "
                    f"load: {error}"
                ) from error
            try:
                self.register(point.name, plugin)
            except PluginError as error:
                dist = getattr(getattr(point, "dist", None), "name", None) or "unknown package"
                raise PluginError(f"{error} (entry point {point.value!r} of {dist})") from None


@dataclass
class Catalog:
    request_classifiers: Registry[RequestClassifier]
    worker_selectors: Registry[WorkerSelector]

    def resolve(self, config: PolicyConfig, source: str) -> ResolvedPolicy:
        """Look up every type and validate its parameters; errors name the key."""
        classifier = None
        if config.request_classifier is not None:
            spec = config.request_classifier
            classifier = self._resolve_one(
                self.request_classifiers, "request_classifier", spec.type, spec.type,
                spec.parameters, source,
            )
        stages: dict[str, ResolvedComponent] = {}
        if config.worker_selection is not None:
            instances = {}
            for index, inst in enumerate(config.worker_selection.instances):
                instances[inst.name] = self._resolve_one(
                    self.worker_selectors, f"worker_selection.instances[{index}]",
                    inst.name, inst.type, inst.parameters, source,
                )
            for stage in STAGES:
                ref = getattr(config.worker_selection, stage)
                if ref is not None:
                    stages[stage] = instances[ref]
        return ResolvedPolicy(source=source, config=config, classifier=classifier, stages=stages)

    def _resolve_one(
        self,
        registry: Registry[Any],
        where: str,
        name: str,
        type_name: str,
        parameters: dict[str, Any],
        source: str,
    ) -> ResolvedComponent:
        try:
            plugin = registry.get(type_name)
        except PluginError as error:
            raise PolicyError(f"{source}: {where}.type: {error}") from None
        try:
            params = plugin.Parameters.model_validate(parameters)
        except ValidationError as error:
            detail = describe_validation_error(f"{where}.parameters", error, plugin.Parameters)
            if has_unknown_key(error):
                allowed = ", ".join(plugin.Parameters.model_fields) or "none"
                detail += f" [type {type_name!r} accepts parameters: {allowed}]"
            raise PolicyError(f"{source}: {detail}") from None
        return ResolvedComponent(role=registry.role, name=name, type=type_name,
                                 parameters=params)

    def build_classifier(self, resolved: ResolvedComponent, **kwargs: Any) -> RequestClassifier:
        return self.request_classifiers.get(resolved.type)(resolved.parameters, **kwargs)

    def build_selector(self, resolved: ResolvedComponent, **kwargs: Any) -> WorkerSelector:
        return self.worker_selectors.get(resolved.type)(resolved.parameters, **kwargs)


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy file whose types exist and whose parameters are valid."""

    source: str
    config: PolicyConfig
    classifier: ResolvedComponent | None
    stages: dict[str, ResolvedComponent]

    def describe(self) -> dict[str, Any]:
        """The resolved configuration, defaults filled in, as plain data (JSON types: a
        plugin's parameter that is a path or an enum comes out as its string)."""
        out: dict[str, Any] = {"source": self.source}
        if self.classifier is not None:
            out["request_classifier"] = {
                "type": self.classifier.type,
                "parameters": self.classifier.parameters.model_dump(mode="json"),
            }
        if self.stages:
            out["worker_selection"] = {
                stage: {
                    "instance": comp.name,
                    "type": comp.type,
                    "parameters": comp.parameters.model_dump(mode="json"),
                }
                for stage, comp in self.stages.items()
            }
        return out


def builtin_catalog() -> Catalog:
    """The catalog with only this package's types."""
    catalog = Catalog(
        request_classifiers=Registry("request_classifier", CLASSIFIER_GROUP, RequestClassifier),
        worker_selectors=Registry("worker_selector", SELECTOR_GROUP, WorkerSelector),
    )
    catalog.request_classifiers.register("thunderagent", ThunderAgentClassifier)
    catalog.worker_selectors.register("thunderagent", ThunderAgentSelector)
    return catalog


def default_catalog() -> Catalog:
    """Our types plus every type other installed packages declare as entry points."""
    catalog = builtin_catalog()
    catalog.request_classifiers.load_entry_points()
    catalog.worker_selectors.load_entry_points()
    return catalog


def load_policy(path: str | Path, catalog: Catalog | None = None) -> ResolvedPolicy:
    """Read, validate and resolve a router-policy file; raises PolicyError."""
    catalog = catalog or default_catalog()
    return catalog.resolve(read_policy_file(path), str(path))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
