"""A policy checked against the cluster's own GPU nodes, as their stacks label and register
them: GPU Feature Discovery's labels (`nvidia.com/gpu.product`, `nvidia.com/gpu.memory`,
`nvidia.com/gpu.count`), HAMi's registration (`hami.io/node-nvidia-register`: each GPU's type
and MiB), and the MIG profiles the device plugin advertises (`nvidia.com/mig-<profile>`).

It says which classes reach no node, which GPU nodes no class reaches, where a class's memory
is above what its nodes report, and which MIG profiles no node of a class offers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from policies.classes.backends.device_plugins import MigClass
from policies.classes.class_base import ClassBase
from policies.classes.memory_checks import MiB, halves_overflow, sized_in_shares
from policies.classes.models import gfd_product
from policies.policy import Policy
from policies.quantity import format_memory

PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
HAMI_REGISTER = "hami.io/node-nvidia-register"
MIG_RESOURCE = "nvidia.com/mig-"
# GFD appends this to the product of a time-sliced GPU left under `nvidia.com/gpu`.
SHARED_SUFFIX = "-SHARED"
# A registration larger than this is not HAMi's: it is not read (a node of 16 GPUs writes
# about 3 KiB).
MAX_REGISTRATION = 256 * 1024
# The resources of one node read at most (a node has a few dozen).
MAX_RESOURCES = 256
# The nodes a finding names at most; the rest are counted.
MOST_NAMED = 3


@dataclass(frozen=True, slots=True)
class GpuNode:
    """What a node's GPU stacks say of it: the product GFD labels (without `-SHARED`), the
    MiB of one GPU (the least GFD or HAMi reports), how many GPUs, and the MIG profiles it
    advertises."""

    name: str
    labels: Mapping[str, str]
    product: str | None
    memory_mib: int | None
    gpus: int
    mig_profiles: frozenset[str] = field(default_factory=frozenset)
    # The extended resources it advertises (a `/` in the name, a count above 0): a stack
    # that labels nothing (gpu-manager, gpushare, qGPU...) is known by them.
    resources: frozenset[str] = field(default_factory=frozenset)

    @property
    def labelled(self) -> bool:
        """Tell whether a GPU stack labels or registers the node's GPUs."""
        return self.product is not None or self.memory_mib is not None or bool(self.mig_profiles)

    @property
    def model(self) -> str:
        """Name the node's GPU as the findings do: its product label, or HAMi's type."""
        return self.product or "(no nvidia.com/gpu.product label)"


def gpu_node(node: Mapping[str, Any]) -> GpuNode | None:
    """Read a Node object's GPUs; None for a node no GPU stack labels or registers."""
    metadata = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    annotations = metadata.get("annotations") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    product = labels.get(PRODUCT_LABEL)
    if product is not None and product.endswith(SHARED_SUFFIX):
        product = product.removesuffix(SHARED_SUFFIX)
    memories = [m for m in (_whole(labels.get(MEMORY_LABEL)),) if m is not None]
    registered = _hami_devices(annotations.get(HAMI_REGISTER))
    memories += [m for m in (_whole(d.get("devmem")) for d in registered) if m is not None]
    profiles = frozenset(
        name.removeprefix(MIG_RESOURCE)
        for name, count in allocatable.items()
        if name.startswith(MIG_RESOURCE) and str(count) not in ("0", "")
    )
    resources = frozenset(
        name
        for name, count in list(allocatable.items())[:MAX_RESOURCES]
        if "/" in name and str(count) not in ("0", "")
    )
    if product is None and not registered and not resources:
        return None
    gpus = _whole(labels.get(COUNT_LABEL)) or len(registered)
    return GpuNode(
        str(metadata.get("name") or ""),
        labels,
        product,
        min(memories) if memories else None,
        gpus,
        profiles,
        resources,
    )


def _whole(value: object) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None


def _hami_devices(value: object) -> list[Mapping[str, Any]]:
    """Return the devices of HAMi's registration (a JSON list, since HAMi v2.8); [] for
    anything else."""
    if not isinstance(value, str) or len(value) > MAX_REGISTRATION:
        return []
    try:
        devices = json.loads(value)
    except (ValueError, RecursionError):  # nested past the decoder's depth: not HAMi's
        return []
    if not isinstance(devices, list):
        return []
    return [d for d in devices if isinstance(d, dict)]


