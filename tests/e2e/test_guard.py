"""The guard against a real kube-apiserver: the webhooks see, and refuse, GPU access outside
resources, for pods with and without GPUs and for ephemeral containers added later."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.fixtures import IMAGE, Deployment, pod_body

VISIBLE_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
MUTATE_DENIED = 'admission webhook "mutate.gpuadm.io" denied the request: '
VALIDATE_DENIED = 'admission webhook "validate.gpuadm.io" denied the request: '
GUARDED = "GPU access outside the pod's resources: "

Pod = dict[str, Any]


def body(limits: dict[str, str], change: Callable[[Pod], object] = lambda pod: None) -> Pod:
    """Return the suite's one-container pod asking for `limits`, changed by `change`."""
    pod = pod_body(limits)
    change(pod)
    return pod


def create(gpuadm: Deployment, namespace: str, pod: Pod) -> Pod:
    response = gpuadm.core.create_namespaced_pod(namespace, pod, _preload_content=False)
    stored: Pod = json.loads(response.data)
    return stored


def refused(call: Callable[[], object]) -> str:
    """Run an API call that must be refused; return the apiserver's message."""
    with pytest.raises(ApiException) as refusal:
        call()
    message: str = json.loads(refusal.value.body)["message"]
    return message


def main(pod: Pod) -> Pod:
    container: Pod = pod["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("limits", "change", "expected"),
    [
        pytest.param(
            {"cpu": "100m"},
            lambda pod: main(pod).update(env=VISIBLE_ALL),
            'container "main": env NVIDIA_VISIBLE_DEVICES=all may give it GPUs',
            id="visible-devices-without-gpu-resources",
        ),
        pytest.param(
            {},
            lambda pod: pod["spec"].update(
                initContainers=[{"name": "setup", "image": IMAGE, "env": VISIBLE_ALL}]
            ),
            'init container "setup": env NVIDIA_VISIBLE_DEVICES=all',
            id="visible-devices-in-an-init-container",
        ),
        pytest.param(
            {"cpu": "100m"},
            lambda pod: pod["spec"].update(
                volumes=[{"name": "gpu", "hostPath": {"path": "/dev//nvidia0"}}]
            ),
            'volume "gpu": volumes[0].hostPath.path=/dev//nvidia0 exposes',
            id="device-host-path",
        ),
        pytest.param(
            {"gpuadm.io/h100": "1"},
            lambda pod: main(pod).update(securityContext={"privileged": True}),
            'container "main": securityContext.privileged=true in a GPU pod',
            id="privileged-gpu-container",
        ),
        pytest.param(
            {"gpuadm.io/a100": "0.01"},
            lambda pod: main(pod).update(env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
            "env CUDA_DISABLE_CONTROL=true can switch HAMi's in-container limiter (HAMi-core) off",
            id="hami-isolation-switched-off",
        ),
        pytest.param(
            {"gpuadm.io/a10": "0.5"},
            lambda pod: main(pod).update(
                env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}]
            ),
            "env GPU_CORE_UTILIZATION_POLICY=disable may lift Volcano's core limit",
            id="volcano-core-limit-lifted",
        ),
        pytest.param(
            {"cpu": "100m"},
            lambda pod: (
                pod["spec"].update(volumes=[{"name": "null", "hostPath": {"path": "/dev/null"}}]),
                main(pod).update(
                    volumeMounts=[
                        {"name": "null", "mountPath": "/var/run/nvidia-container-devices/all"}
                    ]
                ),
            ),
            'container "main": volumeMounts[0].mountPath=/var/run/nvidia-container-devices/all '
            "names GPUs",
            id="device-list-mount-without-gpu-resources",
        ),
        pytest.param(
            {"cpu": "100m"},
            lambda pod: pod["spec"].update(
                volumes=[{"name": "links", "hostPath": {"path": "//dev/./char/"}}]
            ),
            'volume "links": volumes[0].hostPath.path=//dev/./char/ holds the node\'s GPU device',
            id="char-device-links",
        ),
        pytest.param(
            {"gpuadm.io/a100": "0.01"},
            lambda pod: main(pod).update(envFrom=[{"configMapRef": {"name": "settings"}}]),
            'container "main": envFrom[0] (ConfigMap settings) may set HAMi\'s limiter',
            id="hami-env-from",
        ),
    ],
)
def test_gpu_access_outside_resources_is_refused(
    gpuadm: Deployment,
    namespace: str,
    limits: dict[str, str],
    change: Callable[[Pod], object],
    expected: str,
) -> None:
    before = gpuadm.reviews()
    message = refused(lambda: create(gpuadm, namespace, body(limits, change)))
    assert message.startswith(MUTATE_DENIED + GUARDED), message
    assert expected in message
    # The webhooks' matchConditions sent it, with or without GPU resources.
    assert gpuadm.reviews() > before
    assert gpuadm.core.list_namespaced_pod(namespace).items == []


