"""The admission run of `gpuadm review`: every pod of every workload of the input, created one
after the other through /mutate and /validate on one quota ledger, as the apiserver would
send them to gpuadm; and what they add up to per namespace, class and gang.

Each pod set is shown by its first pod, judged as a dry run (the patch, the stored pod, the
claim templates), then counted: as many pods as its controller makes are created, each
meeting the room the ones before it took, the pods left waiting standing in line as the
pod watch would show them. Nothing leaves the process.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

import jsonpatch

from policies import Denial, pod_charge
from policies.pods.dra_templates import ClaimTemplate
from policies.quantity import format_amount
from policies.quota.queue import Gangs
from policies.workloads import Gang, PodSet, pod_gang
from policies.workloads.gangs import GANG_KEY, GANG_SIZE_KEY
from webhook.admission.decision import Decision
from webhook.admission.decisions import Trusted, mutate_under, validate_under
from webhook.claims.lookup import NoClaims
from webhook.claims.templates import LABELS, NoTemplates
from webhook.cli.exits import CommandError
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

if TYPE_CHECKING:
    from policies import Plan

# Pods created in one review at most, over the whole input: about 20 s. A pod set stops
# being created at its first pod that waits or is refused, each later one meeting the same;
# pods of sets that still run when the budget is spent are not judged, and said to be.
MAX_CREATED = 5000

Fate = Literal["runs", "waits", "refused"]


@dataclass
class PodsToJudge:
    """A pod set of the input, with the pod its controller makes and its namespace."""

    pod_set: PodSet
    pod: dict[str, Any]
    namespace: str | None


@dataclass
class _Tally:
    """What became of the pods of a pod set, or of a class or gang over all of them."""

    pods: int = 0
    runs: int = 0
    waits: int = 0
    refused: int = 0
    over_quota: int = 0  # admitted past the limit (warn mode)
    unjudged: int = 0  # not created: the review's budget of pods was spent
    gpus: dict[Fate | Literal["asked"], Fraction] = field(default_factory=dict)

    def add(self, fate: Fate, count: int, charge: Fraction, *, over: bool = False) -> None:
        self.pods += count
        setattr(self, fate, getattr(self, fate) + count)
        self.over_quota += count if over else 0
        for key in (fate, "asked"):
            self.gpus[key] = self.gpus.get(key, Fraction(0)) + charge * count


async def review_all(
    found: Sequence[PodsToJudge], config: ConfigSnapshot, held: Mapping[str, Mapping[str, Fraction]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Judge every pod set of the input in order on one ledger, each namespace holding what
    `held` says; return a result per pod set and the totals per namespace and class, then
    per gang."""
    usage, ledger = _ledger(config, held)
    results = []
    tallies: list[_Tally] = []
    plans: list[Plan | None] = []
    made: dict[str, tuple[_Tally, Fraction]] = {}  # pods in line, by uid: their set's tally
    why: dict[tuple[str, Gang], str] = {}  # gangs waiting in a queue namespace: why
    left = MAX_CREATED
    for index, judged in enumerate(found):
        namespace = str(judged.namespace)
        copies = 1 if judged.pod_set.count is None else judged.pod_set.count
        # A template of no pods is shown as it stands, not after what the input's other
        # workloads took: none of its pods meets that room.
        shown_on = ledger if copies else _ledger(config, held)[1]
        result, plan = await _shown(judged.pod, namespace, config, shown_on)
        charge = plan.charge if plan else Fraction(0)
        # In a queue namespace a gang waits whole and goes whole: each of its pods is made,
        # and the leader's turn decides.
        gang = judged.pod_set.gang
        # In an enforce namespace its first pod is judged for the whole gang. The groups of a
        # LeaderWorkerSet share its name here, and are judged pod by pod.
        mode = config.quotas.terms(namespace).mode
        whole = (
            gang is not None
            and gang.size is not None
            and gang.source != "LeaderWorkerSet"
            and mode in ("queue", "enforce")
        )
        in_line = whole and mode == "queue"
        pod = _as_gang_member(judged.pod, gang) if whole and gang is not None else judged.pod
        tally = _Tally()
        created = 0
        while created < copies and left:
            fate, over = await _created(pod, namespace, config, ledger, usage, index, created)
            tally.add(fate, 1, charge, over=over)
            if fate == "waits":
                made[f"review-{index}-{created}"] = (tally, charge)
            created += 1
            left -= 1
            if fate != "runs" and not (in_line and fate == "waits"):
                # Each later pod of the set meets no more room than this one did: it is
                # refused, or waits behind it, alike.
                tally.add(fate, copies - created, charge)
                created = copies
        tally.unjudged = copies - created
        if config.quotas.terms(namespace).mode == "queue":
            said = await _turn(namespace, config, ledger, usage, found[: index + 1], made)
            why.update({(namespace, g): reason for g, reason in said.items()})
        tallies.append(tally)
        plans.append(plan)
        results.append(result)
    classes: dict[tuple[str, str], _Tally] = {}
    gangs: dict[tuple[str, Gang], _Tally] = {}
    for judged, tally, plan, result in zip(found, tallies, plans, results, strict=True):
        namespace = str(judged.namespace)
        if plan is not None and plan.class_name is not None:
            _merge(classes.setdefault((namespace, plan.class_name), _Tally()), tally)
        if judged.pod_set.gang is not None:
            _merge(gangs.setdefault((namespace, judged.pod_set.gang), _Tally()), tally)
        result["workload"] = _workload(judged.pod_set, tally)
    totals = [
        _class_total(namespace, class_name, tally, config, held.get(namespace, {}))
        for (namespace, class_name), tally in classes.items()
    ]
    totals += [
        _gang_total(
            namespace, gang, tally, config.quotas.terms(namespace).mode, why.get((namespace, gang))
        )
        for (namespace, gang), tally in gangs.items()
    ]
    return results, totals


