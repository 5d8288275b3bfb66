"""Fake GPU nodes, made through the API as each GPU stack would show them to a scheduler.

There is no kubelet: a node is only its API object. What a scheduler reads of a real GPU node
is written here as the stacks write it: GPU Feature Discovery's labels, the extended resources
each device plugin advertises, and the device registrations HAMi and Volcano keep in node
annotations. A table of pools says which nodes a cluster has.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.device_matching import hami_device_type, volcano_device_type

Stack = Literal[
    "nvidia",
    "hami",
    "gpu-manager",
    "mig",
    "gpushare",
    "time-slicing",
    "volcano",
    "qgpu",
    "cgpu",
    "mgpu",
    "elastic-gpu",
]
STACKS: tuple[Stack, ...] = get_args(Stack)

# The deviceSplitCount both HAMi and Volcano default to: pods that may share one GPU.
SPLIT_COUNT = 10
# Replicas per GPU in the device plugin's time-slicing config: turns, not fractions.
TIME_SLICES = 4
# How each GPU of a MIG node is cut (mixed strategy): 2 + 2 + 3 of the A100's 7 slices.
MIG_LAYOUT = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
# What every node has besides GPUs: more than any test pod asks for.
BASE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110"}
# TKE counts qGPU memory in "G"; gpuadm's qgpu preset reads one as 10^9 bytes (docs/backends.md).
QGPU_MEMORY_UNIT = 10**9
# GPU pools are often tainted so that only pods that tolerate GPUs go there.
GPU_TAINT: Mapping[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

HAMI_REGISTER = "hami.io/node-nvidia-register"
VOLCANO_REGISTER = "volcano.sh/node-vgpu-register"
VOLCANO_HANDSHAKE = "volcano.sh/node-vgpu-handshake"


@dataclass(frozen=True)
class Gpu:
    """A GPU model: its name as the driver reports it, and its memory in MiB."""

    name: str
    memory_mib: int

    @property
    def product_label(self) -> str:
        """Return the name as GPU Feature Discovery spells it in ``nvidia.com/gpu.product``."""
        return self.name.replace(" ", "-")


A100_SXM = Gpu("NVIDIA A100-SXM4-80GB", 81920)
A100_PCIE = Gpu("NVIDIA A100 80GB PCIe", 81920)
H100 = Gpu("NVIDIA H100 80GB HBM3", 81559)
A10 = Gpu("NVIDIA A10", 23028)
L4 = Gpu("NVIDIA L4", 23034)
T4 = Gpu("Tesla T4", 15360)
V100 = Gpu("Tesla V100-SXM2-16GB", 16384)


@dataclass(frozen=True)
class Pool:
    """Nodes alike: their GPUs, the stack that shares them out, and the class they serve.

    ``stack`` is the GPU stack the nodes run. With ``every_stack`` they also advertise every
    other stack's resources and registrations, so that any GPU pod fits on them by resources
    alone: a pod that still lands only in its own class's pools got there by node affinity.
    Where two stacks name the same resource (``nvidia.com/gpu``), ``stack``'s count stands.
    """

    name: str
    gpu_class: str | None
    gpu: Gpu | None = None
    stack: Stack | None = None
    size: int = 1
    gpus_per_node: int = 4
    every_stack: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()

    @property
    def node_names(self) -> list[str]:
        """Return the names of the pool's nodes."""
        return [f"{self.name}-{index}" for index in range(self.size)]

    @property
    def stacks(self) -> tuple[Stack, ...]:
        """Return the stacks whose resources the nodes advertise, their own first."""
        if self.stack is None:
            return ()
        others = (s for s in STACKS if s != self.stack) if self.every_stack else ()
        return (self.stack, *others)


