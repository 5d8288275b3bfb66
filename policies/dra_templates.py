"""gpuadm's ResourceClaimTemplates, and the names that say what they hold.

A pod of a `dra` class (`policies.backends.dra`) gets its GPUs from a ResourceClaimTemplate
that gpuadm keeps, one per class and device count, named for what it holds:
`gpuadm-<class>-<count>-<digest>`, where the digest is that of the template's spec. A pod
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


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A ResourceClaimTemplate of gpuadm's: its name, what it holds, and its spec."""

    name: str
    class_name: str
    count: int
    spec: dict[str, Any]

    @classmethod
    def named_for(cls, class_name: str, count: int, spec: dict[str, Any]) -> ClaimTemplate:
        """Return the template of `count` devices of a class, named for what it holds."""
        digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return cls(f"{TEMPLATE_PREFIX}{class_name}-{count}-{digest[:10]}", class_name, count, spec)

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