def _as_gang_member(pod: dict[str, Any], gang: Gang) -> dict[str, Any]:
    """The pod as its controller makes it, in its gang: a pod of a Job, say, names its Job
    as its owner; a review has no owner to name, so it names the gang as gpuadm's form does,
    with the size the input gives it."""
    if pod_gang(pod.get("metadata") or {}) is not None:
        return pod
    member = copy.deepcopy(pod)
    annotations = member.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.update({GANG_KEY: gang.name, GANG_SIZE_KEY: str(gang.size)})
    return member


async def _turn(
    namespace: str,
    config: ConfigSnapshot,
    ledger: QuotaLedger,
    usage: UsageIndex,
    found: Sequence[PodsToJudge],
    made: dict[str, tuple[_Tally, Fraction]],
) -> dict[Gang, str]:
    """Take the leader's turn over the namespace's line, with the gangs' sizes the input
    gives: the pods it releases run, and leave the line. Return why each gang of the input
    that still waits does."""
    sizes: dict[str, int] = {}
    keys: dict[str, Gang] = {}
    for judged in found:
        gang = judged.pod_set.gang
        if gang is not None and gang.size is not None and str(judged.namespace) == namespace:
            key = pod_gang(_as_gang_member(judged.pod, gang).get("metadata") or {})
            if key is not None:
                sizes[key.key] = gang.size
                keys[key.key] = gang
    strict = config.quotas.terms(namespace).queueing == "strict"
    gangs = Gangs(sizes, usage.gang_running(namespace), strict)
    while True:
        released, turn = await ledger.line.release(namespace, config.quotas, gangs=gangs)
        for pod in released:
            usage.forget(pod.uid)
            tally, charge = made.pop(pod.uid)
            tally.waits -= 1
            tally.runs += 1
            tally.gpus["waits"] = tally.gpus.get("waits", Fraction(0)) - charge
            tally.gpus["runs"] = tally.gpus.get("runs", Fraction(0)) + charge
        if not released or not turn.more:
            break
    place = ledger.line.placer(
        namespace,
        config.quotas.limits_for(namespace),
        gangs=gangs,
        cohort=config.quotas.cohort_of(namespace),
    )
    said: dict[Gang, str] = {}
    for line_key, pods in usage.line(namespace).gangs().items():
        if line_key in keys and (where := place(pods[0])) is not None:
            said[keys[line_key]] = where.reason
    return said


async def _shown(
    pod: dict[str, Any], namespace: str, config: ConfigSnapshot, ledger: QuotaLedger
) -> tuple[dict[str, Any], Plan | None]:
    """Run the pod through /mutate then /validate as a dry run: what the first pod of its set
    would meet, and what gpuadm writes into it."""
    # A dry run makes nothing, so the claim templates are shown instead.
    mutated = await mutate_under(
        _request(pod, namespace, dry_run=True), config, templates=NoTemplates(), quota=ledger
    )
    result: dict[str, Any] = {
        "namespace": namespace,
        "allowed": mutated.outcome != "denied",
        "reason": mutated.reason,
        "warnings": list(mutated.warnings),
        "patch": mutated.patch,
        "pod": pod,
    }
    if not result["allowed"]:
        return result, None
    stored = jsonpatch.apply_patch(pod, mutated.patch) if mutated.patch else pod
    validated = await validate_under(
        _request(stored, namespace, dry_run=True),
        config,
        quota=ledger,
        claims=NoClaims(),
        trusted=Trusted(),
    )
    templates = mutated.plan.claim_templates if mutated.plan else ()
    result.update(
        allowed=validated.outcome != "denied",
        reason=validated.reason,
        warnings=list(dict.fromkeys([*mutated.warnings, *validated.warnings])),
        pod=stored,
        demand=mutated.plan.demand if mutated.plan else None,
        claimTemplates=[t.manifest(namespace, labels=LABELS) for t in templates],
    )
    return result, mutated.plan


