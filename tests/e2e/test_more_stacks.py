"""The presets of `extended` through a real apiserver and kube-scheduler: qGPU, cGPU, mGPU and
Elastic GPU pods are stored with their stack's resources and bound in their class's pool."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.e2e.fixtures import Deployment, serving_on_pools
from tests.e2e.nodes import PRESET_POOLS, fits_outside, nodes_of
from tests.e2e.scheduling import Scheduler

# One class per preset, with the node labels each stack puts on its nodes (docs/backends.md).
PRESET_POLICY_YAML = """
domain: gpuadm.io
defaultClass: t4-qgpu
exemptNamespaces: [kube-system]
classes:
  t4-qgpu:
    backend: qgpu
    memory: 16G
    nodeSelector: {qgpu-device-enable: [enable]}
  v100-cgpu:
    backend: cgpu
    memory: 16Gi
    nodeSelector: {ack.node.gpu.schedule: [core_mem]}
  a10-mgpu:
    backend: mgpu
    memory: 22Gi
    nodeSelector: {vke.node.gpu.schedule: [mgpu]}
  l4-egpu:
    backend: elastic-gpu
    memory: 22Gi
    nodeSelector: {elastic-gpu: ["true"]}
"""

QGPU_CORE = "tke.cloud.tencent.com/qgpu-core"
QGPU_MEMORY = "tke.cloud.tencent.com/qgpu-memory"
CGPU_MEMORY = "aliyun.com/gpu-mem"
CGPU_CORE = "aliyun.com/gpu-core.percentage"
MGPU_CORE = "vke.volcengine.com/mgpu-core"
MGPU_MEMORY = "vke.volcengine.com/mgpu-memory"
EGPU_CORE = "elasticgpu.com/gpu-core"
EGPU_MEMORY = "elasticgpu.com/gpu-memory"

pytestmark = pytest.mark.usefixtures("preset_cluster")


@pytest.fixture(scope="module")
def preset_cluster(
    gpuadm: Deployment, core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler
) -> Iterator[None]:
    """Serve the preset policy on its pools for this module; then the test policy again."""
    with serving_on_pools(gpuadm, core_v1, scheduler, PRESET_POLICY_YAML, PRESET_POOLS):
        yield


# Each `raw` pod asks for its stack's own resources and names its class. It reaches gpuadm only
# because the webhooks' matchConditions list those resources: unrouted, it would be stored with
# no gpuadm label, and nothing would keep it out of the other pools.
@pytest.mark.parametrize(
    ("gpu_class", "limits", "annotations", "stored"),
    [
        pytest.param(
            "t4-qgpu", {"gpuadm.io/t4-qgpu": "1"}, {}, {QGPU_CORE: "100"}, id="qgpu-whole"
        ),
        pytest.param(
            "t4-qgpu",
            {"gpuadm.io/t4-qgpu": "0.5"},
            {},
            {QGPU_CORE: "50", QGPU_MEMORY: "8"},
            id="qgpu-share",
        ),
        # 4Gi is 4.29G: four units of 1G, and 26.8 percent of the GPU, down to a step of 5.
        pytest.param(
            "t4-qgpu",
            {"gpuadm.io/t4-qgpu-memory": "4Gi"},
            {},
            {QGPU_CORE: "25", QGPU_MEMORY: "4"},
            id="qgpu-memory",
        ),
        pytest.param(
            "t4-qgpu",
            {QGPU_CORE: "50", QGPU_MEMORY: "8"},
            {"gpuadm.io/class": "t4-qgpu"},
            {QGPU_CORE: "50", QGPU_MEMORY: "8"},
            id="qgpu-raw",
        ),
        pytest.param(
            "v100-cgpu",
            {"gpuadm.io/v100-cgpu": "1"},
            {},
            {CGPU_MEMORY: "16", CGPU_CORE: "100"},
            id="cgpu-whole",
        ),
        pytest.param(
            "v100-cgpu",
            {"gpuadm.io/v100-cgpu": "0.5"},
            {},
            {CGPU_MEMORY: "8", CGPU_CORE: "50"},
            id="cgpu-share",
        ),
        pytest.param(
            "v100-cgpu",
            {"gpuadm.io/v100-cgpu-memory": "4Gi"},
            {},
            {CGPU_MEMORY: "4", CGPU_CORE: "25"},
            id="cgpu-memory",
        ),
        pytest.param(
            "v100-cgpu",
            {CGPU_MEMORY: "4", CGPU_CORE: "30"},
            {"gpuadm.io/class": "v100-cgpu"},
            {CGPU_MEMORY: "4", CGPU_CORE: "30"},
            id="cgpu-raw",
        ),
        pytest.param(
            "a10-mgpu", {"gpuadm.io/a10-mgpu": "1"}, {}, {MGPU_CORE: "100"}, id="mgpu-whole"
        ),
        pytest.param(
            "a10-mgpu",
            {"gpuadm.io/a10-mgpu": "0.5"},
            {},
            {MGPU_CORE: "50", MGPU_MEMORY: "11264"},
            id="mgpu-share",
        ),
        pytest.param(
            "a10-mgpu",
            {"gpuadm.io/a10-mgpu-memory": "4Gi"},
            {},
            {MGPU_CORE: "18", MGPU_MEMORY: "4096"},
            id="mgpu-memory",
        ),
        pytest.param(
            "a10-mgpu",
            {MGPU_CORE: "25", MGPU_MEMORY: "4096"},
            {"gpuadm.io/class": "a10-mgpu"},
            {MGPU_CORE: "25", MGPU_MEMORY: "4096"},
            id="mgpu-raw",
        ),
        pytest.param(
            "l4-egpu", {"gpuadm.io/l4-egpu": "1"}, {}, {EGPU_CORE: "100"}, id="egpu-whole"
        ),
        pytest.param(
            "l4-egpu",
            {"gpuadm.io/l4-egpu": "0.5"},
            {},
            {EGPU_CORE: "50", EGPU_MEMORY: "11264"},
            id="egpu-share",
        ),
        pytest.param(
            "l4-egpu",
            {"gpuadm.io/l4-egpu-memory": "4Gi"},
            {},
            {EGPU_CORE: "18", EGPU_MEMORY: "4096"},
            id="egpu-memory",
        ),
        pytest.param(
            "l4-egpu",
            {EGPU_CORE: "25", EGPU_MEMORY: "4096"},
            {"gpuadm.io/class": "l4-egpu"},
            {EGPU_CORE: "25", EGPU_MEMORY: "4096"},
            id="egpu-raw",
        ),
    ],
)
def test_a_preset_pod_is_stored_with_its_stacks_resources_and_bound_in_its_pool(
    gpuadm: Deployment,
    scheduler: Scheduler,
    namespace: str,
    gpu_class: str,
    limits: dict[str, str],
    annotations: dict[str, str],
    stored: dict[str, str],
) -> None:
    pod = gpuadm.create_pod(namespace, limits, annotations=annotations)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"limits": stored, "requests": stored}
    labels = pod["metadata"].get("labels", {})
    assert labels.get("gpuadm.io/class") == gpu_class, "gpuadm did not mutate the pod"
    # mGPU is a device of Volcano's scheduler; the other three leave the scheduler name alone.
    expected_scheduler = "volcano" if gpu_class == "a10-mgpu" else "default-scheduler"
    assert pod["spec"]["schedulerName"] == expected_scheduler
    assert fits_outside(PRESET_POOLS, stored, gpu_class)
    node = scheduler.node_of(namespace, pod["metadata"]["name"])
    assert node in nodes_of(PRESET_POOLS, gpu_class)
