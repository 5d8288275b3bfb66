"""Queue mode: GPU pods that wait behind gpuadm's scheduling gate, and the order they go in.

In a namespace whose quota mode is `queue`, a GPU pod that does not fit is created with the
scheduling gate `<domain>/quota`: the scheduler leaves it alone (`SchedulingGated`) and it
holds nothing. It is released, charged and ungated, when room frees up or a limit grows.

The line of a namespace is ordered by pod priority (higher first), then by creation time,
then by name. A pod that does not fit holds back the pods behind it that need the same full
limit, so a large pod is not starved by small ones; pods that need other limits go past it.
A pod asking for more than a whole limit never fits and holds back no one.

A gang (policies/workloads/gangs.py) is one unit of the line, at the place of its first pod
waiting: its pods go together once the gang is whole (as many of its pods waiting, charged
or running as its size) and the demand of all its waiting pods fits at once; until then none
of them goes. A whole gang that does not fit holds back the pods behind it under the limits
it exceeded, as a pod does, so small work cannot starve it. A gang not yet whole holds back
no one under `besteffort` (it cannot run yet, so passing it cannot delay it), and everyone
behind it under its limits under `strict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from policies.pods.pod_view import PodView
from policies.quantity import format_amount
from policies.quota.judge import QuotaVerdict, judge, never_fits
from policies.quota.quotas import ALL_CLASSES, limits_on
from policies.workloads import GangError, pod_gang


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
    # The gang it is a member of (`Gang.key`), "" for none; and the gang's size where the
    # pod itself carries it (Kueue's and gpuadm's forms), else None.
    gang: str = ""
    gang_size: int | None = None

    def order(self) -> tuple[int, str, str]:
        """Sort key: higher priority first, then first come, then by name."""
        return (-self.priority, self.created, self.name)


def waiting_pod(pod: Mapping[str, Any], class_name: str, charge: Fraction) -> Waiting:
    """Describe a gated pod as a place in its namespace's line."""
    metadata = pod.get("metadata") or {}
    priority = (pod.get("spec") or {}).get("priority")
    try:
        gang = pod_gang(metadata)
    except GangError:  # refused at admission in a queue namespace: a pod from before waits alone
        gang = None
    return Waiting(
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        class_name=class_name,
        charge=charge,
        priority=priority if isinstance(priority, int) else 0,
        created=str(metadata.get("creationTimestamp") or ""),
        gang=gang.key if gang is not None else "",
        gang_size=gang.size if gang is not None else None,
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

    def missing_members(self) -> bool:
        """Tell whether the pod waits for its gang to be whole (or sized), not for room."""
        return bool(self.pod.gang) and self.reason.startswith(f"the {gang_name(self.pod.gang)} ")

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
    gangs: Gangs | None = None,
) -> LineOutcome:
    """Decide which pods of a namespace's line go now, in order, given what it holds.

    Each released pod is counted before the next is judged, so the released pods fit
    together. A pod that does not fit blocks the limits it exceeded for every pod behind it.
    A gang is judged whole at the place of its first pod (`decide_gang`); `gangs` says what
    is known of the line's gangs (None: nothing, as at admission).

    This visits and sorts the whole line: it is the reference that `policies.quota.line.Line`, the
    index the ledger and the leader use, is tested against.
    """
    used = dict(in_use)
    blocked: dict[str, str] = {}  # a full limit -> why the pods behind wait
    released: list[Waiting] = []
    waiting: list[Place] = []
    waiting_by_class: dict[str, int] = {}
    ordered = in_line_order(line)
    members: dict[str, list[Waiting]] = {}
    for pod in ordered:
        if pod.gang:
            members.setdefault(pod.gang, []).append(pod)
    decided: dict[str, tuple[bool, str, int]] = {}  # gang -> (released, why it waits, ahead)
    for pod in ordered:
        keys = limits_on(pod.class_name, limits)
        ahead = len(waiting) if ALL_CLASSES in limits else waiting_by_class.get(pod.class_name, 0)
        if pod.gang:
            if pod.gang not in decided:
                gang = members[pod.gang]
                went = decide_gang(namespace, pod.gang, gang, 0, used, limits, blocked, {}, gangs)
                if went is None:
                    released.extend(gang)
                decided[pod.gang] = (went is None, went or "", ahead)
            went_whole, reason, ahead = decided[pod.gang]
            if went_whole:
                continue
            waiting.append(Place(pod, ahead, reason))
            waiting_by_class[pod.class_name] = waiting_by_class.get(pod.class_name, 0) + 1
            continue
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


@dataclass(frozen=True, slots=True)
class Gangs:
    """What is known of a namespace's gangs beyond its line: each gang's size (from its
    owner's spec, its PodGroup, or what its pods carry), why a size is not known, how many
    of its pods hold their GPUs already, and the namespace's order (`strict`)."""

    sizes: Mapping[str, int]
    running: Mapping[str, int]
    strict: bool = False
    # Why a gang's size cannot be known (its PodGroup is missing, its pods disagree).
    unknown: Mapping[str, str] = field(default_factory=dict)