# One pool per class of tests.builders.POLICY_YAML, and CPU-only nodes. The a100 class has
# two pools, one per model it lists, and two nodes in one so that a user's own node affinity
# has a choice within the class. MIG nodes run NVIDIA's plugin alone: a MIG A100 carries the
# same gpu.product as a whole one, and in a real cluster only its resources (and HAMi's
# registry, which holds no MIG device) keep HAMi pods off it.
TEST_POOLS = (
    Pool("a100-sxm", "a100", A100_SXM, "hami", size=2, every_stack=True),
    Pool("a100-pcie", "a100", A100_PCIE, "hami", every_stack=True),
    Pool(
        "t4",
        "t4",
        T4,
        "gpu-manager",
        every_stack=True,
        labels={"gaia.tencent.com/gpu-model": "Tesla-T4"},
    ),
    Pool("h100", "h100", H100, "nvidia", every_stack=True),
    Pool("a100-mig", "a100-mig", A100_SXM, "mig"),
    Pool("v100", "v100", V100, "gpushare", every_stack=True, labels={"gpushare": "true"}),
    Pool("l4", "l4", L4, "time-slicing", every_stack=True, taints=(GPU_TAINT,)),
    Pool("a10", "a10", A10, "volcano", every_stack=True),
    Pool("cpu", None),
)

# One pool per class of PRESET_POLICY_YAML (tests/e2e/test_more_stacks.py), labelled as each
# stack labels its nodes. Each also advertises every other stack's resources, so only the
# class's nodeSelector keeps a pod in its own pool.
PRESET_POOLS = (
    Pool(
        "t4-qgpu",
        "t4-qgpu",
        T4,
        "qgpu",
        every_stack=True,
        labels={"qgpu-device-enable": "enable"},
    ),
    Pool(
        "v100-cgpu",
        "v100-cgpu",
        V100,
        "cgpu",
        every_stack=True,
        labels={"ack.node.gpu.schedule": "core_mem"},
    ),
    Pool(
        "a10-mgpu",
        "a10-mgpu",
        A10,
        "mgpu",
        every_stack=True,
        labels={"vke.node.gpu.schedule": "mgpu"},
    ),
    Pool(
        "l4-egpu",
        "l4-egpu",
        L4,
        "elastic-gpu",
        every_stack=True,
        labels={"elastic-gpu": "true"},
    ),
)

# One pool per class of KAI_POLICY_YAML (tests/e2e/test_kai.py). KAI schedules the GPUs that
# NVIDIA's device plugin advertises, on nodes labelled by GPU Feature Discovery (it sizes a
# share from `nvidia.com/gpu.memory`). Each also advertises every other stack's resources, so
# only the class's models keep a pod in its own pool.
KAI_POOLS = (
    Pool("a100-kai", "a100-kai", A100_SXM, "nvidia", every_stack=True),
    Pool("h100-kai", "h100-kai", H100, "nvidia", every_stack=True),
)

# One pool per class of examples/policy.yaml, as `make dev-cluster` shows them, each running
# its own stack only.
EXAMPLE_POOLS = (
    Pool("a100", "a100", A100_SXM, "hami", size=2),
    Pool("t4", "t4", T4, "gpu-manager", labels={"gaia.tencent.com/gpu-model": "Tesla-T4"}),
    Pool("h100", "h100", H100, "nvidia"),
    Pool("a100-mig", "a100-mig", A100_SXM, "mig"),
    Pool("cpu", None),
)


def nodes_of(pools: Sequence[Pool], gpu_class: str) -> set[str]:
    """Return the names of the nodes that serve ``gpu_class``."""
    return {name for pool in pools if pool.gpu_class == gpu_class for name in pool.node_names}


def fits_outside(pools: Sequence[Pool], requests: Mapping[str, str], gpu_class: str) -> bool:
    """Tell whether an untainted node of ``pools`` serving another class has room for ``requests``.

    Were there none, a pod landing in its class would show resource fit, not the class.
    """
    return any(
        all(node_resources(pool).get(key, 0) >= int(value) for key, value in requests.items())
        for pool in pools
        if pool.gpu_class not in (gpu_class, None) and not pool.taints
    )


def hostname_affinity(*nodes: str) -> dict[str, Any]:
    """Return the pod spec fields that require one of ``nodes``, as a user would write them."""
    choice = {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}
    terms = {"nodeSelectorTerms": [{"matchExpressions": [choice]}]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}}