@pytest.mark.parametrize("value", ["void", "none"])
def test_a_void_value_is_admitted(gpuadm: Deployment, namespace: str, value: str) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    stored = create(gpuadm, namespace, body({"cpu": "100m"}, lambda p: main(p).update(env=env)))
    assert main(stored)["env"] == env


def test_pods_that_concern_no_rule_still_skip_gpuadm(gpuadm: Deployment, namespace: str) -> None:
    before = gpuadm.reviews()
    create(
        gpuadm,
        namespace,
        body(
            {"cpu": "100m"},
            lambda pod: (
                main(pod).update(
                    env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
                    securityContext={"privileged": True},
                ),
                pod["spec"].update(volumes=[{"name": "v", "hostPath": {"path": "/dev/null"}}]),
            ),
        ),
    )
    assert gpuadm.reviews() == before


def ephemeral(name: str, **fields: Any) -> Pod:
    return {"name": name, "image": IMAGE, **fields}


def add_ephemeral(gpuadm: Deployment, namespace: str, pod: Pod, container: Pod) -> None:
    """Add an ephemeral container through the subresource, as `kubectl debug` does."""
    patch = {"spec": {"ephemeralContainers": [container]}}
    gpuadm.core.patch_namespaced_pod_ephemeralcontainers(pod["metadata"]["name"], namespace, patch)


@pytest.mark.parametrize(
    ("limits", "container", "expected"),
    [
        pytest.param(
            {"cpu": "100m"},
            ephemeral("debugger", env=VISIBLE_ALL),
            'ephemeral container "debugger": env NVIDIA_VISIBLE_DEVICES=all',
            id="visible-devices",
        ),
        pytest.param(
            {"gpuadm.io/h100": "1"},
            ephemeral("debugger", securityContext={"privileged": True}),
            'ephemeral container "debugger": securityContext.privileged=true in a GPU pod',
            id="privileged-in-a-gpu-pod",
        ),
    ],
)
def test_an_ephemeral_container_reaching_gpus_is_refused(
    gpuadm: Deployment, namespace: str, limits: dict[str, str], container: Pod, expected: str
) -> None:
    pod = create(gpuadm, namespace, body(limits))
    message = refused(lambda: add_ephemeral(gpuadm, namespace, pod, container))
    assert message.startswith(VALIDATE_DENIED + GUARDED), message
    assert expected in message
    stored = gpuadm.core.read_namespaced_pod(pod["metadata"]["name"], namespace)
    assert not stored.spec.ephemeral_containers


def test_a_plain_debug_container_is_added_without_gpuadm(
    gpuadm: Deployment, namespace: str
) -> None:
    pod = create(gpuadm, namespace, body({"cpu": "100m"}))
    before = gpuadm.reviews()
    add_ephemeral(gpuadm, namespace, pod, ephemeral("debugger"))
    assert gpuadm.reviews() == before
    stored = gpuadm.core.read_namespaced_pod(pod["metadata"]["name"], namespace)
    assert [c.name for c in stored.spec.ephemeral_containers] == ["debugger"]


