"""Keep GPU access inside a pod's resources: the rules of the policy's `guard` section.

Quota charges what a pod's resources hold, so a pod must not reach GPUs any other way. It
could: the NVIDIA container runtime hands a container every GPU that `NVIDIA_VISIBLE_DEVICES`
names even when the container asks for none; a hostPath under `/dev/nvidia` or a privileged
container sees the node's GPU devices; a mount under `/var/run/nvidia-container-devices`
names devices to the NVIDIA Container Toolkit's volume-mounts strategy; a hostPath of
`/dev/char` or `/run/nvidia/driver/dev` (or a directory above them) holds the device files
among others; HAMi and Volcano stop holding a share to its size when a container switches
their in-container limiter (HAMi-core) off, with `env` or `envFrom`; and their device plugins
give a pod the devices its allocation annotations name. Each rule is one key of `guard`, on
unless the policy switches it off (docs/configuration.md, docs/backends.md).

The checks read the pod once, linearly in its size. They run beside `plan`, not inside it:
the plan memo is keyed by exactly what `plan` reads (`memo_key`), which leaves env,
volumes and security contexts out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from policies.dra_templates import parse_template_name
from policies.errors import Denial
from policies.pod_shape import clipped, shown
from policies.pod_view import ContainerView, PodView, as_view, view_containers
from policies.policy import Guard, Policy, ResourceRole

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
# The file of HAMi-core's shared region, where the processes of a container account their
# memory together; the device plugin names a fresh one per container. A region file the pod
# brings carries limits of its own, which HAMi-core takes over the plugin's.
SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
# The library HAMi-core resolves CUDA driver calls from (its own libvgpu.so by default):
# another one leaves the calls unlimited.
REDIRECT = "CUDA_REDIRECT"
ISOLATION_NAMES = frozenset({DISABLE_CONTROL, CORE_POLICY, SHARED_CACHE, REDIRECT})
# The NVIDIA Container Toolkit's volume-mounts device list: a mount whose destination, once
# cleaned, starts with this root names the devices after it (`<root>/all`, `<root>/0`). The
# toolkit compares the text, so `<root>all` counts too.
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
# Directories that hold a node's GPU device files among others: the symlinks of every char
# device, and the GPU Operator's driver root. `/var/run` is `/run` on the node.
DEVICE_DIRS = (("dev", "char"), ("run", "nvidia", "driver", "dev"))
# The pod annotations with which a stack's scheduler tells its device plugin what to give the
# pod, and which pod is being bound where: the plugin gives the devices (and the memory and
# cores) that `*-to-allocate` names. The stack writes them, never the pod
# (Project-HAMi/HAMi pkg/util/types.go and pkg/device/nvidia/device.go;
# Project-HAMi/volcano-vgpu-device-plugin pkg/util/types.go).
ALLOCATION_ANNOTATIONS = (
    "hami.io/vgpu-devices-to-allocate",
    "hami.io/vgpu-devices-allocated",
    "hami.io/vgpu-mig-allocations",
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/bind-phase",
    "hami.io/bind-time",
    "volcano.sh/devices-to-allocate",
    "volcano.sh/vgpu-ids-new",
    "volcano.sh/vgpu-node",
    "volcano.sh/vgpu-time",
    "volcano.sh/bind-phase",
    "volcano.sh/bind-time",
)
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


def check_guard(pod: Mapping[str, Any] | PodView, policy: Policy, class_name: str | None) -> None:
    """Refuse a pod that reaches GPUs outside its resources; raise `Denial` naming each way.

    `class_name` is the pod's GPU class as `plan` found it, None for a pod without GPU
    demand: a privileged container counts only in a GPU pod, and the isolation switches only
    in a pod of a class that names a limiter (`hami`, `volcano`).
    """
    guard = policy.guard
    view = as_view(pod)
    stack = _stack(policy, class_name) if guard.isolation_switches else None
    violations = [
        violation
        for container in view.all_containers
        for violation in _container_violations(
            container, policy, stack=stack, gpu_pod=class_name is not None
        )
    ]
    if guard.dev_host_path or guard.device_dir_host_path:
        violations += _host_path_violations(view, guard)
    if guard.allocation_annotations:
        violations += _brought_annotations(view.annotations)
    _refuse(violations, guard)


def check_added_containers(old: Mapping[str, Any], new: Mapping[str, Any], policy: Policy) -> None:
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
    before = _list(_mapping(old.get("spec")).get("ephemeralContainers"))
    known = {name for c in before if isinstance(name := _mapping(c).get("name"), str)}
    spec = _mapping(new.get("spec"))
    added = [
        container
        for container in view_containers(spec.get("ephemeralContainers"), "ephemeralContainers")
        if not (isinstance(container.name, str) and container.name in known)
    ]
    if not added:
        return
    gpu_pod = guard.privileged_gpu_containers and _holds_gpus(spec, policy)
    violations = [
        violation
        for container in added
        for violation in _container_violations(container, policy, stack=None, gpu_pod=gpu_pod)
    ]
    _refuse(violations, guard)


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
    before = _annotations(old)
    after = _annotations(new)
    changed = [
        key for key in ALLOCATION_ANNOTATIONS if before.get(key, _ABSENT) != after.get(key, _ABSENT)
    ]
    if not changed:
        return
    switch = policy.guard.switch("allocation_annotations")
    raise Denial(
        f"annotation {', '.join(changed)} may be changed only by the GPU stack's scheduler and "
        f"device plugin (the policy's gpuStackUsers), not by {_shown(user) or 'an unnamed user'}: "
        "it tells the device plugin which GPUs, and how much of each, to give the pod "
        f"(allowed only with {switch}: false)"
    )


def _refuse(violations: list[Violation], guard: Guard) -> None:
    if not violations:
        return
    listed = [violation.describe(guard) for violation in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        listed.append(f"and {len(violations) - MAX_LISTED} more")
    raise Denial("GPU access outside the pod's resources: " + "; ".join(listed))


def _container_violations(
    container: ContainerView, policy: Policy, *, stack: str | None, gpu_pod: bool
) -> Iterator[Violation]:
    """Yield the env, mount and privilege violations of one container."""
    guard = policy.guard
    if guard.visible_devices_env or stack is not None:
        # Decoded JSON holds dicts; `dict` is checked much faster than `Mapping`, and a pod
        # may carry tens of thousands of env entries.
        env = container.env
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
                        _where(container),
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
                        _where(container), switched[0], switched[1], "isolation_switches"
                    )
    if stack is not None and container.env_from and _asks_gpus(container, policy):
        yield from _env_from_violations(container, stack)
    if guard.device_list_mounts:
        yield from _device_list_mounts(container)
    if gpu_pod and guard.privileged_gpu_containers and container.privileged:
        yield Violation(
            _where(container),
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
    value = entry.get("value")
    from_elsewhere = entry.get("valueFrom") is not None
    if name == DISABLE_CONTROL:
        reason = (
            f"can switch {stack}'s in-container limiter (HAMi-core) off, so the container "
            "could use the whole GPU while charged for its share; remove it"
        )
    elif name == SHARED_CACHE:
        reason = (
            f"points {stack}'s limiter (HAMi-core) at a region file of the pod's own, whose "
            "limits it takes over the device plugin's; remove it, the device plugin sets it"
        )
    elif name == REDIRECT:
        reason = (
            f"makes {stack}'s limiter (HAMi-core) take CUDA calls from another library, "
            "which does not limit them; remove it"
        )
    elif name == CORE_POLICY:
        if not from_elsewhere and isinstance(value, str) and value.lower() in KEPT_CORE_POLICY:
            return None
        reason = (
            f"may lift {stack}'s core limit (only default or force keep it), so the "
            "container could use every core while charged for its share"
        )
    else:
        reason = (
            f"overrides a limit that {stack}'s device plugin sets from the pod's "
            "resources; remove it, the resources set it"
        )
    shown = f"env {name} from valueFrom" if from_elsewhere else f"env {name}={_shown(value)}"
    return shown, reason


def _env_from_violations(container: ContainerView, stack: str) -> Iterator[Violation]:
    """Yield a violation for each `envFrom` source that may set an isolation variable.

    Its ConfigMap or Secret is not in the pod, and may change after admission, so only its
    `prefix` tells: one that no isolation variable starts with cannot produce one.
    """
    for index, source in enumerate(container.env_from):
        prefix = _mapping(source).get("prefix")
        if isinstance(prefix, str) and prefix and not _may_produce_isolation_name(prefix):
            continue
        yield Violation(
            _where(container),
            f"envFrom[{index}] ({_source_name(source)})",
            f"may set {stack}'s limiter variables (GPU_CORE_UTILIZATION_POLICY, "
            "CUDA_DEVICE_MEMORY_LIMIT, ...) from a ConfigMap or Secret gpuadm cannot read; "
            "give it a prefix no such variable starts with (e.g. APP_), and set the "
            "container's own CUDA and GPU variables as plain env",
            "isolation_switches",
        )


def _may_produce_isolation_name(prefix: str) -> bool:
    """Tell whether `prefix` + some key can be an isolation variable (keys are non-empty)."""
    return any(name.startswith(prefix) and name != prefix for name in ISOLATION_NAMES) or any(
        limit.startswith(prefix) or prefix.startswith(limit) for limit in LIMIT_VARIABLES
    )


def _source_name(source: object) -> str:
    for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        ref = _mapping(source).get(field)
        if isinstance(ref, Mapping):
            return f"{kind} {_shown(ref.get('name'))}"
    return "a source gpuadm cannot read"


def _device_list_mounts(container: ContainerView) -> Iterator[Violation]:
    """Yield a violation for each mount the toolkit would read as a device list."""
    for index, mount in enumerate(container.volume_mounts):
        path = _mapping(mount).get("mountPath")
        if isinstance(path, str) and _names_device_list(path):
            yield Violation(
                _where(container),
                f"volumeMounts[{index}].mountPath={_shown(path)}",
                "names GPUs to the NVIDIA Container Toolkit's volume-mounts device list, "
                "which gives them to the container outside its resources; mount it elsewhere, "
                "or ask for GPUs in resources",
                "device_list_mounts",
            )


def _names_device_list(path: str) -> bool:
    """Tell whether a mount path, cleaned as the toolkit cleans it, starts with its root.

    A relative path is taken from `/`, which the runtime would resolve it against or refuse.
    """
    return ("/" + "/".join(_parts(path))).startswith(DEVICE_LIST_ROOT)


def _host_path_violations(pod: PodView, guard: Guard) -> list[Violation]:
    """Return a violation for each hostPath volume that holds the node's GPU device files."""
    found = []
    for index, volume in enumerate(pod.volumes):
        path = _mapping(_mapping(volume).get("hostPath")).get("path")
        if not isinstance(path, str):
            continue
        if guard.dev_host_path and _under_dev_nvidia(path):
            found.append((index, _mapping(volume).get("name"), path, "dev_host_path"))
        elif guard.device_dir_host_path and _holds_device_dir(path):
            found.append((index, _mapping(volume).get("name"), path, "device_dir_host_path"))
    if not found:
        return []
    mounts = _mounting_containers(pod, {name for _, name, _, _ in found if isinstance(name, str)})
    violations = []
    for index, name, path, rule in found:
        where = f'volume "{_shown(name)}"'
        if isinstance(name, str) and (mounters := mounts.get(name)):
            where += f" (mounted by {', '.join(mounters[:3])})"
        reason = (
            "exposes the node's GPU devices outside the pod's resources; ask for GPUs in "
            "resources instead"
            if rule == "dev_host_path"
            else "holds the node's GPU device files (/dev/char, /run/nvidia/driver/dev) "
            "among others, outside the pod's resources; mount a narrower path, or ask for GPUs "
            "in resources"
        )
        violations.append(
            Violation(where, f"volumes[{index}].hostPath.path={_shown(path)}", reason, rule)
        )
    return violations