def create_pools(core: kubernetes.client.CoreV1Api, pools: Sequence[Pool]) -> list[str]:
    """Create every node of ``pools``; return their names in the order they were written."""
    created = []
    for pool in pools:
        for name in pool.node_names:
            create_node(core, pool, name)
            created.append(name)
    return created


@contextlib.contextmanager
def pools_created(core: kubernetes.client.CoreV1Api, pools: Sequence[Pool]) -> Iterator[list[str]]:
    """Create every node of ``pools``, yield their names as written, and delete them after."""
    try:
        yield create_pools(core, pools)
    finally:
        for pool in pools:
            for name in pool.node_names:
                with contextlib.suppress(ApiException):
                    core.delete_node(name)


def create_node(core: kubernetes.client.CoreV1Api, pool: Pool, name: str) -> None:
    """Create one node of ``pool`` that the scheduler treats as ready."""
    labels, annotations = node_labels(pool, name), device_registrations(pool, name)
    metadata = {"name": name, "labels": labels, "annotations": annotations}
    core.create_node({"metadata": metadata})
    # The apiserver's TaintNodesByCondition plugin gives every new node the not-ready taint,
    # which the node lifecycle controller lifts once a kubelet reports; neither runs here.
    core.patch_node(name, {"spec": {"taints": [dict(taint) for taint in pool.taints]}})
    capacity = {**BASE_CAPACITY, **{k: str(v) for k, v in node_resources(pool).items()}}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node"}
    # kube-scheduler does not read the Ready condition (the taint stands for it), but
    # `kubectl get nodes` shows it.
    status = {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}
    core.patch_node_status(name, {"status": status})


def node_labels(pool: Pool, name: str) -> dict[str, str]:
    """Return a node's labels: the kubelet's, GPU Feature Discovery's, and the pool's own."""
    found = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if pool.gpu is not None:
        found |= feature_discovery_labels(pool.gpu, pool.gpus_per_node, pool.stack)
    return found | dict(pool.labels)


def feature_discovery_labels(gpu: Gpu, count: int, stack: Stack | None) -> dict[str, str]:
    """Return the labels GPU Feature Discovery puts on a node with ``count`` GPUs.

    Following NVIDIA/k8s-device-plugin internal/lm (resource.go, mig-strategy.go): a MIG node
    keeps its GPU's product name and adds ``mig.strategy``; time-slicing with a renamed
    resource (``nvidia.com/gpu.shared``) keeps the product name too and counts the replicas.
    """
    replicas = {"mig": 0, "time-slicing": TIME_SLICES}.get(stack or "", 1)
    found = {
        "nvidia.com/gpu.product": gpu.product_label,
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
    }
    if stack == "mig":
        found["nvidia.com/mig.strategy"] = "mixed"
    return found


def node_resources(pool: Pool) -> dict[str, int]:
    """Return the extended resources a node of ``pool`` advertises."""
    found: dict[str, int] = {}
    if pool.gpu is None:
        return found
    for stack in reversed(pool.stacks):
        found |= stack_resources(stack, pool.gpu, pool.gpus_per_node)
    return found


