"""A policy against the cluster's GPU nodes as their stacks label and register them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies import load_policy
from policies.cluster_fit import GpuNode, cluster_fit, gpu_node

POLICY = """\
classes:
  a100: {backend: hami, memory: 80Gi, models: [NVIDIA A100-SXM4-80GB]}
  h200: {backend: hami, memory: 141Gi, models: [NVIDIA H200]}
  t4: {backend: nvidia, models: [Tesla T4]}
  a100-mig:
    backend: mig
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
    profiles: {1g.10gb: 10Gi, 3g.40gb: 40Gi}
    nodeSelector: {nvidia.com/mig.strategy: [mixed]}
"""


def node(
    name: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        # What NVIDIA's device plugin (and HAMi's, beside it) advertise, unless given.
        "status": {
            "allocatable": {
                "cpu": "8",
                **({"nvidia.com/gpu": "8"} if allocatable is None else allocatable),
            }
        },
    }


def gfd(product: str, memory: int, *, mig: bool = False) -> dict[str, str]:
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory),
        "nvidia.com/gpu.count": "8",
    }
    return {**labels, "nvidia.com/mig.strategy": "mixed"} if mig else labels


def hami(memory: int, gpus: int = 2) -> dict[str, str]:
    devices = [
        {"id": f"GPU-{i}", "count": 10, "devmem": memory, "devcore": 100} for i in range(gpus)
    ]
    return {"hami.io/node-nvidia-register": json.dumps(devices)}


def test_a_node_is_read_as_its_stacks_describe_it() -> None:
    read = gpu_node(
        node(
            "n1",
            gfd("NVIDIA-A100-SXM4-80GB-SHARED", 81920),
            hami(81000),
            {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "0"},
        )
    )
    assert read is not None
    assert (read.product, read.memory_mib, read.gpus) == ("NVIDIA-A100-SXM4-80GB", 81000, 8)
    assert read.mig_profiles == {"1g.10gb"}


@pytest.mark.parametrize(
    "annotations",
    [
        pytest.param({}, id="none"),
        pytest.param({"hami.io/node-nvidia-register": "GPU-0,10,81920,100,NVIDIA:"}, id="old-form"),
        pytest.param({"hami.io/node-nvidia-register": "[" * 100_000}, id="not-json"),
        pytest.param({"hami.io/node-nvidia-register": "x" * 300_000}, id="too-large"),
    ],
)
def test_a_node_no_stack_describes_is_no_gpu_node(annotations: dict[str, str]) -> None:
    assert gpu_node(node("cpu", {"kubernetes.io/os": "linux"}, annotations, {})) is None


def nodes(*found: dict[str, Any]) -> list[GpuNode]:
    return [n for n in map(gpu_node, found) if n is not None]


def test_each_class_reaches_the_nodes_of_its_models_and_selector() -> None:
    fit = cluster_fit(
        load_policy(POLICY),
        nodes(
            node("a1", gfd("NVIDIA-A100-SXM4-80GB", 81920)),
            node(
                "m1",
                gfd("NVIDIA-A100-SXM4-80GB", 81920, mig=True),
                allocatable={
                    "nvidia.com/gpu": "8",
                    "nvidia.com/mig-1g.10gb": "14",
                    "nvidia.com/mig-3g.40gb": "2",
                },
            ),
            node("h1", gfd("NVIDIA-H200", 143771)),
            node("t1", gfd("Tesla-T4", 15360)),
        ),
    )
    assert fit.by_class == {
        "a100": ["a1", "m1"],
        "a100-mig": ["m1"],
        "h200": ["h1"],
        "t4": ["t1"],
    }
    assert fit.by_model["NVIDIA-A100-SXM4-80GB"] == {
        "nodes": ["a1", "m1"],
        "gpus": 16,
        "memoryMiB": 81920,
        "classes": ["a100", "a100-mig"],
    }
    # The H200 nodes report less than the class's 141Gi.
    assert fit.findings == [
        "class h200: memory 141Gi is more than its nodes report (143771Mi per GPU on h1, "
        "NVIDIA-H200): two halves never share one of those GPUs"
    ]


def test_what_no_node_has_and_what_no_class_reaches_are_said() -> None:
    fit = cluster_fit(
        load_policy(POLICY),
        nodes(
            node(
                "m1",
                gfd("NVIDIA-A100-SXM4-80GB", 81920, mig=True),
                allocatable={"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "7"},
            ),
            *(node(f"l{i}", gfd("NVIDIA-L4", 23034)) for i in range(5)),
        ),
    )
    assert fit.findings == [
        "class a100-mig: no node of the class offers MIG profile 3g.40gb (they offer: 1g.10gb)",
        "class h200: no node has its GPUs (nvidia.com/gpu.product in NVIDIA-H200): its pods "
        "never run",
        "class t4: no node has its GPUs (nvidia.com/gpu.product in Tesla-T4): its pods never run",
        "5 nodes of NVIDIA-L4 (l0, l1, l2 and 2 more): no class reaches them, so their GPUs "
        "serve no pod gpuadm rewrites",
    ]


def test_a_class_of_several_models_misses_the_one_no_node_has() -> None:
    policy = load_policy(
        "classes:\n  a100: {backend: hami, memory: 80Gi, "
        "models: [NVIDIA A100-SXM4-80GB, NVIDIA A100 80GB PCIe]}\n"
    )
    fit = cluster_fit(policy, nodes(node("a1", gfd("NVIDIA-A100-SXM4-80GB", 81920))))
    assert fit.findings == [
        "class a100: no node has NVIDIA A100 80GB PCIe "
        "(nvidia.com/gpu.product=NVIDIA-A100-80GB-PCIe)"
    ]


def test_memory_as_its_nodes_report_it_exactly_is_fine() -> None:
    policy = load_policy(
        "classes:\n  h200: {backend: hami, memory: 143771Mi, models: [NVIDIA H200]}\n"
    )
    fit = cluster_fit(policy, nodes(node("h1", gfd("NVIDIA-H200", 143771), hami(143771))))
    assert fit.findings == []


def test_a_node_its_stack_does_not_label_is_known_by_the_resources_it_advertises() -> None:
    policy = load_policy(
        "classes:\n  t4:\n    backend: gpu-manager\n    memory: 16Gi\n"
        "    nodeSelector: {gaia.tencent.com/gpu-model: [Tesla-T4]}\n"
    )
    tencent = node(
        "t1",
        {"gaia.tencent.com/gpu-model": "Tesla-T4"},
        allocatable={"tencent.com/vcuda-core": "400", "tencent.com/vcuda-memory": "64"},
    )
    rdma = node("r1", allocatable={"rdma/hca": "1"})
    fit = cluster_fit(policy, nodes(tencent, rdma))
    assert fit.by_class == {"t4": ["t1"]}
    # A node of another device plugin's resources is no GPU node: nothing is said of it.
    assert fit.findings == []
