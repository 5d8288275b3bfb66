"""Queue mode: GPU pods that wait behind gpuadm's scheduling gate, and the order they go in.

In a namespace whose quota mode is `queue`, a GPU pod that does not fit is created with the
scheduling gate `<domain>/quota`: the scheduler leaves it alone (`SchedulingGated`) and it
holds nothing. It is released, charged and ungated, when room frees up or a limit grows.

The line of a namespace is ordered by pod priority (higher first), then by creation time,
then by name. A pod that does not fit holds back the pods behind it that need the same full
limit, so a large pod is not starved by small ones; pods that need other limits go past it.
A pod asking for more than a whole limit never fits and holds back no one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from policies.pods.pod_view import PodView
from policies.quantity import format_amount
from policies.quota.judge import QuotaVerdict, judge, never_fits
from policies.quota.quotas import ALL_CLASSES, limits_on


def _spec(pod: Mapping[str, Any] | PodView) -> Mapping[str, Any]:
    if isinstance(pod, PodView):
        return pod.spec
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _gates(pod: Mapping[str, Any] | PodView) -> Sequence[Any]:
    """The pod's scheduling gates as its view reads them (a list, or an empty tuple)."""
    if isinstance(pod, PodView):
        return pod.scheduling_gates
    gates = _spec(pod).get("schedulingGates")
    return gates if isinstance(gates, list) else ()


def is_gated(pod: Mapping[str, Any] | PodView, gate: str) -> bool:
    """Tell whether the pod carries the gate (and so is held in line, or will be)."""
    return any(isinstance(g, Mapping) and g.get("name") == gate for g in _gates(pod))


def may_gate(pod: Mapping[str, Any] | PodView) -> bool:
    """Tell whether a pod can wait behind a gate: the apiserver refuses a scheduling gate on a
    pod created already bound to a node (`spec.nodeName`), which is judged as in enforce mode."""
    return not _spec(pod).get("nodeName")


def add_gate(pod: Mapping[str, Any] | PodView, gate: str) -> dict[str, Any]:
    """Return the JSON patch operation that gives a pod being created the gate."""
    if isinstance(_gates(pod), list):  # a list, even empty: the gate goes at its end
        return {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}
    return {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}


def remove_gate(pod: Mapping[str, Any] | PodView, gate: str) -> list[dict[str, Any]]:
    """Return the JSON patch that removes the gate, or [] if the pod does not carry it.

    The patch tests the gate's position first, so it fails (and changes nothing) if the pod
    changed since it was read, rather than removing another gate.
    """
    for index, found in enumerate(_gates(pod)):
        if isinstance(found, Mapping) and found.get("name") == gate:
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": f"{path}/name", "value": gate},
                {"op": "remove", "path": path},
            ]
    return []


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod in line: what it asks for, and what places it in the line."""

    uid: str
    namespace: str
    name: str
    class_name: str
    charge: Fraction
    priority: int
    # RFC 3339 in UTC, as the apiserver writes it, so that text order is time order.
    created: str

    def order(self) -> tuple[int, str, str]:
        """Sort key: higher priority first, then first come, then by name."""
        return (-self.priority, self.created, self.name)


def waiting_pod(pod: Mapping[str, Any], class_name: str, charge: Fraction) -> Waiting:
    """Describe a gated pod as a place in its namespace's line."""
    metadata = pod.get("metadata") or {}
    priority = (pod.get("spec") or {}).get("priority")
    return Waiting(
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        class_name=class_name,
        charge=charge,
        priority=priority if isinstance(priority, int) else 0,
        created=str(metadata.get("creationTimestamp") or ""),
    )


def in_line_order(line: Iterable[Waiting]) -> list[Waiting]:
    """Return the pods in the order they are released (the reference order: the index of a
    namespace's line, policies/quota/line.py, keeps its pods in this order as they come and go)."""
    return sorted(line, key=Waiting.order)


@dataclass(frozen=True, slots=True)
class Place:
    """A pod that stays in line: how many wait ahead of it for the same limits, and why."""

    pod: Waiting
    ahead: int
    reason: str

    def message(self) -> str:
        """Say what the pod waits for, as its Event does."""
        ahead = f"{self.ahead} pod{'' if self.ahead == 1 else 's'} ahead of it in line"
        return f"waiting for GPU quota: {self.reason}; {ahead}"


@dataclass(frozen=True, slots=True)
class LineOutcome:
    """What one pass over a namespace's line decides."""

    released: tuple[Waiting, ...]
    waiting: tuple[Place, ...]


def next_releases(
    namespace: str,
    line: Sequence[Waiting],
    in_use: Mapping[str, Fraction],
    limits: Mapping[str, Fraction],
) -> LineOutcome:
    """Decide which pods of a namespace's line go now, in order, given what it holds.

    Each released pod is counted before the next is judged, so the released pods fit
    together. A pod that does not fit blocks the limits it exceeded for every pod behind it.

    This visits and sorts the whole line: it is the reference that `policies.quota.line.Line`, the
    index the ledger and the leader use, is tested against.
    """
    used = dict(in_use)
    blocked: dict[str, str] = {}  # a full limit -> why the pods behind wait
    released: list[Waiting] = []
    waiting: list[Place] = []
    waiting_by_class: dict[str, int] = {}
    for pod in in_line_order(line):
        keys = limits_on(pod.class_name, limits)
        ahead = len(waiting) if ALL_CLASSES in limits else waiting_by_class.get(pod.class_name, 0)
        never = never_fits(
            namespace=namespace, class_name=pod.class_name, requested=pod.charge, limits=limits
        )
        stuck = next((blocked[k] for k in keys if k in blocked), None)
        if never is not None:
            reason = f"{never}; it waits until the limit grows"
        elif stuck is not None:
            reason = stuck
        else:
            verdict = take_if_fits(namespace, pod, used, limits, blocked)
            if verdict.allowed:
                released.append(pod)
                continue
            reason = verdict.message or "quota exceeded"
        waiting.append(Place(pod, ahead, reason))
        waiting_by_class[pod.class_name] = waiting_by_class.get(pod.class_name, 0) + 1
    return LineOutcome(tuple(released), tuple(waiting))


def take_if_fits(
    namespace: str,
    pod: Waiting,
    used: dict[str, Fraction],
    limits: Mapping[str, Fraction],
    blocked: dict[str, str],
) -> QuotaVerdict:
    """Judge a pod in line against what the pods ahead already use: one that fits is charged
    to `used`; one that does not marks each limit it exceeds in `blocked` as held for the
    pods ahead, so that those behind it under that limit wait too."""
    verdict = judge(
        namespace=namespace,
        class_name=pod.class_name,
        requested=pod.charge,
        in_use=used,
        limits=limits,
    )
    if verdict.allowed:
        used[pod.class_name] = used.get(pod.class_name, Fraction(0)) + pod.charge
    else:
        for key in verdict.exceeded:
            blocked[key] = held_for_ahead(namespace, key, used, limits)
    return verdict


def held_for_ahead(
    namespace: str, key: str, used: Mapping[str, Fraction], limits: Mapping[str, Fraction]
) -> str:
    """Say why a pod waits behind one that does not fit under the same limit `key`."""
    held = used.get(key, Fraction(0)) if key != ALL_CLASSES else sum(used.values(), Fraction(0))
    label = key if key != ALL_CLASSES else f'all classes ("{ALL_CLASSES}")'
    return (
        f'namespace "{namespace}": {label} quota is held for the pods ahead (in use '
        f"{format_amount(held)} of {format_amount(limits[key])})"
    )
