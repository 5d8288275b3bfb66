"""Keep GPU access inside a pod's resources: the rules of the policy's `guard` section.

Quota charges what a pod's resources hold, so a pod must not reach GPUs any other way. It
could: the NVIDIA container runtime hands a container every GPU that `NVIDIA_VISIBLE_DEVICES`
names even when the container asks for none; a hostPath under `/dev/nvidia` or a privileged
container sees the node's GPU devices; a mount under `/var/run/nvidia-container-devices`
names devices to the NVIDIA Container Toolkit's volume-mounts strategy; a hostPath of
`/dev/char` or `/run/nvidia/driver/dev` (or a directory above them) holds the device files
among others; HAMi and Volcano stop holding a share to its size when a container switches
their in-container limiter (HAMi-core) off, with `env` or `envFrom`; their device plugins
give a pod the devices its allocation annotations name; and KAI's share container reads its
GPUs from a ConfigMap in the pod's namespace, which only KAI's binder may write. Each rule is
one key of `guard`, on unless the policy switches it off (docs/configuration.md,
docs/backends.md).

The checks read the pod once, linearly in its size, in one module per idea: `environment`
(env and envFrom), `paths` (hostPath volumes and device-list mounts), `allocation` (the
allocation annotations), each yielding `violations.Violation`s, and `checks`, the entry
points that gather them into one denial. They run beside `plan`, not inside it:
the plan memo is keyed by exactly what `plan` reads (`memo_key`), which leaves env,
volumes and security contexts out.
"""

from policies.access.guard.allocation import ALLOCATION_ANNOTATIONS
from policies.access.guard.checks import (
    check_added_containers,
    check_allocation_update,
    check_devices_config_map,
    check_guard,
)

__all__ = [
    "ALLOCATION_ANNOTATIONS",
    "check_added_containers",
    "check_allocation_update",
    "check_devices_config_map",
    "check_guard",
]
