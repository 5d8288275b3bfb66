"""Dynamic Resource Allocation: a class whose GPUs come through ResourceClaims.

A `dra` class is given to a container as a claim for whole devices of the class's
DeviceClass, selected by CEL on the driver's `productName` attribute (and any selectors the
admin adds). The claims come from ResourceClaimTemplates that gpuadm keeps, one per class and
device count, named for what they hold: `gpuadm-<class>-<count>-<digest>`, where the digest
is that of the template's spec. A pod names a template under an entry of
`spec.resourceClaims` that is gpuadm's too (`gpuadm-c<index>` for the app container at that
index, `gpuadm-i<index>` for an init container), and its container lists the entry in
`resources.claims`. The name alone tells which class and how many devices a pod holds,
whichever policy wrote it; the digest tells whether the template is the one today's policy
writes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Literal, NamedTuple

import orjson
from pydantic import Field, field_validator

from policies.asks import Ask, Grant, Whole
from policies.class_base import ClassBase
from policies.errors import Denial
from policies.models import dra_selector

TEMPLATE_PREFIX = "gpuadm-"
# The entry names of a pod's `spec.resourceClaims` that are gpuadm's, one per container.
ENTRY_PREFIX = "gpuadm-"
_ENTRY = re.compile(r"^gpuadm-(?P<kind>[ci])(?P<index>0|[1-9][0-9]{0,4})$")
_TEMPLATE = re.compile(
    r"^gpuadm-(?P<class>[a-z0-9-]+)-(?P<count>[1-9][0-9]{0,3})-(?P<digest>[0-9a-f]{10})$"
)
# What one request of a template is called; the claim's allocation names it.
REQUEST_NAME = "gpu"
# The device classes of NVIDIA's DRA driver: whole GPUs and MIG slices.
NVIDIA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
# A DNS label, as a DeviceClass name and a driver name are made of.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A claim's allocation holds at most this many devices (resource.k8s.io/v1
# AllocationResultsMaxSize): the scheduler cannot allocate a claim for more.
MAX_DEVICES = 32


class DraClass(ClassBase):
    """Whole GPUs of a DeviceClass, allocated by the scheduler through a ResourceClaim."""

    uses_memory: ClassVar[bool] = False
    holds_for_pod_lifetime: ClassVar[bool] = True
    backend: Literal["dra"] = "dra"
    device_class_name: str = "gpu.nvidia.com"
    # The DRA driver whose attributes the selectors read (`device.attributes[driver]`).
    driver: str = "gpu.nvidia.com"
    # More CEL selectors, ANDed with the one on `models`: e.g. on memory capacity.
    selectors: list[str] = Field(default_factory=list)

    @field_validator("device_class_name", "driver")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"{value!r} is not a DNS subdomain such as gpu.nvidia.com")
        return value

    @field_validator("selectors")
    @classmethod
    def _selectors(cls, selectors: list[str]) -> list[str]:
        for selector in selectors:
            if not selector.strip():
                raise ValueError("a selector is an empty CEL expression")
        return selectors

    def resource_names(self) -> frozenset[str]:
        return frozenset()

    def gfd_products(self) -> list[str]:
        # The claim's selector picks the model; the pod needs no node affinity for it.
        return []

    def grant(self, ask: Ask) -> Grant:
        if not isinstance(ask, Whole):
            raise Denial(
                f"asks for {ask.describe()}, but backend dra gives whole GPUs only: a DRA "
                "driver shares a device between the containers of one claim, not between "
                "pods; ask for 1 or more"
            )
        if ask.count > MAX_DEVICES:
            raise Denial(f"asks for {ask.describe()}; a claim holds at most {MAX_DEVICES} devices")
        warnings: tuple[str, ...] = ()
        if ask.memory_cap is not None:
            warnings = ("backend dra cannot cap GPU memory: the memory request is ignored",)
        return Grant({}, Fraction(ask.count), warnings, devices=ask.count)

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return Fraction(0)

    def claim_spec(self, count: int) -> dict[str, Any]:
        """Return the ResourceClaimSpec of a claim for `count` devices of the class."""
        expressions = [dra_selector(self.models, driver=self.driver)] if self.models else []
        expressions += self.selectors
        exactly: dict[str, Any] = {
            "deviceClassName": self.device_class_name,
            "allocationMode": "ExactCount",
            "count": count,
        }
        if expressions:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in expressions]
        return {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}

    def template(self, class_name: str, count: int) -> ClaimTemplate:
        """Return the ResourceClaimTemplate gpuadm keeps for `count` devices of the class."""
        spec = self.claim_spec(count)
        digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return ClaimTemplate(
            f"{TEMPLATE_PREFIX}{class_name}-{count}-{digest[:10]}", class_name, count, spec
        )


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A ResourceClaimTemplate of gpuadm's: its name, what it holds, and its spec."""

    name: str
    class_name: str
    count: int
    spec: dict[str, Any]

    def manifest(self, namespace: str, *, labels: Mapping[str, str]) -> dict[str, Any]:
        """Return the template as stored in `namespace`, with gpuadm's `labels`."""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": self.name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"spec": self.spec},
        }


class TemplateName(NamedTuple):
    """What the name of one of gpuadm's templates says: the class and the device count."""

    class_name: str
    devices: int


def parse_template_name(name: str) -> TemplateName | None:
    """Return what a template name says if it is one of gpuadm's, else None."""
    match = _TEMPLATE.match(name)
    if match is None:
        return None
    return TemplateName(match["class"], int(match["count"]))


def entry_name(kind: str, index: int) -> str:
    """Return gpuadm's `spec.resourceClaims` entry name for a container."""
    return f"{ENTRY_PREFIX}{'c' if kind == 'containers' else 'i'}{index}"


def is_entry_name(name: str) -> bool:
    """Tell whether a `spec.resourceClaims` entry name is one gpuadm writes."""
    return _ENTRY.match(name) is not None


def requested_device_classes(spec: object) -> list[str]:
    """Return the DeviceClass names a ResourceClaimSpec requests, exactly or as alternatives.

    Any value the apiserver would not store yields no name: the apiserver refuses it itself.
    """
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    names: list[str] = []
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, Mapping):
            continue
        exactly = request.get("exactly")
        if isinstance(exactly, Mapping):
            names.append(str(exactly.get("deviceClassName")))
        for alternative in _list(request.get("firstAvailable")):
            if isinstance(alternative, Mapping):
                names.append(str(alternative.get("deviceClassName")))
    return names


def _list(value: object) -> Sequence[object]:
    return value if isinstance(value, list) else ()
