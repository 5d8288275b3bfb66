"""Read a pod's GPU demand: which class, and what each container asks of it.

The four request forms of the contract are recognised here: a class resource (whole or share),
a class memory amount, untyped raw backend resources, in init containers and sidecars too.
Nothing is rewritten here; `rewrite.plan` does that from the `PodDemand` this returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, NamedTuple

from policies.classes.asks import Ask, MemoryShare, Share, Whole
from policies.classes.class_base import ClassBase
from policies.errors import Denial
from policies.pods.dra_templates import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    PORTIONS,
    Held,
    entry_name,
    is_entry_name,
    parse_template_name,
)
from policies.pods.pod_shape import clipped, shown
from policies.pods.pod_view import ContainerView, PodView
from policies.policy import REQUEST_ANNOTATIONS, STANDARD_GPU, ClassKey, Policy, ResourceRole
from policies.quantity import QuantityError, format_amount, parse_quantity

ContainerKind = Literal["initContainers", "containers"]
# A pod in one of these phases has ended: it holds no GPU, and no claim of its counts.
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """Where a container sits in the pod spec."""

    kind: ContainerKind
    index: int
    name: str
    sidecar: bool

    @property
    def path(self) -> str:
        """Return the JSON pointer of the container."""
        return f"/spec/{self.kind}/{self.index}"

    def __str__(self) -> str:
        if self.kind == "containers":
            return f'container "{clipped(self.name)}"'
        return f'{"sidecar" if self.sidecar else "init container"} "{clipped(self.name)}"'


class ClaimedDevices(NamedTuple):
    """What a container's claim of gpuadm's holds, as its template's name says."""

    class_name: str
    held: Held
    template: str
    entry: str

    @property
    def ask(self) -> Ask:
        """Return the ask that the claim answers: whole devices, or a share of one."""
        if self.held.portion:
            return Share(Fraction(self.held.portion, PORTIONS))
        return Whole(self.held.devices)


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """What one container asks: a class ask, or raw resources of the class's backend.

    `replaced_keys` are the keys the rewrite removes before it writes the backend's resources.
    """

    ref: ContainerRef
    ask: Ask | None
    raw: dict[str, Fraction] = field(default_factory=dict)
    replaced_keys: frozenset[str] = frozenset()
    # Set when the ask was read from a claim of gpuadm's the container already lists.
    claimed: ClaimedDevices | None = None


@dataclass(frozen=True, slots=True)
class PodDemand:
    """The pod's GPU class and every container that asks for part of it."""

    class_name: str
    gpu_class: ClassBase
    containers: tuple[ContainerDemand, ...]


class ClassValue(NamedTuple):
    """A container's value for one class key, as written and as an exact amount."""

    key: str
    class_key: ClassKey
    amount: Fraction
    written: object


@dataclass(slots=True)
class _Found:
    """What a container holds before the pod's class is known."""

    ref: ContainerRef
    class_values: dict[str, ClassValue] = field(default_factory=dict)
    raw: dict[str, Fraction] = field(default_factory=dict)
    # Devices of a `dra` class the container holds through gpuadm's claim entry.
    claimed: ClaimedDevices | None = None


def container_ref(container: ContainerView) -> ContainerRef:
    """Return where an init container, sidecar or app container sits, and its name."""
    kind: ContainerKind = "containers" if container.kind == "containers" else "initContainers"
    name = str(container.name) if container.named else str(container.position)
    return ContainerRef(kind, container.position, name, container.sidecar)


def read_demand(
    pod: PodView, policy: Policy, *, namespace_default_class: str | None = None
) -> PodDemand | None:
    """Return the demand of a pod that passed `check_pod`, None if it asks for no GPU, or
    raise `Denial`."""
    templates = _gpuadm_entries(pod.resource_claims, policy)
    found = [item for item in (_scan(c, policy, templates) for c in pod.containers) if item]
    listed = {item.claimed.entry for item in found if item.claimed is not None}
    for entry in templates.keys() - listed:
        # The scheduler allocates every claim of the pod, listed by a container or not.
        raise Denial(
            f"spec.resourceClaims {entry!r} names ResourceClaimTemplate {templates[entry]} of "
            f"gpuadm's, which no container lists; ask for {policy.domain}/<class> in the "
            "container instead"
        )
    annotations = pod.annotations
    requested = [key for key in REQUEST_ANNOTATIONS if key in annotations] if annotations else []
    if not found and not requested:
        return None
    if not policy.classes:
        # A policy with no classes (the Helm chart's default) has nothing to turn a GPU
        # stack's own request into and nothing to charge it to: such a pod is not gpuadm's,
        # and goes on as written. Keys under the domain were refused by `_scan` already.
        return None
    class_name = _pod_class(annotations, found, policy, namespace_default_class, requested)
    gpu_class = policy.classes[class_name]
    containers = [_container_demand(item, class_name, gpu_class, policy) for item in found]
    if requested:
        containers = _with_request(pod, requested, class_name, gpu_class, policy, containers)
    gpu_class.check_containers(class_name, [(str(c.ref), c.ask) for c in containers])
    return PodDemand(class_name, gpu_class, tuple(containers))


