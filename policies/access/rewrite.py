"""Plan the rewrite of a pod into what its class's backend understands, as a JSON patch.

`plan` is pure and idempotent: applied to its own output it plans nothing. Every value it
writes goes into requests and limits together, because the apiserver validates the pod only
after all mutation (extended resources must then be integers with requests == limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import orjson

from policies.access.demand import (
    ContainerDemand,
    ContainerRef,
    PodDemand,
    effective_demand,
    read_demand,
)
from policies.classes.asks import Grant
from policies.classes.class_base import ClassBase, rounding_warning
from policies.classes.models import DEVICE_CHOICE_ANNOTATIONS, PLACEMENT_ANNOTATIONS
from policies.errors import Denial
from policies.pods.dra_templates import ClaimTemplate, Held, entry_name, is_entry_name
from policies.pods.pod_shape import REQUIRED, check_metadata, check_pod, shown
from policies.pods.pod_view import PodView, view_pod
from policies.policy import REQUEST_ANNOTATIONS, Policy
from policies.quantity import format_amount, parse_quantity

Patch = list[dict[str, Any]]
DEFAULT_SCHEDULER = "default-scheduler"


def compact_json(value: object) -> bytes:
    """Return `value` as JSON in bytes that hold no more memory than their length.

    orjson's output of under a few KiB sits in a 4 KiB allocation however short it is, so a
    plan memo of small entries, which keeps one key and one patch each, held three times
    what it counted. A copy is exactly as long as its text.
    """
    return memoryview(orjson.dumps(value)).tobytes()


@dataclass(frozen=True, slots=True)
class Plan:
    """What gpuadm does to a pod: the patch, the warnings, and what the pod costs."""

    class_name: str | None
    charge: Fraction
    patch: Patch
    warnings: tuple[str, ...]
    # The normalized demand, e.g. `a100=0.5`, or None for a pod without GPUs.
    demand: str | None = None
    # The ResourceClaimTemplates the pod names, which must exist in its namespace (`dra`).
    claim_templates: tuple[ClaimTemplate, ...] = ()
    # The annotations the class's stack reads the pod's share from (KAI's `gpu-fraction`), as
    # gpuadm writes them; what the stack's own webhook adds for that share follows from them.
    requests: tuple[tuple[str, str], ...] = ()
    # The patch as JSON, encoded once: the pods of a ReplicaSet share a remembered plan, and
    # each answer carries this same text.
    patch_json: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_json", compact_json(self.patch))


NO_GPU = Plan(None, Fraction(0), [], ())


def plan(
    pod: Mapping[str, Any],
    policy: Policy,
    *,
    namespace: str | None = None,
    namespace_default_class: str | None = None,
    view: PodView | None = None,
) -> Plan:
    """Plan the rewrite of a pod; raise `Denial` when the pod asks for something invalid.

    `namespace` is the pod's, for a class that treats some namespaces differently (a KAI
    class's queues), None for what the class does everywhere. `view` is the pod's view when
    the caller has made it already (a review makes one, which the guard reads too); it is read
    only after the pod passed the shape check.
    """
    check_pod(pod)
    if view is None:
        view = view_pod(pod)
    demand = read_demand(view, policy, namespace_default_class=namespace_default_class)
    if demand is None:
        return NO_GPU
    resources_of = {(c.kind, c.position): c.resources for c in view.containers}
    warnings: list[str] = []
    charges = []
    patch: Patch = []
    templates: dict[str, ClaimTemplate] = {}
    requests: dict[str, str] = {}
    for container in demand.containers:
        grant = _grant(container, demand)
        charges.append((container.ref, grant.charge))
        warnings.extend(grant.warnings)
        if grant.annotations:
            requests.update(grant.annotations)
            requests.update(demand.gpu_class.request_container_annotations(container.ref.name))
        entry = None
        if grant.claim is not None:
            entry = entry_name(container.ref.kind, container.ref.index)
            templates[entry] = _claim_template(demand, grant.claim)
        resources = resources_of[container.ref.kind, container.ref.index]
        rewritten = _rewrite_resources(resources, container, grant, entry)
        if rewritten != resources:
            patch.append(_add(f"{container.ref.path}/resources", rewritten))
    charge = _pod_charge(demand, charges)
    _check_scheduler(view, demand, namespace)
    warnings += _check_device_choice(view, policy, demand.class_name)
    metadata, notes = _metadata_ops(view, policy, demand, charge, namespace, requests)
    patch += metadata
    warnings += notes
    patch += _spec_ops(view, demand.gpu_class, namespace)
    patch += _claim_ops(view, templates)
    demand_text = f"{demand.class_name}={format_amount(charge)}"
    return Plan(
        demand.class_name,
        charge,
        patch,
        tuple(dict.fromkeys(warnings)),
        demand_text,
        # One per name: containers that ask for the same count share a template.
        tuple({t.name: t for t in templates.values()}.values()),
        tuple(requests.items()),
    )


def memo_key(
    pod: Mapping[str, Any],
    policy: Policy,
    *,
    namespace: str | None = None,
    namespace_default_class: str | None = None,
) -> bytes:
    """Return, canonically encoded, every part of a pod that `plan` reads, and nothing else,
    checking only its metadata.

    Two pods with the same key get the same plan (or the same denial), so a caller may
    remember plans by it (keys are not sorted: equal pods written in another key order only
    miss the memo): the pods of one ReplicaSet or Job differ only in what `plan` does not
    read (names, uids, most labels and annotations, images, env).

    The namespace is in the key only where a class treats it differently from the rest.
    The key holds, as they are, the spec fields `check_pod` reads beyond the metadata, so two
    pods of one key pass or fail that check alike: a memo keyed by this, which plans (and so
    checks) each new key, need not check a pod it has seen the like of. A pod's metadata is
    not all in the key, so it is checked here, every time.
    """
    check_metadata(pod)
    spec = pod.get("spec")
    if spec is not None and type(spec) is not dict:
        check_pod(pod)  # raises its Denial
    if namespace not in policy.namespaces_of_their_own:
        namespace = None
    try:
        return _inputs(pod, spec or {}, policy, namespace, namespace_default_class)
    except TypeError:
        # A value JSON cannot hold (from YAML) or nested beyond the encoder's limit: the
        # shape check names it if it is one of gpuadm's fields.
        check_pod(pod)
        raise


def _inputs(
    pod: Mapping[str, Any],
    spec: Mapping[str, Any],
    policy: Policy,
    namespace: str | None,
    namespace_default_class: str | None,
) -> bytes:
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    prefix = policy.domain + "/"
    owned = {key: value for key, value in annotations.items() if key.startswith(prefix)}
    return compact_json(
        (
            [_resources_of(spec.get("initContainers")), _resources_of(spec.get("containers"))],
            spec.get("schedulerName"),
            spec.get("nodeName"),
            spec.get("affinity"),
            spec.get("tolerations"),
            spec.get("resourceClaims"),
            bool(annotations),
            owned,
            [annotations.get(key) for key in DEVICE_CHOICE_ANNOTATIONS + PLACEMENT_ANNOTATIONS],
            [annotations.get(key) for key in REQUEST_ANNOTATIONS],
            bool(labels),
            labels.get(prefix + "class"),
            [labels.get(key) for key in policy.class_label_keys],
            namespace,
            namespace_default_class,
        )
    )


def _resources_of(containers: Any) -> Any:
    """What `plan` and the shape check read of a list of containers; any value that is not
    a list of objects stays as it is, so that the key tells it apart."""
    if type(containers) is not list:
        return containers
    return [
        (c.get("name"), c.get("restartPolicy"), c.get("resources")) if type(c) is dict else c
        for c in containers
    ]


def pod_charge(
    pod: Mapping[str, Any], policy: Policy, *, namespace_default_class: str | None = None
) -> tuple[str, Fraction] | None:
    """Return (class, GPUs) a pod holds by its resources, or None; raise `Denial` if invalid."""
    check_pod(pod)
    demand = read_demand(view_pod(pod), policy, namespace_default_class=namespace_default_class)
    if demand is None:
        return None
    charges = [(c.ref, _charge(c, demand)) for c in demand.containers]
    return demand.class_name, _pod_charge(demand, charges)


def _charge(container: ContainerDemand, demand: PodDemand) -> Fraction:
    """Return a stored container's charge. What a claim of gpuadm's holds is charged from
    its template's name, even where today's policy would not give it (a class that shares
    no longer)."""
    if container.claimed is not None:
        return demand.gpu_class.held_charge(container.claimed.held)
    return _grant(container, demand).charge


def _pod_charge(demand: PodDemand, charges: list[tuple[ContainerRef, Fraction]]) -> Fraction:
    if demand.gpu_class.holds_for_pod_lifetime:
        return Fraction(sum(charge for _, charge in charges))
    return effective_demand(charges)


def _claim_template(demand: PodDemand, held: Held) -> ClaimTemplate:
    template = demand.gpu_class.claim_template(demand.class_name, held)
    assert template is not None  # only a class that claims its devices grants them
    return template


def _grant(container: ContainerDemand, demand: PodDemand) -> Grant:
    gpu_class = demand.gpu_class
    try:
        if container.ask is None:
            return Grant(_integers(container.raw), gpu_class.charge(container.raw))
        grant = gpu_class.grant(container.ask)
    except Denial as denial:
        raise Denial(f"{container.ref} {denial.message} (class {demand.class_name})") from None
    note = rounding_warning(gpu_class, demand.class_name, container.ask, grant)
    if note is not None:
        grant = replace(grant, warnings=(*grant.warnings, f"{container.ref}: {note}"))
    return grant


def _integers(raw: Mapping[str, Fraction]) -> dict[str, int]:
    return {name: int(amount) for name, amount in raw.items()}


def _rewrite_resources(
    resources: Mapping[str, Any], container: ContainerDemand, grant: Grant, entry: str | None
) -> dict[str, Any]:
    """Return the container's resources with the class keys replaced by the backend's.

    For a `dra` class, the backend's part is the container's claim `entry`, in place of any
    other claim of gpuadm's it lists.
    """
    rewritten = dict(resources)
    for side in ("limits", "requests"):
        values = dict(rewritten.get(side) or {})
        for key in container.replaced_keys:
            values.pop(key, None)
        for name, amount in grant.resources.items():
            current = values.get(name)
            if current is None or _amount_or_none(current) != amount:
                values[name] = str(amount)
        if values:
            rewritten[side] = values
        else:
            rewritten.pop(side, None)  # a dra class's key was all there was
    if entry is not None:
        claims = [
            c for c in rewritten.get("claims") or () if not is_entry_name(c.get("name") or "")
        ]
        rewritten["claims"] = [*claims, {"name": entry}]
    return rewritten


def _claim_ops(pod: PodView, templates: Mapping[str, ClaimTemplate]) -> Patch:
    """Name each container's template under its entry of `spec.resourceClaims`.

    The pod's own entries stay, in their order; gpuadm's follow, in container order.
    """
    current = list(pod.resource_claims)
    wanted = [c for c in current if not is_entry_name(c.get("name") or "")] + [
        {"name": entry, "resourceClaimTemplateName": template.name}
        for entry, template in templates.items()
    ]
    return [_add("/spec/resourceClaims", wanted)] if wanted != current else []


def _amount_or_none(value: object) -> Fraction | None:
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _check_scheduler(pod: PodView, demand: PodDemand, namespace: str | None) -> None:
    wanted = demand.gpu_class.scheduler_in(namespace)
    if wanted is None:
        return
    named = pod.scheduler_name
    if named not in (None, "", DEFAULT_SCHEDULER, wanted):
        raise Denial(
            f"class {demand.class_name} is scheduled by {wanted!r}, but the pod names "
            f"schedulerName {shown(named)}; remove schedulerName or set it to {wanted!r}"
        )
    if pod.node_name:
        raise Denial(
            f"class {demand.class_name} is placed by the scheduler {wanted!r}, but the pod sets "
            f"nodeName {shown(pod.node_name)}, which bypasses it; remove nodeName"
        )


def _check_device_choice(pod: PodView, policy: Policy, class_name: str) -> list[str]:
    """Check the annotations with which a pod would choose its own devices; return notes.

    They are gpuadm's to write: one the class writes is replaced by the class's value, and a
    note tells the user so; one it does not write is refused, since it would steer the stack
    around the class. A placement annotation (HAMi's GPU policy) only orders the class's GPUs:
    the class's value replaces the pod's, and where the class writes none the pod's stands.
    """
    brought = pod.annotations
    written = {
        **policy.backend_annotations(class_name),
        **policy.classes[class_name].placement_annotations(),
    }
    notes = []
    for key in DEVICE_CHOICE_ANNOTATIONS + PLACEMENT_ANNOTATIONS:
        placement = key in PLACEMENT_ANNOTATIONS
        if key not in brought or (placement and key not in written):
            continue
        if key not in written:
            raise Denial(
                f"annotation {key} chooses the devices the GPU stack may give the pod, and only "
                f"gpuadm writes it; class {class_name} does not set it: remove it, the class "
                "chooses the GPU model"
            )
        if brought[key] != written[key]:
            why = (
                "the class chooses how its GPUs are shared"
                if placement
                else "only gpuadm writes it"
            )
            notes.append(
                f"annotation {key}: {shown(brought[key])} replaced by {written[key]!r}, the value "
                f"of class {class_name}; {why}"
            )
    return notes


def _metadata_ops(
    pod: PodView,
    policy: Policy,
    demand: PodDemand,
    charge: Fraction,
    namespace: str | None,
    requests: Mapping[str, str],
) -> tuple[Patch, list[str]]:
    """Return the ops that write gpuadm's labels and annotations, and the class's, and the
    notes that say which of the pod's own values the class's replaced.

    `requests` are the annotations with which the class's stack reads the pod's share (KAI's
    `gpu-fraction`); one the pod carries that the plan does not write goes, since the stack
    would read it as a second request (a share that became a whole GPU).
    """
    gpu_class = demand.gpu_class
    annotations = {
        policy.class_annotation: demand.class_name,
        policy.demand_annotation: f"{demand.class_name}={format_amount(charge)}",
        **policy.backend_annotations(demand.class_name),
        **gpu_class.placement_annotations(),
        **requests,
    }
    class_labels = gpu_class.pod_labels(namespace)
    labels = {policy.class_annotation: demand.class_name, **class_labels}
    notes = [
        f"label {key}: {shown(pod.labels[key])} replaced by {value!r}, the value class "
        f"{demand.class_name} gives it"
        for key, value in class_labels.items()
        if key in pod.labels and pod.labels[key] != value
    ]
    stale = [
        {"op": "remove", "path": f"/metadata/annotations/{_escape(key)}"}
        for key in gpu_class.request_annotations
        if key in pod.annotations and key not in annotations
    ]
    ops = _map_ops("/metadata/annotations", pod.annotations, annotations) + stale
    return ops + _map_ops("/metadata/labels", pod.labels, labels), notes


def _map_ops(path: str, current: Mapping[str, str] | None, wanted: Mapping[str, str]) -> Patch:
    if not current:
        return [_add(path, dict(wanted))]
    return [
        _add(f"{path}/{_escape(key)}", value)
        for key, value in wanted.items()
        if current.get(key) != value
    ]


def _spec_ops(pod: PodView, gpu_class: ClassBase, namespace: str | None) -> Patch:
    patch: Patch = []
    scheduler = gpu_class.scheduler_in(namespace)
    if scheduler is not None and pod.scheduler_name != scheduler:
        patch.append(_add("/spec/schedulerName", scheduler))
    if gpu_class.node_expressions:
        affinity = _with_node_affinity(pod.affinity, gpu_class.node_expressions)
        if affinity != pod.affinity:
            patch.append(_add("/spec/affinity", affinity))
    current = list(pod.tolerations)
    missing = [t for t in gpu_class.toleration_fields if t not in current]
    if missing:
        patch.append(_add("/spec/tolerations", current + missing))
    return patch


def _with_node_affinity(
    affinity: Mapping[str, Any], expressions: list[dict[str, Any]]
) -> dict[str, Any]:
    """Return the affinity with the class's expressions ANDed into every selector term.

    Terms are ORed, so adding a term of our own would widen the pod's placement; the class's
    requirement must sit inside each term instead. A pod without terms gets one, holding
    the class's requirement alone.
    """
    # Copied along the path that changes only: the pod given to `plan` is never modified.
    updated = dict(affinity)
    node_affinity = updated["nodeAffinity"] = dict(updated.get("nodeAffinity") or {})
    required = node_affinity[REQUIRED] = dict(node_affinity.get(REQUIRED) or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": list(expressions)}]
    else:
        required["nodeSelectorTerms"] = [
            term if _matches_nothing(term) else _and_into(term, expressions) for term in terms
        ]
    return updated


def _and_into(term: Mapping[str, Any], expressions: list[dict[str, Any]]) -> dict[str, Any]:
    existing = list(term.get("matchExpressions") or [])
    return {**term, "matchExpressions": existing + [e for e in expressions if e not in existing]}


def _matches_nothing(term: Mapping[str, Any]) -> bool:
    """Tell whether a node selector term is empty, which matches no node.

    It must stay so: with the class's requirements ANDed in, it would match the class's
    nodes, and the pod would be placed where its own terms never allowed.
    """
    return not term.get("matchExpressions") and not term.get("matchFields")


def _add(path: str, value: Any) -> dict[str, Any]:
    # `add` replaces a member that exists and creates one that does not, so the same op is
    # right whether or not the user wrote the field.
    return {"op": "add", "path": path, "value": value}


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
