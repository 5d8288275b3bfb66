"""The guard's rules on a container's environment: `NVIDIA_VISIBLE_DEVICES`, with which the
NVIDIA container runtime gives GPUs outside the container's resources, and the variables
that switch HAMi-core (the in-container limiter of HAMi and Volcano) off or override its
limits, set by `env` or brought by `envFrom`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from policies.access.guard.violations import Violation, mapping, place_of, shown_value
from policies.pods.pod_view import ContainerView
from policies.policy import Guard

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


def env_violations(
    container: ContainerView,
    guard: Guard,
    stack: str | None,
    stacks_own: Mapping[str, Any] | None = None,
) -> Iterator[Violation]:
    """Yield a violation for each `env` entry that gives GPUs (`NVIDIA_VISIBLE_DEVICES`) or,
    in a pod of a class whose `stack` names a limiter, switches that limiter off.

    `stacks_own` is the one `NVIDIA_VISIBLE_DEVICES` entry through which the class's stack
    hands this container its GPU itself (KAI's, from the ConfigMap its binder fills): that
    entry, exactly, is let be."""
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
            if (
                guard.visible_devices_env
                and entry != stacks_own
                and (field := _gives_devices(entry))
            ):
                yield Violation(
                    place_of(container),
                    field,
                    "may give it GPUs that its resources do not hold; set it to void or "
                    "none, or ask for GPUs in resources",
                )
        elif (
            stack is not None
            and isinstance(name, str)
            and (name in ISOLATION_NAMES or name.startswith(LIMIT_VARIABLES))
        ):
            switched = _switches_isolation(entry, name, stack)
            if switched is not None:
                yield Violation(place_of(container), *switched)


def _gives_devices(entry: Mapping[str, Any]) -> str | None:
    """Return the field of an NVIDIA_VISIBLE_DEVICES entry that may name devices, or None."""
    if entry.get("valueFrom") is not None:
        # A ConfigMap, Secret or field may hold any value, and may change after admission.
        return f"env {VISIBLE_DEVICES} from valueFrom (a value gpuadm cannot check)"
    value = entry.get("value")
    if isinstance(value, str) and value in NO_DEVICES:
        return None
    return f"env {VISIBLE_DEVICES}={'(empty)' if value in (None, '') else shown_value(value)}"


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
    shown = f"env {name} from valueFrom" if from_elsewhere else f"env {name}={shown_value(value)}"
    return shown, reason


def env_from_violations(container: ContainerView, stack: str) -> Iterator[Violation]:
    """Yield a violation for each `envFrom` source that may set an isolation variable.

    Its ConfigMap or Secret is not in the pod, and may change after admission, so only its
    `prefix` tells: one that no isolation variable starts with cannot produce one.
    """
    for index, source in enumerate(container.env_from):
        prefix = mapping(source).get("prefix")
        if isinstance(prefix, str) and prefix and not _may_produce_isolation_name(prefix):
            continue
        yield Violation(
            place_of(container),
            f"envFrom[{index}] ({_source_name(source)})",
            f"may set {stack}'s limiter variables (GPU_CORE_UTILIZATION_POLICY, "
            "CUDA_DEVICE_MEMORY_LIMIT, ...) from a ConfigMap or Secret gpuadm cannot read; "
            "give it a prefix no such variable starts with (e.g. APP_), and set the "
            "container's own CUDA and GPU variables as plain env",
        )


def _may_produce_isolation_name(prefix: str) -> bool:
    """Tell whether `prefix` + some key can be an isolation variable (keys are non-empty)."""
    return any(name.startswith(prefix) and name != prefix for name in ISOLATION_NAMES) or any(
        limit.startswith(prefix) or prefix.startswith(limit) for limit in LIMIT_VARIABLES
    )


def _source_name(source: object) -> str:
    for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
        ref = mapping(source).get(field)
        if isinstance(ref, Mapping):
            return f"{kind} {shown_value(ref.get('name'))}"
    return "a source gpuadm cannot read"