def _with_request(
    pod: PodView,
    requested: list[str],
    class_name: str,
    gpu_class: ClassBase,
    policy: Policy,
    containers: list[ContainerDemand],
) -> list[ContainerDemand]:
    """Add to `containers` the request the pod makes through its annotations (KAI's
    `gpu-fraction`), for the container it names; return them all in pod order."""
    unread = [key for key in requested if key not in gpu_class.request_annotations]
    if unread:
        raise Denial(
            f"annotation {unread[0]} asks a GPU stack for part of a GPU, but class {class_name} "
            f"(backend {gpu_class.backend_name()}) does not read it; remove it, and ask for "
            f"{policy.domain}/{class_name} in the container instead"
        )
    ask, container = gpu_class.read_request(pod)
    ref = container_ref(container)
    if not isinstance(ask, Whole) and not gpu_class.shareable:
        raise Denial(
            f"{ref}: class {class_name} gives whole GPUs only (shareable: false), "
            f"but annotation {requested[0]} asks for {ask.describe()}"
        )
    for other in containers:
        if other.ref.kind == ref.kind and other.ref.index == ref.index:
            raise Denial(
                f"{ref} asks for GPUs through annotation {requested[0]} and through its "
                f"resources too; ask through {policy.domain}/{class_name} alone"
            )
    added = [*containers, ContainerDemand(ref, ask)]
    # A pod view holds init containers first, each list in order; so must the demand.
    return sorted(added, key=lambda c: (c.ref.kind == "containers", c.ref.index))


def _gpuadm_entries(claims: Sequence[Any], policy: Policy) -> dict[str, str]:
    """Return the pod's `spec.resourceClaims` entries that are gpuadm's: name to template.

    An entry is gpuadm's by its name (`gpuadm-c0`, ...) or by its template's: either without
    the other is refused, since a pod would hold a class's devices that no container asks
    for, or a claim of its own under gpuadm's name.
    """
    entries: dict[str, str] = {}
    for entry in claims:
        name = entry.get("name") or ""
        template = entry.get("resourceClaimTemplateName")
        ours = isinstance(template, str) and parse_template_name(template) is not None
        if is_entry_name(name) and ours:
            entries[name] = template
        elif is_entry_name(name):
            raise Denial(
                f"spec.resourceClaims: the entry name {name!r} is gpuadm's, and names a claim "
                "gpuadm did not write; rename the entry"
            )
        elif ours:
            raise Denial(
                f"spec.resourceClaims {shown(name)}: ResourceClaimTemplate {template} is "
                f"gpuadm's, for one container's GPUs; ask for {policy.domain}/<class> in the "
                "container instead"
            )
    return entries


def _scan(container: ContainerView, policy: Policy, templates: dict[str, str]) -> _Found | None:
    limits = container.limits
    requests = container.requests
    found: _Found | None = None
    # Most containers ask for no GPU: where one sits is worked out only for those that do.
    claims = container.resources.get("claims")
    if claims:
        ref = container_ref(container)
        claimed = _claimed(ref, claims, policy, templates)
        if claimed is not None:
            found = _Found(ref, claimed=claimed)
    keys = limits if requests.keys() <= limits.keys() else _keys(limits, requests)
    for key in keys:
        kind = policy.resource_kind(key)
        if kind.role is ResourceRole.OTHER:
            continue
        found = found or _Found(container_ref(container))
        ref = found.ref
        if kind.role is ResourceRole.UNKNOWN_CLASS:
            known = ", ".join(sorted(policy.classes)) or "none"
            raise Denial(f"{ref}: {key} names no GPU class (classes: {known})")
        value, amount = _agreed_value(ref, key, limits, requests)
        if kind.key is not None:
            found.class_values[key] = ClassValue(key, kind.key, amount, value)
        elif amount != 0:
            found.raw[key] = amount
    return found if found and (found.class_values or found.raw or found.claimed) else None


def _keys(limits: Mapping[str, Any], requests: Mapping[str, Any]) -> list[str]:
    """Return the keys of limits, then those set in requests only."""
    return [*limits, *(key for key in requests if key not in limits)]