def gang_name(key: str) -> str:
    """Name a gang in a message by its key (`form/name`), as `Gang.describe` does."""
    source, _, name = key.partition("/")
    return f"gang {name!r} ({source})"


def decide_gang(
    namespace: str,
    key: str,
    members: Sequence[Waiting],
    charged: int,
    used: dict[str, Fraction],
    limits: Mapping[str, Fraction],
    blocked: dict[str, str],
    held: Mapping[str, str],
    gangs: Gangs | None,
) -> str | None:
    """Judge a gang of the line whole, at the place of its first pod: None if its waiting
    `members` all go now (each charged to `used`), else why they all wait.

    `charged`: pods of the gang in line that are charged already (counted as there). A gang
    is whole once its pods waiting, charged and running (`gangs.running`) are as many as its
    size. Without `gangs` (at admission) nothing is known of its size, and it is taken as
    a head that waits: it holds back those behind it, and the leader, which knows, decides.
    A whole gang that does not fit marks the limits it exceeds in `blocked`, as a pod does.
    """
    classes = {pod.class_name for pod in members}
    if spent := next((held[c] for c in sorted(classes) if c in held), None):
        return spent
    keys = sorted({k for c in classes for k in limits_on(c, limits)})
    demand = _demand(members, keys)
    # As for a pod, never fitting comes before waiting behind others: so where the walk
    # meets a gang that can never fit does not matter.
    for limit_key in keys:
        if demand[limit_key] > limits[limit_key]:
            return (
                f'namespace "{namespace}": {_label(limit_key)} quota: the {gang_name(key)} '
                f"needs {format_amount(demand[limit_key])} at once for its {len(members)} "
                f"waiting pods, more than the whole limit of {format_amount(limits[limit_key])}, "
                "so it could never run; it waits until the limit grows"
            )
    if stuck := next((blocked[k] for k in keys if k in blocked), None):
        return stuck
    missing = _not_whole(key, len(members) + charged, gangs)
    if missing is not None:
        if gangs is None or gangs.strict:
            for limit_key in keys:
                blocked[limit_key] = (
                    f'namespace "{namespace}": {_label(limit_key)} quota is held for the '
                    f"{gang_name(key)} ahead, which {missing}"
                )
        return missing if gangs is None else f"the {gang_name(key)} {missing}"
    trial = dict(used)
    for pod in members:
        verdict = judge(
            namespace=namespace,
            class_name=pod.class_name,
            requested=pod.charge,
            in_use=trial,
            limits=limits,
        )
        if not verdict.allowed:
            for limit_key in verdict.exceeded:
                blocked[limit_key] = held_for_ahead(namespace, limit_key, used, limits)
            limit_key = verdict.exceeded[0]
            return (
                f'namespace "{namespace}": {_label(limit_key)} quota has no room for the '
                f"{gang_name(key)}: its {len(members)} waiting pods need "
                f"{format_amount(demand[limit_key])} at once, in use "
                f"{format_amount(_held(used, limit_key))} of {format_amount(limits[limit_key])}"
            )
        trial[pod.class_name] = trial.get(pod.class_name, Fraction(0)) + pod.charge
    used.update(trial)
    return None


def _not_whole(key: str, here: int, gangs: Gangs | None) -> str | None:
    """Say why a gang is not whole yet (None: it is), with `here` of its pods in line."""
    if gangs is None:
        return "is a gang: its pods go together, once all of them are there and fit"
    if key in gangs.unknown:
        return f"waits: {gangs.unknown[key]}"
    size = gangs.sizes.get(key)
    if size is None:
        return "waits: its size is not known yet"
    present = here + gangs.running.get(key, 0)
    if present >= size:
        return None
    return f"is not whole: {present} of its {size} pods exist, it waits for {size - present} more"


def _demand(members: Sequence[Waiting], keys: Sequence[str]) -> dict[str, Fraction]:
    demand = dict.fromkeys(keys, Fraction(0))
    for pod in members:
        for limit_key in (pod.class_name, ALL_CLASSES):
            if limit_key in demand:
                demand[limit_key] += pod.charge
    return demand


def _held(used: Mapping[str, Fraction], key: str) -> Fraction:
    return used.get(key, Fraction(0)) if key != ALL_CLASSES else sum(used.values(), Fraction(0))


def _label(key: str) -> str:
    return key if key != ALL_CLASSES else f'all classes ("{ALL_CLASSES}")'


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
    return (
        f'namespace "{namespace}": {_label(key)} quota is held for the pods ahead (in use '
        f"{format_amount(_held(used, key))} of {format_amount(limits[key])})"
    )