def reaches(gpu_class: ClassBase, node: GpuNode) -> bool:
    """Tell whether a class's pods may land on a node: its models (by GFD's product label,
    which gpuadm writes node affinity on) and its nodeSelector allow it, and, where the
    class asks for extended resources, the node advertises one of them."""
    for key, values in gpu_class.node_selector.items():
        if node.labels.get(key) not in values:
            return False
    products = {gfd_product(model) for model in gpu_class.models or ()}
    if gpu_class.models is not None and node.product not in products:
        return False
    wanted = gpu_class.resource_names()
    return (
        not wanted
        or not node.resources.isdisjoint(wanted)
        or any(gpu_class.owns(resource) for resource in node.resources)
    )


@dataclass(frozen=True, slots=True)
class ClusterFit:
    """What the nodes say of a policy: per class, the nodes it reaches; per GPU model, its
    nodes and the classes that reach them; and the findings."""

    by_class: dict[str, list[str]]
    by_model: dict[str, dict[str, Any]]
    findings: list[str]


def cluster_fit(policy: Policy, nodes: Iterable[GpuNode]) -> ClusterFit:
    """Check a policy's classes against the GPU nodes: those a GPU stack labels or
    registers, and those that advertise a resource of one of the policy's classes."""
    classes = policy.classes.values()
    nodes = sorted(
        (
            node
            for node in nodes
            if node.labelled or any(c.owns(r) for c in classes for r in node.resources)
        ),
        key=lambda n: n.name,
    )
    by_class: dict[str, list[str]] = {}
    findings: list[str] = []
    reached: set[str] = set()
    for name, gpu_class in sorted(policy.classes.items()):
        mine = [node for node in nodes if reaches(gpu_class, node)]
        by_class[name] = [node.name for node in mine]
        reached.update(by_class[name])
        findings += _class_findings(name, gpu_class, mine)
    by_model: dict[str, dict[str, Any]] = {}
    for node in nodes:
        entry = by_model.setdefault(
            node.model, {"nodes": [], "gpus": 0, "memoryMiB": None, "classes": []}
        )
        entry["nodes"].append(node.name)
        entry["gpus"] += node.gpus
        if node.memory_mib is not None:
            known = entry["memoryMiB"]
            entry["memoryMiB"] = node.memory_mib if known is None else min(known, node.memory_mib)
    for model, entry in by_model.items():
        entry["classes"] = sorted(
            c for c, names in by_class.items() if set(names) & set(entry["nodes"])
        )
        if not entry["classes"]:
            findings.append(
                f"{_count(entry['nodes'])} of {model} ({_named(entry['nodes'])}): no class "
                "reaches them, so their GPUs serve no pod gpuadm rewrites"
            )
    return ClusterFit(by_class, by_model, findings)


def _class_findings(name: str, gpu_class: ClassBase, mine: list[GpuNode]) -> list[str]:
    findings = []
    if not mine:
        return [f"class {name}: no node has its GPUs ({_wanted(gpu_class)}): its pods never run"]
    for model in gpu_class.models or ():
        product = gfd_product(model)
        if not any(node.product == product for node in mine):
            findings.append(f"class {name}: no node has {model} ({PRODUCT_LABEL}={product})")
    sized = [node for node in mine if node.memory_mib is not None]
    if sized_in_shares(gpu_class) and gpu_class.memory is not None and sized:
        least = min(sized, key=lambda node: node.memory_mib or 0)
        assert least.memory_mib is not None
        if halves_overflow(gpu_class.memory, least.memory_mib):
            findings.append(
                f"class {name}: memory {format_memory(gpu_class.memory)} is more than its "
                f"nodes report ({format_memory(Fraction(least.memory_mib * MiB))} per GPU on "
                f"{least.name}, {least.model}): two halves never share one of those GPUs"
            )
    if isinstance(gpu_class, MigClass):
        offered = set().union(*(node.mig_profiles for node in mine))
        missing = [p for p in gpu_class.profiles if p not in offered]
        if missing:
            findings.append(
                f"class {name}: no node of the class offers MIG profile"
                f"{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                f"(they offer: {', '.join(sorted(offered)) or 'none'})"
            )
    return findings


def _wanted(gpu_class: ClassBase) -> str:
    parts = []
    if gpu_class.models:
        parts.append(f"{PRODUCT_LABEL} in {', '.join(gfd_product(m) for m in gpu_class.models)}")
    parts += [f"{key} in {', '.join(values)}" for key, values in gpu_class.node_selector.items()]
    return "; ".join(parts) or "any GPU node"


def _count(names: list[str]) -> str:
    return f"{len(names)} node{'s' if len(names) != 1 else ''}"


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:MOST_NAMED])
    return shown + (f" and {len(names) - MOST_NAMED} more" if len(names) > MOST_NAMED else "")
