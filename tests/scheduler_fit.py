"""How each GPU stack's scheduler fits shares onto one GPU, as executable rules.

Written from the stacks' own code (docs/backends.md, "N shares of 1/N on one GPU", names each
file and line), and on purpose apart from `policies`, so that tests can check what gpuadm
writes against what the stacks would do with it. Each rule reads the pods as gpuadm stores
them and returns, per dimension the stack counts, what the pods use of one GPU and what the
GPU holds:

- HAMi registers a GPU's memory as NVML's total in MiB, 100 cores, and `deviceSplitCount`
  (10 in its chart) pods at most; it fits cores and MiB exactly (`pkg/device/nvidia/device.go`).
- Volcano's vGPU does the same under its own names (`pkg/scheduler/api/devices/nvidia/vgpu/
  utils.go`), with the device plugin's `gpuMemoryFactor` of 1 and `deviceSplitCount` of 10 (its
  chart's).
- gpu-manager advertises NVML's total in blocks of 256 MiB, rounded down, and its extender
  (tkestack/gpu-admission) fits cores of 100 and blocks exactly.
- gpushare advertises NVML's MiB / 1024, rounded down, in GiB, and its extender fits GiB
  exactly; cGPU takes the same `aliyun.com/gpu-mem`, and a percentage of 100.
- KAI takes a GPU's memory from the node label `nvidia.com/gpu.memory` (NVML's MiB), rounded
  down to a multiple of 100. A `gpu-fraction` f takes `int64(f * that)` MiB of it, a
  `gpu-memory` its MiB, and a GPU holds shares while their MiB fit. A queue counts each share
  as its MiB over that memory, rounded up to a hundredth (`getGpuMemoryFractionalOnNode`), and
  a fraction also as itself rounded to the nearest hundredth (`getExtendedResourceGpus`).
- The declared stacks (qGPU, cGPU, mGPU, Elastic GPU, `extended`) fit compute of one GPU's
  worth and memory units of one GPU's worth, each exactly; mGPU also counts at most 16
  containers on a card.
- Kubernetes' DRA allocator fits the claims on a device while the sum of each capacity they
  consume is at most the device's (`consumable_capacity.go`).

Go's float64 arithmetic is Python's float: KAI's is repeated here as it is done there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MiB = 2**20
GiB = 2**30
HAMI_SPLIT_COUNT = 10
VOLCANO_SPLIT_COUNT = 10
MGPU_CONTAINERS_PER_CARD = 16
GPU_MANAGER_BLOCK = 256 * MiB

Usage = dict[str, tuple[int, int]]


def fits(usage: Usage) -> bool:
    """Tell whether every dimension a stack counts holds what the pods use."""
    return all(used <= holds for used, holds in usage.values())


def _limits(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        (container.get("resources") or {}).get("limits") or {}
        for container in pod["spec"]["containers"]
    ]


def _total(pods: Iterable[Mapping[str, Any]], name: str) -> int:
    return sum(int(limits.get(name, 0)) for pod in pods for limits in _limits(pod))


def vgpu(
    pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction, *, cores: str, memory: str, split: int
) -> Usage:
    """HAMi's and Volcano's vGPU: cores of 100, MiB of NVML's total, `split` pods a GPU."""
    return {
        cores: (_total(pods, cores), 100),
        f"{memory} (MiB)": (_total(pods, memory), math.floor(gpu_bytes / MiB)),
        "pods on the GPU (deviceSplitCount)": (len(pods), split),
    }