def stack_resources(stack: Stack, gpu: Gpu, count: int) -> dict[str, int]:
    """Return what one stack's device plugin advertises for ``count`` GPUs of a model."""
    memory = gpu.memory_mib * count
    match stack:
        case "nvidia":
            return {"nvidia.com/gpu": count}
        case "hami":
            # HAMi's own scheduler checks cores and memory against the devices it registered;
            # kube-scheduler, standing in for it, checks node resources only.
            return {
                "nvidia.com/gpu": count * SPLIT_COUNT,
                "nvidia.com/gpucores": count * 100,
                "nvidia.com/gpumem": memory,
            }
        case "gpu-manager":
            return {
                "tencent.com/vcuda-core": count * 100,
                "tencent.com/vcuda-memory": memory // 256,
            }
        case "mig":
            return {f"nvidia.com/mig-{p}": n * count for p, n in MIG_LAYOUT.items()}
        case "gpushare":
            return {"aliyun.com/gpu-mem": memory // 1024, "aliyun.com/gpu-count": count}
        case "time-slicing":
            return {"nvidia.com/gpu.shared": count * TIME_SLICES}
        case "volcano":
            return {
                "volcano.sh/vgpu-number": count * SPLIT_COUNT,
                "volcano.sh/vgpu-cores": count * 100,
                "volcano.sh/vgpu-memory": memory,
            }
        case "qgpu":
            # Whole units per GPU: a unit cannot span two cards.
            units = gpu.memory_mib * 2**20 // QGPU_MEMORY_UNIT
            return {
                "tke.cloud.tencent.com/qgpu-core": count * 100,
                "tke.cloud.tencent.com/qgpu-memory": units * count,
            }
        case "cgpu":
            # The same device plugin as gpushare's counts GiB; compute is percent of a GPU.
            return {
                "aliyun.com/gpu-mem": memory // 1024,
                "aliyun.com/gpu-core.percentage": count * 100,
            }
        case "mgpu":
            return {
                "vke.volcengine.com/mgpu-core": count * 100,
                "vke.volcengine.com/mgpu-memory": memory,
            }
        case "elastic-gpu":
            # elastic-gpu-agent advertises a device per percent of a GPU and per MiB.
            return {"elasticgpu.com/gpu-core": count * 100, "elasticgpu.com/gpu-memory": memory}


def device_registrations(pool: Pool, name: str) -> dict[str, str]:
    """Return the device registrations HAMi and Volcano would keep on a node of ``pool``."""
    found: dict[str, str] = {}
    if pool.gpu is None:
        return found
    uuids = [
        f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{i}.{name}')}" for i in range(pool.gpus_per_node)
    ]
    if "hami" in pool.stacks:
        found[HAMI_REGISTER] = hami_registration(pool.gpu, uuids)
    if "volcano" in pool.stacks:
        found |= volcano_registration(pool.gpu, uuids)
    return found


def hami_registration(gpu: Gpu, uuids: Sequence[str]) -> str:
    """Return ``hami.io/node-nvidia-register`` as HAMi's device plugin writes it since v2.8.

    A JSON list of ``DeviceInfo`` (Project-HAMi/HAMi: pkg/device/devices.go, written by
    pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go).
    """
    devices: list[dict[str, Any]] = [
        {
            "id": device,
            "index": index,
            "count": SPLIT_COUNT,
            "devmem": gpu.memory_mib,
            "devcore": 100,
            "type": hami_device_type(gpu.name),
            "numa": 0,
            "mode": "hami-core",
            "health": True,
        }
        for index, device in enumerate(uuids)
    ]
    # Every field is `omitempty` in Go: zeros (index 0, NUMA node 0) are left out.
    return json.dumps([{k: v for k, v in device.items() if v} for device in devices])


def volcano_registration(gpu: Gpu, uuids: Sequence[str]) -> dict[str, str]:
    """Return Volcano's vGPU registration of a node's GPUs and its handshake annotation.

    Each GPU is ``id,count,memory MiB,type,health,mode:`` (Project-HAMi/volcano-vgpu-device-plugin:
    pkg/plugin/vgpu/register.go, and ``EncodeNodeDevices`` in pkg/plugin/vgpu/util/util.go).
    Volcano's scheduler reads them with ``decodeNodeDevices`` and skips a node that lacks
    the handshake (volcano-sh/volcano: pkg/scheduler/api/devices/nvidia/vgpu/utils.go and
    device_info.go; the names are in pkg/scheduler/api/devices/config).
    """
    devices = "".join(
        f"{device},{SPLIT_COUNT},{gpu.memory_mib},{volcano_device_type(gpu.name)},true,hami-core:"
        for device in uuids
    )
    reported = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
    return {VOLCANO_REGISTER: devices, VOLCANO_HANDSHAKE: f"Reported {reported}"}
