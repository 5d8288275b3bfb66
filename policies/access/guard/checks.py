"""The guard's entry points: a new pod (`check_guard`), the ephemeral containers an update
adds (`check_added_containers`), an update of the allocation annotations
(`check_allocation_update`), and a write of a ConfigMap through which a GPU stack hands a
share its GPUs (`check_devices_config_map`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from policies.access.guard.allocation import (
    brought_annotations,
    brought_labels,
    changed_annotations,
)
from policies.access.guard.environment import env_from_violations, env_violations
from policies.access.guard.paths import device_list_mounts, host_path_violations
from policies.access.guard.violations import (
    Violation,
    as_list,
    mapping,
    place_of,
    refuse,
    shown_value,
)
from policies.errors import Denial
from policies.pods.dra_templates import parse_template_name
from policies.pods.pod_view import ContainerView, PodView, as_view, view_containers
from policies.policy import REQUEST_ANNOTATIONS, Policy, ResourceRole


def check_guard(
    pod: Mapping[str, Any] | PodView,
    policy: Policy,
    class_name: str | None,
    *,
    namespace: str | None = None,
    requests: Iterable[tuple[str, str]] = (),
) -> None:
    """Refuse a pod that reaches GPUs outside its resources; raise `Denial` naming each way.

    `class_name` is the pod's GPU class as `plan` found it, None for a pod without GPU
    demand: a privileged container counts only in a GPU pod, and the isolation switches only
    in a pod of a class that names a limiter (`hami`, `volcano`). `namespace`, the pod's, is
    the one the denial tells an admin to exempt if the pod is a GPU stack's own. `requests`
    are the annotations its plan writes for a stack that reads a share from them
    (`Plan.requests`): the wiring that stack's own webhook adds for the share follows from
    them.
    """
    guard = policy.guard
    view = as_view(pod)
    stack = _stack(policy, class_name) if guard.isolation_switches else None
    gpu_class = policy.classes.get(class_name) if class_name is not None else None
    own = None
    if gpu_class is not None:
        own = gpu_class.stack_devices_env(view, {**view.annotations, **dict(requests)})
    violations = [
        violation
        for container in view.all_containers
        for violation in _container_violations(
            container,
            policy,
            stack=stack,
            gpu_pod=class_name is not None,
            stacks_own=own[1] if own is not None and _same(own[0], container) else None,
        )
    ]
    if guard.dev_host_path or guard.device_dir_host_path:
        violations += host_path_violations(view, guard)
    if guard.allocation_annotations:
        violations += brought_annotations(view.annotations) + brought_labels(view.labels)
    refuse(violations, namespace)


def check_added_containers(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    policy: Policy,
    *,
    namespace: str | None = None,
) -> None:
    """Refuse an update that adds an ephemeral container reaching GPUs outside resources.

    A pod's containers are fixed once it exists, except that the `pods/ephemeralcontainers`
    subresource adds ephemeral ones (as `kubectl debug` does); those are judged here. They get
    no device from a device plugin, so HAMi-core is not theirs to switch off: they reach GPUs
    through `NVIDIA_VISIBLE_DEVICES`, or by privilege in a pod whose resources hold GPUs.
    """
    guard = policy.guard
    if not (
        guard.visible_devices_env or guard.privileged_gpu_containers or guard.device_list_mounts
    ):
        return
    before = as_list(mapping(old.get("spec")).get("ephemeralContainers"))
    known = {name for c in before if isinstance(name := mapping(c).get("name"), str)}
    spec = mapping(new.get("spec"))
    added = [
        container
        for container in view_containers(spec.get("ephemeralContainers"), "ephemeralContainers")
        if not (isinstance(container.name, str) and container.name in known)
    ]
    if not added:
        return
    annotations = mapping(mapping(new.get("metadata")).get("annotations"))
    gpu_pod = guard.privileged_gpu_containers and _holds_gpus(spec, annotations, policy)
    violations = [
        violation
        for container in added
        for violation in _container_violations(container, policy, stack=None, gpu_pod=gpu_pod)
    ]
    refuse(violations, namespace)


def check_allocation_update(
    old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy, user: str
) -> None:
    """Refuse an update by anyone but the GPU stack that adds, changes or removes one of the
    annotations with which the stack's scheduler tells its device plugin what to give a pod.

    Changed between scheduling and the device plugin's allocation, `*-to-allocate` would give
    the pod other GPUs, or more memory and cores than it is charged for. The stack's scheduler
    and device plugin write them on every GPU pod they place, so they are not refused; those
    users are the policy's `gpuStackUsers`.
    """
    if not policy.guard.allocation_annotations or user in policy.gpu_stack_users:
        return
    changed = changed_annotations(old, new)
    if not changed:
        return
    who = shown_value(user) or "an unnamed user"
    # The way out is to name the stack's users, not to let every user change them.
    kinds = {kind: [c.split(" ", 1)[1] for c in changed if c.startswith(kind)] for kind in KINDS}
    named = " and ".join(f"{kind} {', '.join(keys)}" for kind, keys in kinds.items() if keys)
    raise Denial(
        f"{named} may be changed only by the GPU stack's scheduler and "
        f"device plugin (the policy's gpuStackUsers), not by {who}: "
        "it tells the device plugin which GPUs, and how much of each, to give the pod. "
        f"If {who} is the GPU stack's own, an admin adds it to the policy's gpuStackUsers"
    )


KINDS = ("annotation", "label")


def check_devices_config_map(name: str, policy: Policy, *, user: str, namespace: str) -> None:
    """Refuse a create or update, by anyone but the GPU stack, of a ConfigMap named as a
    class's stack names those through which it hands a share's container its GPUs.

    KAI's binder writes the GPUs it reserved for a share into such a ConfigMap in the pod's
    namespace, and the share's container reads `NVIDIA_VISIBLE_DEVICES` from it when it
    starts: one written by a tenant, made before the binder's or edited after it, could name
    every GPU of the node to a pod charged for 1% of one. Its writers are the policy's
    `gpuStackUsers` (KAI's binder among them by default). Deleting one takes no GPU from
    anyone, so deletes are not judged. `namespace` is the ConfigMap's: in an exempt one,
    nothing is refused.
    """
    if (
        not policy.guard.allocation_annotations
        or user in policy.gpu_stack_users
        or namespace in policy.exempt_namespaces
    ):
        return
    writers = sorted(
        {
            stack.writer
            for gpu_class in policy.classes.values()
            if (stack := gpu_class.devices_config_maps) is not None and stack.names.search(name)
        }
    )
    if not writers:
        return
    who = shown_value(user) or "an unnamed user"
    raise Denial(
        f"ConfigMap {shown_value(name)} in namespace {shown_value(namespace)} is named as "
        f"{' and '.join(writers)} names the ConfigMap that hands a GPU share its GPUs (its "
        "container reads NVIDIA_VISIBLE_DEVICES from it), so only the GPU stack (the "
        f"policy's gpuStackUsers) may create or change it, not {who}: a pod charged for a "
        f"share would see every GPU it names. If {who} is the GPU stack's own, an admin "
        "adds it to the policy's gpuStackUsers"
    )


def _same(one: ContainerView, other: ContainerView) -> bool:
    return one.kind == other.kind and one.position == other.position


def _container_violations(
    container: ContainerView,
    policy: Policy,
    *,
    stack: str | None,
    gpu_pod: bool,
    stacks_own: Mapping[str, Any] | None = None,
) -> Iterator[Violation]:
    """Yield the env, mount and privilege violations of one container; `stacks_own` is the
    `NVIDIA_VISIBLE_DEVICES` entry the class's stack writes into it, if any."""
    guard = policy.guard
    if guard.visible_devices_env or stack is not None:
        yield from env_violations(container, guard, stack, stacks_own)
    if stack is not None and container.env_from and _asks_gpus(container, policy):
        yield from env_from_violations(container, stack)
    if guard.device_list_mounts:
        yield from device_list_mounts(container)
    if gpu_pod and guard.privileged_gpu_containers and container.privileged:
        yield Violation(
            place_of(container),
            "securityContext.privileged=true",
            "in a GPU pod sees every GPU of the node, not only the pod's; drop privileged",
        )


def _asks_gpus(container: ContainerView, policy: Policy) -> bool:
    """Tell whether a container's resources name a GPU resource the policy knows."""
    return any(
        policy.resource_kind(key).role is not ResourceRole.OTHER
        for side in (container.limits, container.requests)
        for key in side
        if isinstance(key, str)
    )


def _holds_gpus(spec: Mapping[str, Any], annotations: Mapping[str, Any], policy: Policy) -> bool:
    """Tell whether any container's resources name a GPU resource the policy knows, or the
    pod names one of gpuadm's ResourceClaimTemplates (a `dra` class).

    A stored pod holds its backend's resources; its class cannot be planned again here,
    since the scheduler has set `nodeName`, which `plan` refuses for some classes.
    """
    if any(key in annotations for key in REQUEST_ANNOTATIONS):
        return True  # a share a stack reads from the annotations (KAI's `gpu-fraction`)
    resources = any(
        policy.resource_kind(key).role is not ResourceRole.OTHER
        for field in ("initContainers", "containers")
        for container in as_list(spec.get(field))
        for side in ("limits", "requests")
        for key in mapping(mapping(mapping(container).get("resources")).get(side))
        if isinstance(key, str)
    )
    return resources or any(
        isinstance(template, str) and parse_template_name(template) is not None
        for entry in as_list(spec.get("resourceClaims"))
        for template in (mapping(entry).get("resourceClaimTemplateName"),)
    )


def _stack(policy: Policy, class_name: str | None) -> str | None:
    """Return the stack whose limiter (HAMi-core) isolates the class's pods, else None."""
    gpu_class = policy.classes.get(class_name) if class_name is not None else None
    return gpu_class.limiter if gpu_class is not None else None
