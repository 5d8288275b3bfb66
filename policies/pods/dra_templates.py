"""gpuadm's ResourceClaimTemplates, and the names that say what they hold.

A pod of a `dra` class (`policies.classes.backends.dra`) gets its GPUs from a ResourceClaimTemplate
that gpuadm keeps, one per class and what a claim holds, named for it:
`gpuadm-<class>-<count>-<digest>` for `count` whole devices, `gpuadm-<class>-p<portion>-<digest>`
for a share of one device sized at `portion` hundredths of it, where the digest is that of the
template's spec. A pod
names a template under an entry of `spec.resourceClaims` that is gpuadm's too
(`gpuadm-c<index>` for the app container at that index, `gpuadm-i<index>` for an init
container), and its container lists the entry in `resources.claims`. The name alone tells
which class and how many devices a pod holds, whichever policy wrote it; the digest tells
whether the template is the one today's policy writes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from policies.quantity import QuantityError, parse_quantity

TEMPLATE_PREFIX = "gpuadm-"
# The entry names of a pod's `spec.resourceClaims` that are gpuadm's, one per container.
ENTRY_PREFIX = "gpuadm-"
_ENTRY = re.compile(r"^gpuadm-(?P<kind>[ci])(?P<index>0|[1-9][0-9]{0,4})$")
_TEMPLATE = re.compile(
    r"^gpuadm-(?P<class>[a-z0-9-]+)-(?:(?P<count>[1-9][0-9]{0,3})|p(?P<portion>[1-9][0-9]?))"
    r"-(?P<digest>[0-9a-f]{10})$"
)
# What one request of a template is called; the claim's allocation names it.
REQUEST_NAME = "gpu"
# The device classes of NVIDIA's DRA driver: whole GPUs and MIG slices.
NVIDIA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")


# A share of a device is sized in hundredths of it, as its template's name says.
PORTIONS = 100
# The resource with which a pod asks the scheduler itself for devices of a DeviceClass
# (Kubernetes' DRA extended resources, alpha `DRAExtendedResource` in 1.34): this prefix and
# the class's name, unless the DeviceClass names another in `extendedResourceName`.
DEVICE_CLASS_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"


class Held(NamedTuple):
    """What one claim of gpuadm's holds: `devices` whole devices, or, when `portion` is set,
    a share of one device sized at `portion` hundredths of it."""

    devices: int
    portion: int = 0

    @classmethod
    def share(cls, portion: int) -> Held:
        """Return a share of one device, `portion` hundredths of it (1 to 99)."""
        if not 0 < portion < PORTIONS:
            raise ValueError(f"a share is 1 to {PORTIONS - 1} hundredths, not {portion}")
        return cls(1, portion)

    def describe(self) -> str:
        """Say what the claim holds, as a message would."""
        if self.portion:
            return f"{self.portion} hundredths of one device"
        return f"{self.devices} device{'s' if self.devices != 1 else ''}"

    @property
    def label(self) -> str:
        """Return what a template's name says of it: `2`, or `p50`."""
        return f"p{self.portion}" if self.portion else str(self.devices)


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A ResourceClaimTemplate of gpuadm's: its name, what it holds, and its spec."""

    name: str
    class_name: str
    held: Held
    spec: dict[str, Any]

    @classmethod
    def named_for(cls, class_name: str, held: Held, spec: dict[str, Any]) -> ClaimTemplate:
        """Return the template of a class that holds `held`, named for what it holds."""
        digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
        name = f"{TEMPLATE_PREFIX}{class_name}-{held.label}-{digest[:10]}"
        return cls(name, class_name, held, spec)

    @property
    def asks_capacity(self) -> bool:
        """Tell whether a claim of the template asks for part of a device's capacity
        (consumable capacity, which the apiserver keeps only with `DRAConsumableCapacity`)."""
        return any(_capacity_of(request) is not None for request in _requests(self.spec))

    def stored_as_written(self, stored: Mapping[str, Any]) -> bool:
        """Tell whether the apiserver stored the template (`stored`, as it answers) as gpuadm
        writes it, reading each capacity request as the amount it is, however the apiserver
        spells it (`4000` as `4k`)."""
        return _amounts((stored.get("spec") or {}).get("spec")) == _amounts(self.spec)

    def manifest(self, namespace: str, *, labels: Mapping[str, str]) -> dict[str, Any]:
        """Return the template as stored in `namespace`, with gpuadm's `labels`."""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": self.name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"spec": self.spec},
        }


class TemplateName(NamedTuple):
    """What the name of one of gpuadm's templates says: the class and what a claim holds."""

    class_name: str
    held: Held


def parse_template_name(name: str) -> TemplateName | None:
    """Return what a template name says if it is one of gpuadm's, else None."""
    match = _TEMPLATE.match(name)
    if match is None:
        return None
    if match["portion"] is not None:
        return TemplateName(match["class"], Held.share(int(match["portion"])))
    return TemplateName(match["class"], Held(int(match["count"])))


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
    names: list[str] = []
    for request in _requests(spec):
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


def _requests(spec: object) -> Sequence[object]:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return _list(devices.get("requests") if isinstance(devices, Mapping) else None)


def _capacity_of(request: object) -> Mapping[str, Any] | None:
    """Return what a request asks of a device's capacities, if it asks any."""
    exactly = request.get("exactly") if isinstance(request, Mapping) else None
    capacity = exactly.get("capacity") if isinstance(exactly, Mapping) else None
    asked = capacity.get("requests") if isinstance(capacity, Mapping) else None
    return asked if isinstance(asked, Mapping) else None


def _amounts(spec: object) -> object:
    """Return a ResourceClaimSpec with each request's capacity requests read as amounts (one
    that is no quantity stays as written, and so compares unequal)."""
    if not isinstance(spec, Mapping) or not _requests(spec):
        return spec
    read: list[object] = []
    for request in _requests(spec):
        asked = _capacity_of(request)
        if asked is None or not isinstance(request, Mapping):
            read.append(request)
            continue
        try:
            amounts = {name: parse_quantity(value) for name, value in asked.items()}
        except QuantityError:
            read.append(request)
            continue
        exactly: dict[str, Any] = dict(request["exactly"])
        exactly["capacity"] = {**exactly["capacity"], "requests": amounts}
        read.append({**request, "exactly": exactly})
    return {**spec, "devices": {**spec["devices"], "requests": read}}