class _Unmade:
    """Claim templates in a review: never made, since nothing leaves the process."""

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        """Make nothing: the first pod's review shows the templates instead."""


async def _created(
    pod: dict[str, Any],
    namespace: str,
    config: ConfigSnapshot,
    ledger: QuotaLedger,
    usage: UsageIndex,
    pod_set: int,
    number: int,
) -> tuple[Fate, bool]:
    """Create one pod of a set: return whether it runs, waits in line or is refused, and
    whether it was admitted past its limit (warn mode)."""
    name = f"review-{pod_set}-{number}"
    created = copy.deepcopy(pod)
    created["metadata"].update(name=name, uid=name)
    mutated = await mutate_under(
        _request(created, namespace, dry_run=False), config, templates=_Unmade(), quota=ledger
    )
    if mutated.outcome == "denied":
        return "refused", False
    stored = jsonpatch.apply_patch(created, mutated.patch) if mutated.patch else created
    validated: Decision = await validate_under(
        _request(stored, namespace, dry_run=False),
        config,
        quota=ledger,
        claims=NoClaims(),
        trusted=Trusted(),
    )
    if validated.outcome == "denied":
        return "refused", False
    if validated.outcome == "queued":
        # In line, as the pod watch would show the gated pod to every replica.
        usage.observe(stored, config.policy, config.quotas, now=0.0)
        return "waits", False
    return "runs", validated.quota is not None and validated.quota.would_deny


def _workload(pod_set: PodSet, tally: _Tally) -> dict[str, Any]:
    """What became of a pod set's pods, with a sentence that says it."""
    per_node = pod_set.count is None
    if per_node:
        summary = "one pod per node, each judged as this one"
    elif tally.pods == 0 and tally.unjudged:
        summary = "none judged"
    elif tally.pods == 0:
        summary = "no pods: nothing to judge but the template"
    elif tally.runs == tally.pods:
        summary = "the pod runs" if tally.pods == 1 else f"all {tally.pods} pods run"
    else:
        parts = []
        if tally.waits:
            parts.append(f"{tally.waits} wait{'s' if tally.waits == 1 else ''} in line for room")
        if tally.refused:
            parts.append(f"{tally.refused} would be refused")
        summary = f"{tally.runs} of {tally.pods} pods run; " + " and ".join(parts)
    if tally.over_quota:
        summary += f" ({tally.over_quota} past the limit: warn mode admits them)"
    if tally.unjudged:
        more = " more" if tally.pods else ""
        summary += (
            f"; {tally.unjudged}{more} not judged: a review creates {MAX_CREATED} pods at most"
        )
    gang = pod_set.gang
    return {
        "pods": None if per_node else tally.pods + tally.unjudged,
        "notJudged": tally.unjudged,
        "runs": tally.runs,
        "waiting": tally.waits,
        "refused": tally.refused,
        "overQuota": tally.over_quota,
        "gang": None
        if gang is None
        else {"form": gang.source, "name": gang.name, "size": gang.size},
        "summary": summary,
    }


def _class_total(
    namespace: str,
    class_name: str,
    tally: _Tally,
    config: ConfigSnapshot,
    held: Mapping[str, Fraction],
) -> dict[str, Any]:
    """The GPUs of a class the input asks for in a namespace, against its limit and use."""
    limit = config.quotas.terms(namespace).limits.get(class_name)
    gpus = tally.gpus
    words = [f"{tally.runs} run"] if tally.runs else []
    words += [f"{tally.waits} wait{'s' if tally.waits == 1 else ''}"] if tally.waits else []
    words += [f"{tally.refused} refused"] if tally.refused else []
    words += [f"{tally.unjudged} more not judged"] if tally.unjudged else []
    in_use = held.get(class_name, Fraction(0))
    room = (
        "no limit" if limit is None else f"in use {format_amount(in_use)} of {format_amount(limit)}"
    )
    pods = f"{tally.pods} pod{'s' if tally.pods != 1 else ''}"
    return {
        "namespace": namespace,
        "class": class_name,
        "asked": format_amount(gpus.get("asked", Fraction(0))),
        "inUse": format_amount(in_use),
        "limit": None if limit is None else format_amount(limit),
        "pods": tally.pods,
        "runs": tally.runs,
        "waiting": tally.waits,
        "refused": tally.refused,
        "summary": f"namespace {namespace}, {class_name}: {pods} ask for "
        f"{format_amount(gpus.get('asked', Fraction(0)))} ({room}): "
        + ", ".join(words or ["none"]),
    }


