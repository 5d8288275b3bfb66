"""What one pod holds, as the pod watch shows it: its charge, or its place in a line.

Pure, so that a re-list can compute the states of many pods off the event loop; the index of
what every namespace holds (`webhook.quota.usage`) is built from these.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from policies import Denial, Policy, QuotaConfig, pod_charge
from policies.access.demand import TERMINAL_PHASES
from policies.quota.borrowing import BORROWED
from policies.quota.queue import Waiting, is_gated, waiting_pod
from policies.workloads import GangError, pod_gang

log = logging.getLogger("gpuadm.usage")


@dataclass(frozen=True, slots=True)
class Holding:
    """One pod's charge."""

    namespace: str
    class_name: str
    charge: Fraction
    # The pod's name, for the reports that say who holds what.
    pod: str = ""
    # The gang it is a member of (`Gang.key`), "" for none: a gang's running pods count
    # toward its size when its other pods wait in line.
    gang: str = ""
    # What a cohort's reclaim orders its pods by (`policies.quota.cohorts.Held`): priority,
    # creation (seconds since the epoch), and whether it is being deleted.
    priority: int = 0
    created: float = 0.0
    ending: bool = False
    uid: str = ""
    # The `gpuadm.io/borrowed` label it carries, as the watch last showed it.
    marked: bool = False


def pod_state(
    pod: Mapping[str, Any], policy: Policy, quotas: QuotaConfig
) -> Holding | Waiting | None:
    """Return what a pod holds, or its place in line if gpuadm's gate holds it; or None.

    A pod held by the gate holds nothing, and leaves the line when it is deleted (it gets a
    deletion timestamp first). Pure, so a re-list can compute states off the event loop.
    """
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    metadata = pod.get("metadata") or {}
    gated = is_gated(pod, policy.quota_gate)
    if gated and metadata.get("deletionTimestamp"):
        return None
    namespace = str(metadata.get("namespace") or "")
    try:
        charged = pod_charge(
            pod, policy, namespace_default_class=quotas.default_class_for(namespace)
        )
    except Denial as denial:
        # A pod stored before gpuadm (or under an older policy) that today's rules refuse
        # still runs; it is reported, since it cannot be attributed to a class.
        log.warning("pod %s/%s is not charged: %s", namespace, metadata.get("name"), denial.message)
        return None
    if charged is None:
        return None
    class_name, charge = charged
    if gated:
        return waiting_pod(pod, sys.intern(class_name), charge)
    # Interned: 100,000 pods share a few hundred namespace and class strings.
    priority = (pod.get("spec") or {}).get("priority")
    labels = metadata.get("labels")
    return Holding(
        sys.intern(namespace),
        sys.intern(class_name),
        charge,
        str(metadata.get("name")),
        gang_of(metadata),
        priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        created_at(metadata),
        bool(metadata.get("deletionTimestamp")),
        str(metadata.get("uid") or ""),
        isinstance(labels, Mapping) and labels.get(BORROWED) == "true",
    )


def created_at(metadata: Mapping[str, Any]) -> float:
    """Return when a pod was created, in seconds since the epoch (0 if it does not say)."""
    stamp = metadata.get("creationTimestamp")
    if not isinstance(stamp, str):
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def gang_of(metadata: Mapping[str, Any]) -> str:
    """Return the key of the gang a running pod is in, "" for none (or one it names badly:
    it holds its GPUs all the same)."""
    try:
        gang = pod_gang(metadata)
    except GangError:
        return ""
    return sys.intern(gang.key) if gang is not None else ""
