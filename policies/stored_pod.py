"""Judge a pod as it will be stored: the validating side of admission, quota aside."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.access.rewrite import Plan
from policies.classes.models import DEVICE_CHOICE_ANNOTATIONS, PLACEMENT_ANNOTATIONS
from policies.errors import Denial
from policies.pods.pod_shape import check_metadata
from policies.pods.pod_view import PodView, view_pod
from policies.policy import REQUEST_ANNOTATIONS, Policy
from policies.quota.queue import is_gated


def require_fixed_point(result: Plan) -> Plan:
    """Return the plan of a stored pod if it changes nothing, else raise the retry `Denial`.

    A stored GPU pod must be a fixed point of the rewrite: no class keys left, backend
    resources, scheduler, affinity and annotations exactly as gpuadm writes them. A pod that
    is not was never seen by the mutating webhook (it failed open, e.g. while unreachable),
    so it is refused with a message to retry rather than let through to the wrong scheduler.
    """
    if result.patch:
        fields = ", ".join(sorted({op["path"] for op in result.patch}))
        raise Denial(
            "this GPU pod was not processed by gpuadm's mutating webhook, which may have been "
            f"unavailable ({fields} not as gpuadm writes them); retry the request"
        )
    return result


def check_update(old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy) -> None:
    """Refuse an update that adds, changes or removes gpuadm's labels or annotations, or
    removes gpuadm's scheduling gate.

    gpuadm's annotations are those of its domain, those with which a pod chooses its devices
    (`nvidia.com/use-gputype`, ...), those a stack reads a share from (KAI's `gpu-fraction`,
    ...) and HAMi's GPU policy (`hami.io/gpu-scheduler-policy`): changed on a pending pod, the
    second would send it to another GPU model than its class's, the third give it another
    share than it is charged for, the fourth scatter its shares over GPUs its class packs.
    """
    check_metadata(new)
    check_metadata(old, whose="the old pod's ")
    # Read past the shape check: labels and annotations are objects of strings.
    old_view, new_view = view_pod(old), view_pod(new)
    changed = []
    for field in ("labels", "annotations"):
        before = _owned(old_view, field, policy)
        after = _owned(new_view, field, policy)
        changed += [
            f"{field[:-1]} {key}"
            for key in sorted(before.keys() | after.keys())
            if before.get(key) != after.get(key)
        ]
    if changed:
        raise Denial(
            f"{', '.join(changed)} may be set by gpuadm only; they record the pod's GPU class "
            "and demand and choose its GPUs, and cannot change after creation"
        )
    gate = policy.quota_gate
    if is_gated(old_view, gate) and not is_gated(new_view, gate):
        raise Denial(
            f"the scheduling gate {gate} may be removed by gpuadm only: it holds the pod in "
            "line until its namespace's GPU quota has room, and is removed when the pod is "
            "charged"
        )


def _owned(pod: PodView, field: str, policy: Policy) -> dict[str, str]:
    values = pod.labels if field == "labels" else pod.annotations
    device_choice = (
        (*DEVICE_CHOICE_ANNOTATIONS, *PLACEMENT_ANNOTATIONS, *REQUEST_ANNOTATIONS)
        if field == "annotations"
        else ()
    )
    return {
        key: value for key, value in values.items() if policy.in_domain(key) or key in device_choice
    }