def hami(pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
    """HAMi's scheduler on one GPU of `gpu_bytes` (NVML's total)."""
    return vgpu(
        pods,
        gpu_bytes,
        cores="nvidia.com/gpucores",
        memory="nvidia.com/gpumem",
        split=HAMI_SPLIT_COUNT,
    )


def volcano(pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
    """Volcano's vGPU on one GPU of `gpu_bytes` (NVML's total)."""
    return vgpu(
        pods,
        gpu_bytes,
        cores="volcano.sh/vgpu-cores",
        memory="volcano.sh/vgpu-memory",
        split=VOLCANO_SPLIT_COUNT,
    )


def gpu_manager(pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
    """gpu-manager and its extender, gpu-admission, on one GPU of `gpu_bytes`."""
    return {
        "tencent.com/vcuda-core": (_total(pods, "tencent.com/vcuda-core"), 100),
        "tencent.com/vcuda-memory (256Mi blocks)": (
            _total(pods, "tencent.com/vcuda-memory"),
            math.floor(gpu_bytes / GPU_MANAGER_BLOCK),
        ),
    }


def gpushare(pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
    """gpushare's extender on one GPU of `gpu_bytes`, its device plugin counting GiB."""
    gib = math.floor(gpu_bytes / MiB) // 1024
    return {"aliyun.com/gpu-mem (GiB)": (_total(pods, "aliyun.com/gpu-mem"), gib)}


@dataclass(frozen=True)
class Declared:
    """A stack that fits compute and memory units per GPU: qGPU, cGPU, mGPU, Elastic GPU,
    or one declared as `extended`."""

    compute: str | None
    memory: str | None
    compute_per_gpu: int = 100
    memory_unit: Fraction = Fraction(MiB)
    containers_per_gpu: int | None = None

    def usage(self, pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
        """Return what the pods use of one GPU of `gpu_bytes`, and what it holds."""
        usage: Usage = {}
        if self.compute is not None:
            usage[self.compute] = (_total(pods, self.compute), self.compute_per_gpu)
        if self.memory is not None:
            units = math.floor(gpu_bytes / self.memory_unit)
            usage[self.memory] = (_total(pods, self.memory), units)
        if self.containers_per_gpu is not None:
            usage["containers on the card"] = (len(pods), self.containers_per_gpu)
        return usage


QGPU = Declared(
    "tke.cloud.tencent.com/qgpu-core",
    "tke.cloud.tencent.com/qgpu-memory",
    memory_unit=Fraction(10**9),
)
CGPU = Declared("aliyun.com/gpu-core.percentage", "aliyun.com/gpu-mem", 100, Fraction(GiB))
MGPU = Declared(
    "vke.volcengine.com/mgpu-core",
    "vke.volcengine.com/mgpu-memory",
    containers_per_gpu=MGPU_CONTAINERS_PER_CARD,
)
ELASTIC_GPU = Declared("elasticgpu.com/gpu-core", "elasticgpu.com/gpu-memory")


def kai_gpu_memory(gpu_bytes: Fraction) -> int:
    """Return a GPU's memory as KAI counts it: the node label's MiB, down to a multiple of 100."""
    mib = math.floor(gpu_bytes / MiB)
    return mib - mib % 100


def kai(pods: Sequence[Mapping[str, Any]], gpu_bytes: Fraction) -> Usage:
    """KAI's scheduler on one GPU of `gpu_bytes`, and the hundredths its queues count."""
    memory = kai_gpu_memory(gpu_bytes)
    taken = []
    hundredths = 0
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        if "gpu-memory" in annotations:
            taken.append(int(annotations["gpu-memory"]))
        else:
            fraction = float(annotations["gpu-fraction"])
            taken.append(int(fraction * memory))
            # Go's math.Round: halves away from zero.
            hundredths += math.floor(fraction * 100 + 0.5)
    queued = sum(math.ceil(mib / memory * 100) for mib in taken)
    usage = {
        "memory of the GPU (MiB)": (sum(taken), memory),
        "hundredths a queue charges (getGpuMemoryFractionalOnNode)": (queued, 100),
    }
    if hundredths:
        usage["hundredths of gpu-fraction (getExtendedResourceGpus)"] = (hundredths, 100)
    return usage


def dra(templates: Sequence[Mapping[str, Any]], capacity: Mapping[str, Fraction]) -> Usage:
    """Kubernetes' allocator on one device with `capacity`, for claims made from `templates`
    (one a pod), each with no request policy."""
    usage: Usage = {}
    for name, holds in capacity.items():
        used = Fraction(0)
        for template in templates:
            (request,) = template["devices"]["requests"]
            requests = request["exactly"]["capacity"]["requests"]
            used += _quantity(requests[name])
        usage[f"capacity {name}"] = (math.ceil(used), math.floor(holds))
    return usage


_SUFFIXES = {"Gi": GiB, "Mi": MiB, "Ki": 2**10, "G": 10**9, "M": 10**6, "k": 10**3}


def _quantity(text: str) -> Fraction:
    """Read a whole quantity as the templates write it (`27033Mi`, `30`, `2k`)."""
    for suffix, unit in _SUFFIXES.items():
        if text.endswith(suffix):
            return Fraction(text.removesuffix(suffix)) * unit
    return Fraction(text)
