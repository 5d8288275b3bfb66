"""Remember plans: the pods of one ReplicaSet or Job get the same rewrite, computed once.

Keyed by `policies.plan_inputs`, which holds exactly what `plan` reads, so a remembered plan
is the plan. One memo belongs to one config snapshot and goes with it on reload.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from policies import Denial, Plan, Policy, plan, plan_inputs

# Distinct pod shapes remembered. Pods of one ReplicaSet or Job share a shape, so a cluster
# has about as many shapes as it has GPU workloads: thousands at most.
MAX_PLANS = 4096


class PlanMemo:
    """A bounded, least-recently-used memo of plans and denials."""

    def __init__(self, policy: Policy, size: int = MAX_PLANS) -> None:
        self._policy = policy
        self._size = size
        self._plans: OrderedDict[bytes, Plan | Denial] = OrderedDict()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._plans)

    def plan(self, pod: Mapping[str, Any], *, namespace_default_class: str | None) -> Plan:
        """Return `policies.plan` of the pod, or raise its `Denial`."""
        key = plan_inputs(pod, self._policy, namespace_default_class=namespace_default_class)
        found = self._plans.get(key)
        if found is None:
            try:
                found = plan(pod, self._policy, namespace_default_class=namespace_default_class)
            except Denial as denial:
                found = denial
            self._plans[key] = found
            if len(self._plans) > self._size:
                self._plans.popitem(last=False)
        else:
            self.hits += 1
            self._plans.move_to_end(key)
        if isinstance(found, Denial):
            raise Denial(found.message)
        return found