def _claimed(
    ref: ContainerRef, claims: list[Any] | None, policy: Policy, templates: dict[str, str]
) -> ClaimedDevices | None:
    """Return the devices the container holds through gpuadm's claim entry, if it lists one."""
    held: ClaimedDevices | None = None
    for claim in claims or ():
        name = claim.get("name") or ""
        template = templates.get(name)
        if template is None:
            continue  # not gpuadm's; one naming no entry at all, the apiserver refuses
        if name != entry_name(ref.kind, ref.index):
            raise Denial(
                f"{ref} lists the claim {name!r}, which holds another container's GPUs; ask for "
                f"{policy.domain}/<class> in each container that needs GPUs"
            )
        parsed = parse_template_name(template)
        assert parsed is not None  # `_gpuadm_entries` kept gpuadm's templates only
        gpu_class = policy.classes.get(parsed.class_name)
        if gpu_class is None or not gpu_class.claims_devices:
            raise Denial(
                f"{ref}: ResourceClaimTemplate {template} was written for class "
                f"{parsed.class_name}, which is not a dra class of the policy"
            )
        held = ClaimedDevices(parsed.class_name, parsed.held, template, name)
    return held


def _agreed_value(
    ref: ContainerRef, key: str, limits: Mapping[str, Any], requests: Mapping[str, Any]
) -> tuple[object, Fraction]:
    """Return the value of a key, which limits and requests must agree on when both set it."""
    value = limits[key] if key in limits else requests[key]
    amount = _quantity(ref, key, value)
    if key in limits and key in requests:
        other = _quantity(ref, key, requests[key])
        if other != amount:
            raise Denial(
                f"{ref}: {key} requests {requests[key]!r} but limits {limits[key]!r}; "
                "GPU requests and limits must be equal (or set only limits)"
            )
    return value, amount


def _quantity(ref: ContainerRef, key: str, value: object) -> Fraction:
    try:
        return parse_quantity(value)
    except QuantityError as error:
        raise Denial(f"{ref}: {key}: {error}") from None


def _pod_class(
    annotations: Mapping[str, Any],
    found: list[_Found],
    policy: Policy,
    namespace_default: str | None,
    requested: list[str],
) -> str:
    named: dict[str, ContainerRef] = {}
    for item in found:
        for value in item.class_values.values():
            named.setdefault(value.class_key.class_name, item.ref)
        if item.claimed is not None:
            named.setdefault(item.claimed.class_name, item.ref)
    if len(named) > 1:
        where = ", ".join(f"{name} in {ref}" for name, ref in sorted(named.items()))
        raise Denial(f"the pod asks for two GPU classes ({where}); a pod uses one class")
    annotated = annotations.get(policy.class_annotation)
    if annotated is not None and annotated not in policy.classes:
        raise Denial(
            f"annotation {policy.class_annotation}: {shown(annotated)} is not a GPU class "
            f"(classes: {', '.join(sorted(policy.classes))})"
        )
    if named:
        (class_name,) = named
        if annotated is not None and annotated != class_name:
            raise Denial(
                f"annotation {policy.class_annotation}: {annotated!r} contradicts "
                f"{policy.domain}/{class_name} in {named[class_name]}"
            )
        return class_name
    chosen = annotated or namespace_default or policy.default_class
    if chosen is None or chosen not in policy.classes:
        asked = sorted(found[0].raw) if found else [f"annotation {key}" for key in requested]
        raise Denial(
            f"the pod asks for GPUs ({', '.join(asked)}) but names no class: "
            f"set the annotation {policy.class_annotation}, or ask for {policy.domain}/<class>"
        )
    return chosen