def _parts(path: str) -> list[str]:
    """Return the names of a path once `//`, `.` and `..` are resolved, from `/`."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return parts


def _under_dev_nvidia(path: str) -> bool:
    """Tell whether a host path names /dev/nvidia* once `//`, `.` and `..` are resolved.

    The apiserver refuses `..` in a hostPath, and the webhooks' matchConditions send the other
    spellings (`//dev/nvidia0`, `/dev/./nvidia0`) here too.
    """
    parts = _parts(path)
    return len(parts) >= 2 and parts[0] == "dev" and parts[1].startswith("nvidia")


def _holds_device_dir(path: str) -> bool:
    """Tell whether a host path is one of `DEVICE_DIRS`, under one, or a directory above one.

    `/var/run` is read as `/run`, which it is on the node; `/` and `/dev` are above them.
    """
    parts = _parts(path)
    if parts[:2] == ["var", "run"]:
        parts = parts[1:]
    return any(
        parts[: len(tree)] == list(tree) or list(tree[: len(parts)]) == parts
        for tree in DEVICE_DIRS
    )


def _brought_annotations(annotations: Mapping[str, Any]) -> list[Violation]:
    """Return a violation for each allocation annotation a new pod brings."""
    return [
        Violation(
            "the pod",
            f"annotation {key}",
            "is written by the GPU stack's scheduler to tell its device plugin which GPUs to "
            "give the pod; a pod may not bring it: remove it",
            "allocation_annotations",
        )
        for key in ALLOCATION_ANNOTATIONS
        if key in annotations
    ]


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(pod.get("metadata")).get("annotations"))


def _asks_gpus(container: ContainerView, policy: Policy) -> bool:
    """Tell whether a container's resources name a GPU resource the policy knows."""
    return any(
        policy.resource_kind(key).role is not ResourceRole.OTHER
        for side in (container.limits, container.requests)
        for key in side
        if isinstance(key, str)
    )


def _mounting_containers(pod: PodView, volumes: set[str]) -> dict[str, list[str]]:
    """Return, for each of the volumes, the containers that mount it."""
    mounters: dict[str, list[str]] = {}
    for container in pod.all_containers:
        for mount in container.volume_mounts:
            name = _mapping(mount).get("name")
            if isinstance(name, str) and name in volumes:
                mounters.setdefault(name, []).append(_where(container))
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
    """Return the stack whose limiter (HAMi-core) isolates the class's pods, else None."""
    gpu_class = policy.classes.get(class_name) if class_name is not None else None
    return gpu_class.limiter if gpu_class is not None else None


_ABSENT = object()


def _where(container: ContainerView) -> str:
    """Name a container as the user knows it: `init container "setup"`."""
    label = "sidecar" if container.sidecar else CONTAINER_KINDS[container.kind]
    return f'{label} "{_shown(container.name)}"'


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
