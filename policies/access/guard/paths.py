"""The guard's rules on paths: hostPath volumes that hold the node's GPU device files, and
mounts that name devices to the NVIDIA Container Toolkit's volume-mounts device list."""

from __future__ import annotations

from collections.abc import Iterator

from policies.access.guard.violations import Violation, mapping, place_of, shown_value
from policies.pods.pod_view import ContainerView, PodView
from policies.policy import Guard

# The NVIDIA Container Toolkit's volume-mounts device list: a mount whose destination, once
# cleaned, starts with this root names the devices after it (`<root>/all`, `<root>/0`). The
# toolkit compares the text, so `<root>all` counts too.
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
# Directories that hold a node's GPU device files among others: the symlinks of every char
# device, and the GPU Operator's driver root. `/var/run` is `/run` on the node.
DEVICE_DIRS = (("dev", "char"), ("run", "nvidia", "driver", "dev"))
# Why each kind of hostPath is refused (guard.devHostPath, guard.deviceDirHostPath).
GPU_DEVICES = (
    "exposes the node's GPU devices outside the pod's resources; ask for GPUs in resources instead"
)
DEVICE_DIR = (
    "holds the node's GPU device files (/dev/char, /run/nvidia/driver/dev) among others, "
    "outside the pod's resources; mount a narrower path, or ask for GPUs in resources"
)


def device_list_mounts(container: ContainerView) -> Iterator[Violation]:
    """Yield a violation for each mount the toolkit would read as a device list."""
    for index, mount in enumerate(container.volume_mounts):
        path = mapping(mount).get("mountPath")
        if isinstance(path, str) and _names_device_list(path):
            yield Violation(
                place_of(container),
                f"volumeMounts[{index}].mountPath={shown_value(path)}",
                "names GPUs to the NVIDIA Container Toolkit's volume-mounts device list, "
                "which gives them to the container outside its resources; mount it elsewhere, "
                "or ask for GPUs in resources",
            )


def _names_device_list(path: str) -> bool:
    """Tell whether a mount path, cleaned as the toolkit cleans it, starts with its root.

    A relative path is taken from `/`, which the runtime would resolve it against or refuse.
    """
    return ("/" + "/".join(_parts(path))).startswith(DEVICE_LIST_ROOT)


def host_path_violations(pod: PodView, guard: Guard) -> list[Violation]:
    """Return a violation for each hostPath volume that holds the node's GPU device files."""
    found = []
    for index, volume in enumerate(pod.volumes):
        path = mapping(mapping(volume).get("hostPath")).get("path")
        if not isinstance(path, str):
            continue
        if guard.dev_host_path and _under_dev_nvidia(path):
            found.append((index, mapping(volume).get("name"), path, GPU_DEVICES))
        elif guard.device_dir_host_path and _holds_device_dir(path):
            found.append((index, mapping(volume).get("name"), path, DEVICE_DIR))
    if not found:
        return []
    mounts = _mounting_containers(pod, {name for _, name, _, _ in found if isinstance(name, str)})
    violations = []
    for index, name, path, reason in found:
        where = f'volume "{shown_value(name)}"'
        if isinstance(name, str) and (mounters := mounts.get(name)):
            where += f" (mounted by {', '.join(mounters[:3])})"
        violations.append(
            Violation(where, f"volumes[{index}].hostPath.path={shown_value(path)}", reason)
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


def _mounting_containers(pod: PodView, volumes: set[str]) -> dict[str, list[str]]:
    """Return, for each of the volumes, the containers that mount it."""
    mounters: dict[str, list[str]] = {}
    for container in pod.all_containers:
        for mount in container.volume_mounts:
            name = mapping(mount).get("name")
            if isinstance(name, str) and name in volumes:
                mounters.setdefault(name, []).append(place_of(container))
    return mounters
