"""The guard's rule on allocation annotations: those with which a GPU stack's scheduler tells
its device plugin what to give a pod, which the pod may not bring nor anyone else change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.guard.violations import Violation, mapping

# The pod annotations with which a stack's scheduler tells its device plugin what to give the
# pod, and which pod is being bound where: the plugin gives the devices (and the memory and
# cores) that `*-to-allocate` names. The stack writes them, never the pod
# (Project-HAMi/HAMi pkg/util/types.go and pkg/device/nvidia/device.go;
# Project-HAMi/volcano-vgpu-device-plugin pkg/util/types.go).
ALLOCATION_ANNOTATIONS = (
    "hami.io/vgpu-devices-to-allocate",
    "hami.io/vgpu-devices-allocated",
    "hami.io/vgpu-mig-allocations",
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/bind-phase",
    "hami.io/bind-time",
    "volcano.sh/devices-to-allocate",
    "volcano.sh/vgpu-ids-new",
    "volcano.sh/vgpu-node",
    "volcano.sh/vgpu-time",
    "volcano.sh/bind-phase",
    "volcano.sh/bind-time",
)


def brought_annotations(annotations: Mapping[str, Any]) -> list[Violation]:
    """Return a violation for each allocation annotation a new pod brings."""
    return [
        Violation(
            "the pod",
            f"annotation {key}",
            "is written by the GPU stack's scheduler to tell its device plugin which GPUs to "
            "give the pod; a pod may not bring it: remove it",
        )
        for key in ALLOCATION_ANNOTATIONS
        if key in annotations
    ]


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(pod.get("metadata")).get("annotations"))


_ABSENT = object()


def changed_annotations(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Return the allocation annotations that an update adds, changes or removes."""
    before = annotations_of(old)
    after = annotations_of(new)
    return [
        key for key in ALLOCATION_ANNOTATIONS if before.get(key, _ABSENT) != after.get(key, _ABSENT)
    ]