def _gang_total(
    namespace: str, gang: Gang, tally: _Tally, mode: str, waits_because: str | None
) -> dict[str, Any]:
    """What becomes of a gang's pods: all of them, or only some, which then hold their GPUs
    without the others (never in a queue namespace, where a gang goes whole)."""
    size = gang.size
    if size is None:
        said = (
            f"its size is unknown: its PodGroup is not in the input ({tally.pods} of its pods are)"
        )
    elif gang.source == "LeaderWorkerSet" and tally.pods > size:
        # Several groups of one name (a LeaderWorkerSet's): each needs all of its own.
        said = (
            f"in groups of {size}, each of which needs all its pods: "
            f"{tally.runs} of {tally.pods} run"
        )
    elif tally.runs >= size:
        said = f"runs whole: {tally.runs} of its pods run, of {size} it needs"
    elif tally.runs == 0 and mode == "queue" and tally.waits:
        said = f"waits whole, and its {size} pods go together once they fit: " + (
            waits_because or "they wait in line"
        )
    elif tally.runs == 0 and tally.refused:
        said = (
            f"none of its pods run ({size} needed): its first pod is refused unless the whole "
            "gang fits, so nothing is held"
        )
    elif tally.runs == 0:
        said = f"none of its pods run ({size} needed): nothing is held while it waits"
    else:
        said = (
            f"only {tally.runs} of the {size} pods it needs would run: they hold their GPUs "
            "while the rest wait or are refused"
        )
    return {
        "namespace": namespace,
        "gang": {"form": gang.source, "name": gang.name, "size": size},
        "pods": tally.pods,
        "runs": tally.runs,
        "waiting": tally.waits,
        "refused": tally.refused,
        "summary": f"namespace {namespace}, {gang.describe()}: {said}",
    }


def _ledger(
    config: ConfigSnapshot, held: Mapping[str, Mapping[str, Fraction]]
) -> tuple[UsageIndex, QuotaLedger]:
    """Return a fresh ledger on which each namespace holds what `held` says."""
    usage = UsageIndex()
    for namespace, holding in held.items():
        _hold(usage, namespace, holding, config)
    return usage, QuotaLedger(usage, MemoryStore(), pods_visible=False)


def _merge(total: _Tally, tally: _Tally) -> None:
    total.pods += tally.pods
    total.unjudged += tally.unjudged
    total.runs += tally.runs
    total.waits += tally.waits
    total.refused += tally.refused
    total.over_quota += tally.over_quota
    for key, gpus in tally.gpus.items():
        total.gpus[key] = total.gpus.get(key, Fraction(0)) + gpus


def _hold(
    usage: UsageIndex, namespace: str, classes: Mapping[str, Fraction], config: ConfigSnapshot
) -> None:
    """Let the namespace hold what it already holds, as running pods the usage index sees:
    whole GPUs in one, a share of one in another."""
    for class_name, gpus in classes.items():
        for index, part in enumerate((Fraction(int(gpus)), gpus - int(gpus))):
            if part:
                holder = _holder(namespace, class_name, part, config.policy.domain, index)
                try:
                    pod_charge(holder, config.policy, namespace_default_class=None)
                except Denial as denial:
                    raise CommandError(
                        f"--in-use {class_name}={format_amount(gpus)}: no pod can hold that: "
                        f"{denial.message}"
                    ) from None
                usage.observe(holder, config.policy, config.quotas, now=0.0)


def _holder(
    namespace: str, class_name: str, gpus: Fraction, domain: str, index: int
) -> dict[str, Any]:
    """A running pod that holds `gpus` GPUs of a class, as the usage index would see it."""
    name = f"in-use-{class_name}-{index}"
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": name},
        "spec": {
            "nodeName": "node",
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {f"{domain}/{class_name}": format_amount(gpus)}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def _request(pod: dict[str, Any], namespace: str, *, dry_run: bool) -> AdmissionRequest:
    return AdmissionRequest(
        uid=str(uuid.uuid4()),
        operation="CREATE",
        namespace=namespace,
        name="",  # the pod's own name, if any, is read from the object as the apiserver's is
        object=pod,
        old_object=None,
        dry_run=dry_run,
        user="gpuadm-review",
        groups=(),
    )