def _container_demand(
    item: _Found, class_name: str, gpu_class: ClassBase, policy: Policy
) -> ContainerDemand:
    ref = item.ref
    if item.claimed is not None and item.raw:
        raise Denial(
            f"{ref} holds devices of class {class_name} through a claim and asks for raw GPU "
            f"resources ({', '.join(sorted(item.raw))}) too; ask through the class alone"
        )
    if item.class_values and item.raw:
        raw = ", ".join(sorted(item.raw))
        raise Denial(
            f"{ref} mixes {policy.domain}/{class_name} with raw GPU resources ({raw}); ask "
            f"through the class alone (memory as {policy.domain}/{class_name}-memory)"
        )
    if item.class_values:
        ask = _class_ask(item, class_name, gpu_class)
        return ContainerDemand(ref, ask, replaced_keys=frozenset(item.class_values))
    if item.claimed is not None:
        return ContainerDemand(ref, item.claimed.ask, claimed=item.claimed)
    whole = _whole_devices(ref, item.raw, gpu_class, class_name)
    if whole is not None:
        count = item.raw[whole]
        if count.denominator != 1 or count < 0:
            raise Denial(
                f"{ref}: {whole}: {format_amount(count)} is not a whole number of GPUs; "
                f"ask for a share as {policy.domain}/{class_name}: {format_amount(count)}"
            )
        return ContainerDemand(ref, Whole(int(count)), replaced_keys=frozenset({whole}))
    for name, amount in item.raw.items():
        if name.startswith(DEVICE_CLASS_RESOURCE_PREFIX) and not gpu_class.owns(name):
            raise Denial(
                f"{ref}: {name} asks the scheduler for devices of DeviceClass "
                f"{name.removeprefix(DEVICE_CLASS_RESOURCE_PREFIX)}, which class {class_name} "
                f"does not claim from; ask for {policy.domain}/<class> instead (classes on that "
                f"DeviceClass: {_classes_on(name, policy)})"
            )
        if not gpu_class.owns(name):
            uses = ", ".join(sorted(gpu_class.resource_names())) or (
                f"no extended resources (ask for {policy.domain}/{class_name})"
            )
            raise Denial(
                f"{ref}: {name} does not belong to class {class_name}, whose backend "
                f"{gpu_class.backend_name()} uses {uses}"
            )
        if amount.denominator != 1 or amount < 0:
            raise Denial(f"{ref}: {name}: {format_amount(amount)} must be a whole number")
    return ContainerDemand(ref, None, raw=dict(item.raw))


def _whole_devices(
    ref: ContainerRef, raw: Mapping[str, Fraction], gpu_class: ClassBase, class_name: str
) -> str | None:
    """Return the one raw resource of a container that asks for whole GPUs of its class by
    name alone (`nvidia.com/gpu`, or a DRA extended resource of a dra class), else None;
    refuse a container that asks so by two names."""
    wholes = sorted(n for n in raw if n == STANDARD_GPU or n in gpu_class.device_resources())
    if len(wholes) > 1:
        raise Denial(
            f"{ref} asks for whole GPUs of class {class_name} through {wholes[0]} and through "
            f"{', '.join(wholes[1:])} too; ask through one of them"
        )
    return wholes[0] if wholes and len(raw) == 1 else None


def _classes_on(resource: str, policy: Policy) -> str:
    found = [name for name, c in policy.classes.items() if resource in c.device_resources()]
    return ", ".join(sorted(found)) or "none"


def _class_ask(item: _Found, class_name: str, gpu_class: ClassBase) -> Ask:
    ref = item.ref
    count: ClassValue | None = None
    memory: ClassValue | None = None
    for class_value in item.class_values.values():
        if class_value.class_key.memory:
            memory = class_value
        else:
            count = class_value
    if memory is not None and memory.amount <= 0:
        raise Denial(
            f"{ref}: {memory.key}: {memory.written!r} must be a positive amount such as 10Gi"
        )
    if count is None:
        assert memory is not None
        ask: Ask = MemoryShare(memory.amount)
    else:
        key, amount, value = count.key, count.amount, count.written
        if amount <= 0 or (amount > 1 and amount.denominator != 1):
            raise Denial(
                f"{ref}: {key}: {value!r} is neither a whole number of GPUs (1, 2, ...) nor a "
                "share of one GPU between 0 and 1 (0.5, 250m)"
            )
        if amount.denominator == 1:
            ask = Whole(int(amount), memory.amount if memory else None)
        elif memory is not None:
            raise Denial(
                f"{ref}: {key}: {value!r} is a share and {memory.key} is a memory amount; ask "
                "for one of them, or for whole GPUs with a memory cap"
            )
        else:
            ask = Share(amount)
    if not isinstance(ask, Whole) and not gpu_class.shareable:
        raise Denial(
            f"{ref}: class {class_name} gives whole GPUs only (shareable: false), "
            f"but the container asks for {ask.describe()}"
        )
    return ask


def effective_demand(charges: list[tuple[ContainerRef, Fraction]]) -> Fraction:
    """Return a pod's demand by Kubernetes' effective-request rule; `charges` in pod order.

    App containers and restartable sidecars run together, so they add up; a regular init
    container runs alone beside the sidecars started before it. The pod needs the larger of
    the running sum and the largest init step.
    """
    running: Fraction | int = 0
    sidecars: Fraction | int = 0
    largest_step: Fraction | int = 0
    # A pod view holds init containers first, each list in order.
    for ref, charge in charges:
        if ref.kind == "containers":
            running += charge
        elif ref.sidecar:
            sidecars += charge
        else:
            largest_step = max(largest_step, sidecars + charge)
    return Fraction(max(running + sidecars, largest_step))
