"""A real kube-apiserver calls gpuadm: what it stores, and what it answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.fixtures import Deployment


def gpu_affinity(stored: dict[str, Any]) -> list[dict[str, Any]]:
    required = stored["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    return list(required["nodeSelectorTerms"])


@pytest.mark.parametrize(
    ("limits", "resources", "scheduler", "selector"),
    [
        pytest.param(
            {"gpuadm.io/a100": "0.5"},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40960"},
            "hami-scheduler",
            "nvidia.com/gpu.product",
            id="hami-share",
        ),
        pytest.param(
            {"gpuadm.io/t4": "2"},
            {"tencent.com/vcuda-core": "200"},
            "default-scheduler",
            "gaia.tencent.com/gpu-model",
            id="gpu-manager-whole",
        ),
        pytest.param(
            {"gpuadm.io/t4": "250m"},
            {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"},
            "default-scheduler",
            "gaia.tencent.com/gpu-model",
            id="gpu-manager-share",
        ),
        pytest.param(
            {"gpuadm.io/h100": "1"},
            {"nvidia.com/gpu": "1"},
            "default-scheduler",
            "nvidia.com/gpu.product",
            id="nvidia-whole",
        ),
        pytest.param(
            {"gpuadm.io/a100-mig-memory": "15Gi"},
            {"nvidia.com/mig-2g.20gb": "1"},
            "default-scheduler",
            "nvidia.com/mig.strategy",
            id="mig-memory",
        ),
        pytest.param(
            {"gpuadm.io/a10": "0.5"},
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-cores": "50",
                "volcano.sh/vgpu-memory": "12288",
            },
            "volcano",
            "nvidia.com/gpu.product",
            id="volcano-share",
        ),
        pytest.param(
            {"gpuadm.io/a100": "1", "gpuadm.io/a100-memory": "40Gi"},
            # 100 cores: HAMi gives a pod that names its memory its GPU alone only with them.
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "100"},
            "hami-scheduler",
            "nvidia.com/gpu.product",
            id="hami-whole-with-memory-cap",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"tencent.com/vcuda-core": "100"},
            "default-scheduler",
            "gaia.tencent.com/gpu-model",
            id="untyped-gpu-default-class",
        ),
    ],
)
def test_the_stored_pod_is_rewritten_for_its_backend(
    gpuadm: Deployment,
    namespace: str,
    limits: dict[str, str],
    resources: dict[str, str],
    scheduler: str,
    selector: str,
) -> None:
    created = gpuadm.create_pod(namespace, limits)
    stored = gpuadm.core.read_namespaced_pod(
        created["metadata"]["name"], namespace, _preload_content=False
    )
    pod = json.loads(stored.data)
    container = pod["spec"]["containers"][0]["resources"]
    assert container["limits"] == resources
    assert container["requests"] == resources
    assert pod["spec"]["schedulerName"] == scheduler
    terms = gpu_affinity(pod)
    assert [e["key"] for e in terms[0]["matchExpressions"]] == [selector]
    class_name = pod["metadata"]["labels"]["gpuadm.io/class"]
    assert pod["metadata"]["annotations"]["gpuadm.io/class"] == class_name
    assert pod["metadata"]["annotations"]["gpuadm.io/demand"].startswith(f"{class_name}=")
    assert pod["status"]["phase"] == "Pending"


def test_hami_pods_get_their_gpu_types_and_binpack(gpuadm: Deployment, namespace: str) -> None:
    pod = gpuadm.create_pod(namespace, {"gpuadm.io/a100": "0.5"})
    # The spelling HAMi registers devices under: the driver's names, not GFD's labels.
    assert pod["metadata"]["annotations"]["nvidia.com/use-gputype"] == (
        "NVIDIA A100-SXM4-80GB,NVIDIA A100 80GB PCIe"
    )
    # Shares fill a GPU before another, as stored for hami-scheduler to read.
    assert pod["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] == "binpack"


def test_an_invalid_request_is_refused_with_gpuadms_message(
    gpuadm: Deployment, namespace: str
) -> None:
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100": "1.5"})
    assert 'admission webhook "mutate.gpuadm.io" denied the request' in message
    # The apiserver writes quantities in canonical form before webhooks see them: 1.5 is 1500m.
    assert "container \"main\": gpuadm.io/a100: '1500m' is neither a whole number" in message


def test_a_pod_without_gpus_never_reaches_gpuadm(gpuadm: Deployment, namespace: str) -> None:
    before = gpuadm.reviews()
    gpuadm.create_pod(namespace, {"cpu": "1", "memory": "1Gi"})
    gpuadm.create_pod(namespace, {})
    assert gpuadm.reviews() == before
    gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    assert gpuadm.reviews() == before + 2  # one mutate, one validate


def test_a_user_cannot_remove_gpuadms_label(gpuadm: Deployment, namespace: str) -> None:
    pod = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    name = pod["metadata"]["name"]
    patch = {"metadata": {"labels": {"gpuadm.io/class": None}}}
    with pytest.raises(ApiException) as refused:
        gpuadm.core.patch_namespaced_pod(name, namespace, patch)
    assert (
        "label gpuadm.io/class may be set by gpuadm only"
        in json.loads(refused.value.body)["message"]
    )
    allowed = {"metadata": {"labels": {"team": "vision"}}}
    gpuadm.core.patch_namespaced_pod(name, namespace, allowed)


def test_a_forged_demand_annotation_is_rewritten(gpuadm: Deployment, namespace: str) -> None:
    pod = gpuadm.create_pod(
        namespace, {"gpuadm.io/h100": "2"}, annotations={"gpuadm.io/demand": "h100=0"}
    )
    assert pod["metadata"]["annotations"]["gpuadm.io/demand"] == "h100=2"


def test_a_server_side_dry_run_is_answered(gpuadm: Deployment, namespace: str) -> None:
    pod = gpuadm.create_pod(namespace, {"gpuadm.io/t4": "1"}, dry_run=True)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"tencent.com/vcuda-core": "100"}
    assert gpuadm.core.list_namespaced_pod(namespace).items == []
