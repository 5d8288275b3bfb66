"""Keep GPU access inside a pod's resources: the rules of the policy's `guard` section.

Quota charges what a pod's resources hold, so a pod must not reach GPUs any other way. It
could: the NVIDIA container runtime hands a container every GPU that `NVIDIA_VISIBLE_DEVICES`
names even when the container asks for none; a hostPath under `/dev/nvidia` or a privileged
container sees the node's GPU devices; and HAMi and Volcano stop holding a share to its size
when a container switches their in-container limiter (HAMi-core) off. Each rule is one key of
`guard`, on unless the policy switches it off (docs/configuration.md, docs/backends.md).

The checks read the pod once, linearly in its size. They run beside `plan`, not inside it:
the plan memo is keyed by exactly what `plan` reads (`plan_inputs`), which leaves env,
volumes and security contexts out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from policies.classes import VirtualGpuClass
from policies.dra import parse_template_name
from policies.errors import Denial
from policies.policy import STACK_NAMES, Guard, Policy, ResourceRole
from policies.shapes import clipped, shown

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# The values with which the NVIDIA container runtime gives a container no GPU: `void` runs it
# as plain runc would, `none` mounts the driver's files but no device.
NO_DEVICES = frozenset({"void", "none"})
# HAMi's device plugin leaves out the preload of HAMi-core when this is set (to true in
# current releases, to anything in older ones), so it is refused whatever its value.
DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
# HAMi-core keeps the core limit under `default` and `force`; `disable` drops it.
CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
KEPT_CORE_POLICY = frozenset({"default", "force"})
# The limits HAMi-core reads (and their per-device `_<n>` forms): the stack's device plugin
# writes them from the pod's resources, so a pod has no value of its own to give them.
LIMIT_VARIABLES = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")
ISOLATION_NAMES = frozenset({DISABLE_CONTROL, CORE_POLICY})
CONTAINER_KINDS = {
    "initContainers": "init container",
    "containers": "container",
    "ephemeralContainers": "ephemeral container",
}
# A denial lists this many violations, then counts the rest: one pod may hold thousands.
MAX_LISTED = 5
# Names and values come from the user, unchecked by the apiserver before mutation.
MAX_SHOWN = 64


class Violation(NamedTuple):
    """One way a pod reaches GPUs outside its resources, and the rule (a `Guard` field)."""

    where: str
    field: str
    reason: str
    rule: str

    def describe(self, guard: Guard) -> str:
        """Return the violation as the user reads it, with the key that allows it."""
        switch = guard.switch(self.rule)
        return f"{self.where}: {self.field} {self.reason} (allowed only with {switch}: false)"


def check_guard(pod: Mapping[str, Any], policy: Policy, class_name: str | None) -> None:
    """Refuse a pod that reaches GPUs outside its resources; raise `Denial` naming each way.

    `class_name` is the pod's GPU class as `plan` found it, None for a pod without GPU
    demand: a privileged container counts only in a GPU pod, and the isolation switches only
    in a pod of a `hami` or `volcano` class.
    """
    guard = policy.guard
    spec = _mapping(pod.get("spec"))
    stack = _stack(policy, class_name) if guard.isolation_switches else None
    violations = [
        violation
        for kind, container in _containers(spec)
        for violation in _container_violations(
            kind, container, guard, stack=stack, gpu_pod=class_name is not None
        )
    ]
    if guard.dev_host_path:
        violations += _host_path_violations(spec)
    _refuse(violations, guard)


def check_added_containers(old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy) -> None:
    """Refuse an update that adds an ephemeral container reaching GPUs outside resources.

    A pod's containers are fixed once it exists, except that the `pods/ephemeralcontainers`
    subresource adds ephemeral ones (as `kubectl debug` does); those are judged here. They get
    no device from a device plugin, so HAMi-core is not theirs to switch off: they reach GPUs
    through `NVIDIA_VISIBLE_DEVICES`, or by privilege in a pod whose resources hold GPUs.
    """
    guard = policy.guard
    if not (guard.visible_devices_env or guard.privileged_gpu_containers):
        return
    before = _list(_mapping(old.get("spec")).get("ephemeralContainers"))
    known = {name for c in before if isinstance(name := _mapping(c).get("name"), str)}
    spec = _mapping(new.get("spec"))
    added = [
        container
        for container in _list(spec.get("ephemeralContainers"))
        if isinstance(container, Mapping) and not _named_in(container, known)
    ]
    if not added:
        return
    gpu_pod = guard.privileged_gpu_containers and _holds_gpus(spec, policy)
    violations = [
        violation
        for container in added
        for violation in _container_violations(
            "ephemeralContainers", container, guard, stack=None, gpu_pod=gpu_pod
        )
    ]
    _refuse(violations, guard)


def _refuse(violations: list[Violation], guard: Guard) -> None:
    if not violations:
        return
    listed = [violation.describe(guard) for violation in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        listed.append(f"and {len(violations) - MAX_LISTED} more")
    raise Denial("GPU access outside the pod's resources: " + "; ".join(listed))


def _container_violations(
    kind: str, container: Mapping[str, Any], guard: Guard, *, stack: str | None, gpu_pod: bool
) -> Iterator[Violation]:
    """Yield the env and privilege violations of one container."""
    if guard.visible_devices_env or stack is not None:
        # Decoded JSON holds dicts; `dict` is checked much faster than `Mapping`, and a pod
        # may carry tens of thousands of env entries.
        env = _list(container.get("env"))
        if stack is None:
            # Only NVIDIA_VISIBLE_DEVICES can break a rule: pick its entries out in one pass.
            env = [e for e in env if isinstance(e, dict) and e.get("name") == VISIBLE_DEVICES]
        for entry in env:
            if not isinstance(entry, dict):
                continue
            name = entry.get("name")
            if name == VISIBLE_DEVICES:
                if guard.visible_devices_env and (field := _gives_devices(entry)):
                    yield Violation(
                        _where(kind, container),
                        field,
                        "may give it GPUs that its resources do not hold; set it to void or "
                        "none, or ask for GPUs in resources",
                        "visible_devices_env",
                    )
            elif (
                stack is not None
                and isinstance(name, str)
                and (name in ISOLATION_NAMES or name.startswith(LIMIT_VARIABLES))
            ):
                switched = _switches_isolation(entry, name, stack)
                if switched is not None:
                    yield Violation(
                        _where(kind, container), switched[0], switched[1], "isolation_switches"
                    )
    if gpu_pod and guard.privileged_gpu_containers and _privileged(container):
        yield Violation(
            _where(kind, container),
            "securityContext.privileged=true",
            "in a GPU pod sees every GPU of the node, not only the pod's; drop privileged",
            "privileged_gpu_containers",
        )


def _gives_devices(entry: Mapping[str, Any]) -> str | None:
    """Return the field of an NVIDIA_VISIBLE_DEVICES entry that may name devices, or None."""
    if entry.get("valueFrom") is not None:
        # A ConfigMap, Secret or field may hold any value, and may change after admission.
        return f"env {VISIBLE_DEVICES} from valueFrom (a value gpuadm cannot check)"
    value = entry.get("value")
    if isinstance(value, str) and value in NO_DEVICES:
        return None
    return f"env {VISIBLE_DEVICES}={'(empty)' if value in (None, '') else _shown(value)}"


def _switches_isolation(entry: Mapping[str, Any], name: str, stack: str) -> tuple[str, str] | None:
    """Return (field, reason) for an entry that names an isolation variable, else None.

    Only a core policy that keeps the limit (`default`, `force`) is None; every other value of
    the variables the caller picked out switches a limit off or overrides it.
    """
    stack_name = STACK_NAMES[stack]
    value = entry.get("value")
    from_elsewhere = entry.get("valueFrom") is not None
    if name == DISABLE_CONTROL:
        reason = (
            f"can switch {stack_name}'s in-container limiter (HAMi-core) off, so the container "
            "could use the whole GPU while charged for its share; remove it"
        )
    elif name == CORE_POLICY:
        if not from_elsewhere and isinstance(value, str) and value.lower() in KEPT_CORE_POLICY:
            return None
        reason = (
            f"may lift {stack_name}'s core limit (only default or force keep it), so the "
            "container could use every core while charged for its share"
        )
    else:
        reason = (
            f"overrides a limit that {stack_name}'s device plugin sets from the pod's "
            "resources; remove it, the resources set it"
        )
    shown = f"env {name} from valueFrom" if from_elsewhere else f"env {name}={_shown(value)}"
    return shown, reason


def _host_path_violations(spec: Mapping[str, Any]) -> list[Violation]:
    """Return a violation for each hostPath volume under /dev/nvidia."""
    found = []
    for index, volume in enumerate(_list(spec.get("volumes"))):
        path = _mapping(_mapping(volume).get("hostPath")).get("path")
        if isinstance(path, str) and _under_dev_nvidia(path):
            found.append((index, _mapping(volume).get("name"), path))
    if not found:
        return []
    mounts = _mounting_containers(spec, {name for _, name, _ in found if isinstance(name, str)})
    violations = []
    for index, name, path in found:
        where = f'volume "{_shown(name)}"'
        if isinstance(name, str) and (mounters := mounts.get(name)):
            where += f" (mounted by {', '.join(mounters[:3])})"
        violations.append(
            Violation(
                where,
                f"volumes[{index}].hostPath.path={_shown(path)}",
                "exposes the node's GPU devices outside the pod's resources; ask for GPUs in "
                "resources instead",
                "dev_host_path",
            )
        )
    return violations


def _under_dev_nvidia(path: str) -> bool:
    """Tell whether a host path names /dev/nvidia* once `//`, `.` and `..` are resolved.

    The apiserver refuses `..` in a hostPath, and the webhooks' matchConditions send the other
    spellings (`//dev/nvidia0`, `/dev/./nvidia0`) here too.
    """
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return len(parts) >= 2 and parts[0] == "dev" and parts[1].startswith("nvidia")


def _mounting_containers(spec: Mapping[str, Any], volumes: set[str]) -> dict[str, list[str]]:
    """Return, for each of the volumes, the containers that mount it."""
    mounters: dict[str, list[str]] = {}
    for kind, container in _containers(spec):
        for mount in _list(container.get("volumeMounts")):
            name = _mapping(mount).get("name")
            if isinstance(name, str) and name in volumes:
                mounters.setdefault(name, []).append(_where(kind, container))
    return mounters


def _holds_gpus(spec: Mapping[str, Any], policy: Policy) -> bool:
    """Tell whether any container's resources name a GPU resource the policy knows, or the
    pod names one of gpuadm's ResourceClaimTemplates (a `dra` class).

    A stored pod holds its backend's resources; its class cannot be planned again here,
    since the scheduler has set `nodeName`, which `plan` refuses for some classes.
    """
    resources = any(
        policy.resource_kind(key).role is not ResourceRole.OTHER
        for field in ("initContainers", "containers")
        for container in _list(spec.get(field))
        for side in ("limits", "requests")
        for key in _mapping(_mapping(_mapping(container).get("resources")).get(side))
        if isinstance(key, str)
    )
    return resources or any(
        isinstance(template, str) and parse_template_name(template) is not None
        for entry in _list(spec.get("resourceClaims"))
        for template in (_mapping(entry).get("resourceClaimTemplateName"),)
    )


def _stack(policy: Policy, class_name: str | None) -> str | None:
    """Return `hami` or `volcano` for a class whose GPUs HAMi-core isolates, else None."""
    gpu_class = policy.classes.get(class_name) if class_name is not None else None
    return gpu_class.stack if isinstance(gpu_class, VirtualGpuClass) else None


def _named_in(container: Mapping[str, Any], names: set[str]) -> bool:
    name = container.get("name")
    return isinstance(name, str) and name in names


def _privileged(container: Mapping[str, Any]) -> bool:
    return _mapping(container.get("securityContext")).get("privileged") is True


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Yield (kind, container) for every container, init container and ephemeral container."""
    for kind in CONTAINER_KINDS:
        for container in _list(spec.get(kind)):
            if isinstance(container, Mapping):
                yield kind, container


def _where(kind: str, container: Mapping[str, Any]) -> str:
    """Name a container as the user knows it: `init container "setup"`."""
    label = CONTAINER_KINDS[kind]
    if kind == "initContainers" and container.get("restartPolicy") == "Always":
        label = "sidecar"
    return f'{label} "{_shown(container.get("name"))}"'


def _shown(value: object) -> str:
    """Return a value for a message: text as it is, other values as the core shows them.

    Names and paths read better unquoted (`env NVIDIA_VISIBLE_DEVICES=all`); both are cut
    to MAX_SHOWN characters the same way as every value a message shows.
    """
    if isinstance(value, str):
        return clipped(value, MAX_SHOWN)
    return shown(value, MAX_SHOWN)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
