"""The policy: which GPU classes exist, and the tables derived from them once at load time."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, NamedTuple

from pydantic import Field, field_validator, model_validator

from policies.classes import BACKENDS, ClassBase, GpuClass, HamiClass, Model

CLASS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
MEMORY_SUFFIX = "-memory"
# The name every chart and operator writes; translated into the class's backend (SPEC form 3).
STANDARD_GPU = "nvidia.com/gpu"
# Resource names come from users, so the table that remembers how each was classified stops
# growing here; names past it are classified on every request instead. A policy's own names
# number in the tens, so legitimate traffic never reaches it.
MAX_REMEMBERED_NAMES = 4096


class ClassKey(NamedTuple):
    """A resource key of the policy's domain that names a class: `D/<class>` or its memory."""

    class_name: str
    memory: bool


class ResourceRole(Enum):
    """What a resource name is to gpuadm."""

    CLASS = "class"  # D/<class> or D/<class>-memory
    RAW = "raw"  # a GPU stack's own resource, such as nvidia.com/gpu
    UNKNOWN_CLASS = "unknown-class"  # under the domain, but naming no class
    OTHER = "other"  # nothing to do with GPUs


class ResourceKind(NamedTuple):
    """How a resource name was classified; `key` is set for the class role only."""

    role: ResourceRole
    key: ClassKey | None = None


RAW = ResourceKind(ResourceRole.RAW)
UNKNOWN_CLASS = ResourceKind(ResourceRole.UNKNOWN_CLASS)
OTHER = ResourceKind(ResourceRole.OTHER)


def _default_resource_names() -> frozenset[str]:
    """Return the resource names every backend uses out of the box."""
    names: set[str] = set()
    for backend in BACKENDS:
        for info in backend.model_fields.values():
            default = info.default
            if isinstance(default, str) and "/" in default:
                names.add(default)
            elif isinstance(default, Model):
                names.update(v for v in default.model_dump().values() if isinstance(v, str))
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class _Lookup:
    keys: dict[str, ClassKey]
    raw_names: frozenset[str]
    raw_prefixes: tuple[str, ...]
    domain_prefix: str
    backend_annotations: list[str]
    kinds: dict[str, ResourceKind] = field(default_factory=dict)


class Policy(Model):
    """The whole `policy.yaml`."""

    domain: str = "gpuadm.io"
    default_class: str | None = None
    exempt_namespaces: list[str] = Field(default_factory=list)
    classes: dict[str, GpuClass]

    @field_validator("domain")
    @classmethod
    def _domain_is_dns(cls, domain: str) -> str:
        if not DOMAIN.match(domain) or len(domain) > 253:
            raise ValueError(f"{domain!r} is not a DNS subdomain such as gpuadm.io")
        return domain

    @field_validator("classes")
    @classmethod
    def _class_names(cls, classes: dict[str, ClassBase]) -> dict[str, ClassBase]:
        if not classes:
            raise ValueError("define at least one GPU class")
        for name in classes:
            if not CLASS_NAME.match(name):
                raise ValueError(
                    f"class name {name!r} must be lowercase letters, digits and '-', at most "
                    "63 characters, starting and ending with a letter or digit"
                )
            if name.endswith(MEMORY_SUFFIX):
                raise ValueError(
                    f"class name {name!r} must not end in {MEMORY_SUFFIX!r}: "
                    f"<class>{MEMORY_SUFFIX} is the key that asks for memory"
                )
        return classes

    @model_validator(mode="after")
    def _cross_checks(self) -> Policy:
        if self.default_class is not None and self.default_class not in self.classes:
            raise ValueError(
                f"defaultClass {self.default_class!r} is not a class "
                f"(classes: {', '.join(sorted(self.classes))})"
            )
        _check_hami_types(self.classes)
        return self

    @cached_property
    def _lookup(self) -> _Lookup:
        """Build, once, the tables the admission path reads on every request."""
        keys: dict[str, ClassKey] = {}
        for name in self.classes:
            keys[f"{self.domain}/{name}"] = ClassKey(name, memory=False)
            keys[f"{self.domain}/{name}{MEMORY_SUFFIX}"] = ClassKey(name, memory=True)
        names = set(_default_resource_names())
        prefixes = {"nvidia.com/mig-"}
        for gpu_class in self.classes.values():
            names.update(gpu_class.resource_names())
            prefix = getattr(gpu_class, "resource_prefix", None)
            if prefix:
                prefixes.add(prefix)
        written = sorted({key for c in self.classes.values() for key in c.annotations()})
        return _Lookup(keys, frozenset(names), tuple(sorted(prefixes)), self.domain + "/", written)

    def class_key(self, name: str) -> ClassKey | None:
        """Map `D/<class>` or `D/<class>-memory` to its class, or None."""
        return self._lookup.keys.get(name)

    def resource_kind(self, name: str) -> ResourceKind:
        """Classify a resource name; remembered, since the same names recur in every pod."""
        kinds = self._lookup.kinds
        kind = kinds.get(name)
        if kind is not None:
            return kind
        if (class_key := self.class_key(name)) is not None:
            kind = ResourceKind(ResourceRole.CLASS, class_key)
        elif self.in_domain(name):
            kind = UNKNOWN_CLASS
        elif self.is_gpu_resource(name):
            kind = RAW
        else:
            kind = OTHER
        if len(kinds) < MAX_REMEMBERED_NAMES:
            kinds[name] = kind
        return kind

    def in_domain(self, key: str) -> bool:
        """Tell whether a key (resource, label, annotation) is under the policy's domain."""
        return key.startswith(self._lookup.domain_prefix)

    def is_gpu_resource(self, name: str) -> bool:
        """Tell whether a raw resource name belongs to any GPU stack gpuadm knows."""
        lookup = self._lookup
        return name in lookup.raw_names or name.startswith(lookup.raw_prefixes)

    @property
    def backend_annotation_keys(self) -> list[str]:
        """Return the annotation keys backends write (e.g. HAMi's `nvidia.com/use-gputype`)."""
        return self._lookup.backend_annotations

    @property
    def class_annotation(self) -> str:
        """Return the key of the class annotation and label, `D/class`."""
        return f"{self.domain}/class"

    @property
    def demand_annotation(self) -> str:
        """Return the key of the demand annotation, `D/demand`."""
        return f"{self.domain}/demand"


def _check_hami_types(classes: dict[str, Any]) -> None:
    """Refuse HAMi type names that would also pick another class's GPUs.

    HAMi matches `nvidia.com/use-gputype` by case-insensitive substring, so a class typed
    `A10` would also land on A100s.
    """
    typed = [
        (name, gpu_type)
        for name, gpu_class in classes.items()
        if isinstance(gpu_class, HamiClass)
        for gpu_type in gpu_class.types()
    ]
    for name, gpu_type in typed:
        for other_name, other_type in typed:
            if other_name != name and gpu_type.upper() in other_type.upper():
                raise ValueError(
                    f"class {name!r}: HAMi GPU type {gpu_type!r} is a substring of "
                    f"{other_type!r} of class {other_name!r}, and HAMi matches by substring, "
                    f"so {name!r} pods could land on {other_name!r} GPUs; use the full name"
                )
