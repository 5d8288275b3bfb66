"""What each namespace holds, from the pods the watch has seen: an index kept up to date.

Only GPU pods are kept, each as one small entry, and the sum per (namespace, class) is
updated as pods come and go, so a quota judgement costs the same with 10 pods or 100,000.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from policies import Denial, Policy, QuotaConfig, pod_charge
from policies.demand import TERMINAL_PHASES

log = logging.getLogger("gpuadm.usage")


@dataclass(frozen=True, slots=True)
class Holding:
    """One pod's charge."""

    namespace: str
    class_name: str
    charge: Fraction


class UsageIndex:
    """GPU pods by uid, with running sums per namespace and class."""

    def __init__(self) -> None:
        self._pods: dict[str, Holding] = {}
        self._sums: dict[str, dict[str, Fraction]] = {}
        self._seen_at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def namespaces(self) -> list[str]:
        """Return the namespaces that hold GPU pods."""
        return list(self._sums)

    def in_use(self, namespace: str) -> Mapping[str, Fraction]:
        """Return the GPUs each class holds in a namespace."""
        return self._sums.get(namespace, {})

    def seen(self, uid: str) -> bool:
        """Tell whether the watch has shown this pod lately, even if it is gone since."""
        return uid in self._seen_at

    def forget_seen_before(self, moment: float) -> None:
        """Forget sightings older than `moment`: their reservations have expired anyway."""
        self._seen_at = {uid: at for uid, at in self._seen_at.items() if at >= moment}

    def observe(
        self, pod: Mapping[str, Any], policy: Policy, quotas: QuotaConfig, *, now: float
    ) -> None:
        """Record a pod as it now is: charged if it holds GPUs, dropped if it no longer does."""
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid")
        if not uid:
            return
        self._seen_at.setdefault(uid, now)
        holding = holding_of(pod, policy, quotas)
        if holding is None:
            self.forget(uid)
            return
        previous = self._pods.get(uid)
        if previous == holding:
            return
        if previous is not None:
            self._add(previous, -previous.charge)
        self._pods[uid] = holding
        self._add(holding, holding.charge)

    def forget(self, uid: str) -> None:
        """Drop a pod that was deleted or finished."""
        previous = self._pods.pop(uid, None)
        if previous is not None:
            self._add(previous, -previous.charge)

    def replace_all(self, holdings: Mapping[str, Holding], *, now: float) -> None:
        """Put a full re-list in force at once, so no judgement sees a half-filled index."""
        sums: dict[str, dict[str, Fraction]] = {}
        for holding in holdings.values():
            classes = sums.setdefault(holding.namespace, {})
            classes[holding.class_name] = classes.get(holding.class_name, Fraction(0)) + (
                holding.charge
            )
        self._pods = dict(holdings)
        self._sums = sums
        for uid in holdings:
            self._seen_at.setdefault(uid, now)

    def _add(self, holding: Holding, amount: Fraction) -> None:
        classes = self._sums.setdefault(holding.namespace, {})
        total = classes.get(holding.class_name, Fraction(0)) + amount
        if total:
            classes[holding.class_name] = total
        else:
            classes.pop(holding.class_name, None)
            if not classes:
                del self._sums[holding.namespace]


def holding_of(pod: Mapping[str, Any], policy: Policy, quotas: QuotaConfig) -> Holding | None:
    """Return what a pod holds, charged from its resources alone, or None.

    Pure, so a re-list can compute holdings off the event loop.
    """
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return None
    metadata = pod.get("metadata") or {}
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
    # Interned: 100,000 pods share a few hundred namespace and class strings.
    return Holding(sys.intern(namespace), sys.intern(class_name), charge)
