"""The guard's rule on allocation annotations: those with which a GPU stack's scheduler tells
its device plugin what to give a pod, which the pod may not bring nor anyone else change; and
the labels and annotations with which KAI's binder records which GPU a share was bound to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.access.guard.violations import Violation, mapping

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


# What KAI's binder writes on a pod it binds (kai-scheduler/KAI-Scheduler v0.17.0,
# pkg/binder/binding/binder.go and binding/resourcereservation/resource_reservation.go): the
# kind of GPU it received, and the GPU group (one shared GPU, held by a reservation pod) a
# share was bound to, as the label `runai-gpu-group`, or `runai-gpu-group/<group>` for each
# GPU of a share of several. KAI's scheduler counts a GPU's sharers by that label, and its
# binder keeps a GPU's reservation pod while some pod carries it.
KAI_ALLOCATION_ANNOTATIONS = ("received-resource-type",)
KAI_GPU_GROUP = "runai-gpu-group"


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
    ] + [Violation("the pod", field, _KAI_BINDER_WRITES) for field in _kai_fields(annotations, {})]


def brought_labels(labels: Mapping[str, Any]) -> list[Violation]:
    """Return a violation for each label of KAI's binder a new pod brings."""
    return [Violation("the pod", field, _KAI_BINDER_WRITES) for field in _kai_fields({}, labels)]


_KAI_BINDER_WRITES = (
    "is written by KAI's binder when it binds a GPU share, to record which GPU the share is "
    "on: KAI counts a GPU's sharers by it; a pod may not bring it: remove it"
)


def _kai_fields(annotations: Mapping[str, Any], labels: Mapping[str, Any]) -> list[str]:
    """Name the binder's annotations and labels among these."""
    fields = [f"annotation {key}" for key in KAI_ALLOCATION_ANNOTATIONS if key in annotations]
    return fields + [f"label {key}" for key in labels if is_gpu_group(key)]


def is_gpu_group(label: object) -> bool:
    """Tell whether a label key is one of KAI's GPU-group labels."""
    return isinstance(label, str) and (
        label == KAI_GPU_GROUP or label.startswith(KAI_GPU_GROUP + "/")
    )


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(pod.get("metadata")).get("annotations"))


_ABSENT = object()


def changed_annotations(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Return the allocation annotations and labels that an update adds, changes or removes,
    each as `annotation <key>` or `label <key>`."""
    before = annotations_of(old)
    after = annotations_of(new)
    changed = [
        f"annotation {key}"
        for key in (*ALLOCATION_ANNOTATIONS, *KAI_ALLOCATION_ANNOTATIONS)
        if before.get(key, _ABSENT) != after.get(key, _ABSENT)
    ]
    old_labels, new_labels = labels_of(old), labels_of(new)
    groups = {key for key in (*old_labels, *new_labels) if is_gpu_group(key)}
    return changed + [
        f"label {key}"
        for key in sorted(groups)
        if old_labels.get(key, _ABSENT) != new_labels.get(key, _ABSENT)
    ]


def labels_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(pod.get("metadata")).get("labels"))