def test_a_device_choice_annotation_cannot_be_added_later(
    gpuadm: Deployment, namespace: str
) -> None:
    pod = create(gpuadm, namespace, body({"cpu": "100m"}))
    patch = {"metadata": {"annotations": {"nvidia.com/use-gpuuuid": "GPU-0"}}}
    message = refused(
        lambda: gpuadm.core.patch_namespaced_pod(pod["metadata"]["name"], namespace, patch)
    )
    assert message.startswith(VALIDATE_DENIED), message
    assert "annotation nvidia.com/use-gpuuuid may be set by gpuadm only" in message


def test_an_allocation_annotation_cannot_be_changed_by_a_tenant(
    gpuadm: Deployment, namespace: str
) -> None:
    pod = create(gpuadm, namespace, body({"cpu": "100m"}))
    patch = {
        "metadata": {"annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-0,NVIDIA,1,1:;"}}
    }
    message = refused(
        lambda: gpuadm.core.patch_namespaced_pod(pod["metadata"]["name"], namespace, patch)
    )
    assert message.startswith(VALIDATE_DENIED), message
    assert "annotation hami.io/vgpu-devices-to-allocate may be changed only by the GPU stack" in (
        message
    )


def test_a_pending_shares_gpu_policy_cannot_be_changed(gpuadm: Deployment, namespace: str) -> None:
    """Spread by an update, a pending half would leave fewer whole GPUs free than its class,
    which packs them, allows."""
    pod = create(gpuadm, namespace, body({"gpuadm.io/a100": "0.5"}))
    name = pod["metadata"]["name"]
    assert pod["metadata"]["annotations"]["hami.io/gpu-scheduler-policy"] == "binpack"
    patch = {"metadata": {"annotations": {"hami.io/gpu-scheduler-policy": "spread"}}}
    message = refused(lambda: gpuadm.core.patch_namespaced_pod(name, namespace, patch))
    assert message.startswith(VALIDATE_DENIED), message
    assert "annotation hami.io/gpu-scheduler-policy may be set by gpuadm only" in message
    stored = gpuadm.core.read_namespaced_pod(name, namespace).metadata.annotations
    assert stored["hami.io/gpu-scheduler-policy"] == "binpack"


HAMI_SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"


@pytest.fixture
def hamis_scheduler(
    api_client: kubernetes.client.ApiClient,
) -> Iterator[kubernetes.client.CoreV1Api]:
    """Act as HAMi's scheduler, one of the policy's default gpuStackUsers: the admin
    impersonates its service account, in the admin group so that RBAC lets it patch pods."""
    with kubernetes.client.ApiClient(api_client.configuration) as client:
        client.set_default_header("Impersonate-User", HAMI_SCHEDULER)
        client.set_default_header("Impersonate-Group", "system:masters")
        yield kubernetes.client.CoreV1Api(client)


def test_hamis_scheduler_writes_its_allocation_and_a_tenant_may_not(
    gpuadm: Deployment, hamis_scheduler: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    pod = create(gpuadm, namespace, body({"gpuadm.io/a100": "0.5"}))
    name = pod["metadata"]["name"]
    # What HAMi v2.10.0's extender wrote on a half of an A100 it placed, read back from a run.
    devices = "GPU-0ae39342-8e93-5d32-8b1e-9b7f42147389,NVIDIA,40960,50:;"
    allocation = {
        "hami.io/vgpu-devices-to-allocate": devices,
        "hami.io/vgpu-devices-allocated": devices,
        "hami.io/vgpu-node": "a100-sxm-0",
        "hami.io/vgpu-time": "1796641628",
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1796641629",
    }
    patch = {"metadata": {"annotations": allocation}}
    message = refused(lambda: gpuadm.core.patch_namespaced_pod(name, namespace, patch))
    assert "may be changed only by the GPU stack" in message, message
    hamis_scheduler.patch_namespaced_pod(name, namespace, patch)
    stored = gpuadm.core.read_namespaced_pod(name, namespace).metadata.annotations
    assert {key: stored[key] for key in allocation} == allocation
    assert stored["hami.io/gpu-scheduler-policy"] == "binpack"
