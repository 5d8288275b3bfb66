"""The guard through the server: /mutate and /validate both deny GPU access outside resources."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, container, pod, review
from tests.webhook.calls import Client, MakeClient, post
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.server.app import create_app
from webhook.server.settings import Settings

VISIBLE_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    snapshot = snapshot_from_text(
        POLICY_YAML, QUOTAS_YAML, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )
    settings = Settings(max_review_bytes=256 * 1024, trusted_user=TRUSTED)
    return await aiohttp_client(create_app(settings, ConfigHolder(snapshot)))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            pod({"cpu": "1"}, extra=[container("sidecar", {}, env=VISIBLE_ALL)]),
            'container "sidecar": env NVIDIA_VISIBLE_DEVICES=all',
            id="visible-devices-without-gpus",
        ),
        pytest.param(
            pod(
                {"gpuadm.io/h100": "1"},
                extra=[container("tools", {}, securityContext={"privileged": True})],
            ),
            'container "tools": securityContext.privileged=true in a GPU pod',
            id="privileged-in-a-gpu-pod",
        ),
        pytest.param(
            pod({"cpu": "1"}, volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}]),
            "volumes[0].hostPath.path=/dev/nvidia0",
            id="device-host-path",
        ),
        pytest.param(
            pod(
                {"cpu": "1"},
                volumes=[{"name": "null", "hostPath": {"path": "/dev/null"}}],
                extra=[
                    container(
                        "app",
                        {},
                        volumeMounts=[
                            {"name": "null", "mountPath": "/var/run/nvidia-container-devices/all"}
                        ],
                    )
                ],
            ),
            'container "app": volumeMounts[0].mountPath=/var/run/nvidia-container-devices/all',
            id="device-list-mount",
        ),
        pytest.param(
            pod({"cpu": "1"}, volumes=[{"name": "links", "hostPath": {"path": "/dev/char"}}]),
            "volumes[0].hostPath.path=/dev/char holds the node's GPU device files",
            id="char-device-links",
        ),
        pytest.param(
            pod(
                {"gpuadm.io/a100": "0.5"},
                extra=[
                    container(
                        "gpu", {"gpuadm.io/a100": "0.5"}, envFrom=[{"configMapRef": {"name": "c"}}]
                    )
                ],
            ),
            'container "gpu": envFrom[0] (ConfigMap c) may set HAMi\'s limiter variables',
            id="env-from-in-a-hami-pod",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "0.5"}, annotations={"hami.io/vgpu-node": "node-a"}),
            "the pod: annotation hami.io/vgpu-node is written by the GPU stack's scheduler",
            id="allocation-annotation",
        ),
    ],
)
async def test_mutate_and_validate_both_deny(
    client: Client, body: dict[str, Any], expected: str
) -> None:
    for path in ("/mutate", "/validate"):
        response = await post(client, path, review(body))
        assert response["allowed"] is False, path
        assert response["status"]["code"] == 403
        assert expected in response["status"]["message"]
        assert response["auditAnnotations"]["decision"] == "denied"


async def test_a_hami_pod_that_switches_isolation_off_is_denied(client: Client) -> None:
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    body = pod({"gpuadm.io/a100": "0.01"})
    body["spec"]["containers"][0]["env"] = env
    response = await post(client, "/mutate", review(body))
    assert response["allowed"] is False
    assert (
        "CUDA_DISABLE_CONTROL=true can switch HAMi's in-container limiter (HAMi-core) off"
        in (response["status"]["message"])
    )


async def test_void_is_admitted_without_a_patch(client: Client) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    body = pod({"cpu": "1"}, extra=[container("sidecar", {}, env=env)])
    for path in ("/mutate", "/validate"):
        response = await post(client, path, review(body))
        assert response["allowed"] is True
        assert "patch" not in response


async def test_exempt_namespaces_are_not_guarded(client: Client) -> None:
    body = pod({"cpu": "1"}, extra=[container("sidecar", {}, env=VISIBLE_ALL)])
    for path in ("/mutate", "/validate"):
        response = await post(client, path, review(body, namespace="kube-system"))
        assert response["allowed"] is True


@pytest.mark.parametrize("user", ["alice", TRUSTED])
async def test_an_ephemeral_container_added_by_update_is_judged(client: Client, user: str) -> None:
    stored = pod({"cpu": "1"})
    debugged = copy.deepcopy(stored)
    debugged["spec"]["ephemeralContainers"] = [container("debugger", {}, env=VISIBLE_ALL)]
    update = review(debugged, operation="UPDATE", old=stored, user=user)
    response = await post(client, "/validate", update)
    assert response["allowed"] is False
    assert (
        'ephemeral container "debugger": env NVIDIA_VISIBLE_DEVICES=all'
        in (response["status"]["message"])
    )
    # Another update of the same pod does not judge that container again.
    relabelled = copy.deepcopy(debugged)
    relabelled["metadata"]["labels"] = {"team": "vision"}
    again = review(relabelled, operation="UPDATE", old=debugged, user=user)
    assert (await post(client, "/validate", again))["allowed"] is True


async def test_a_large_pod_is_guarded_off_the_event_loop_with_the_same_answer(
    client: Client,
) -> None:
    padding = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(2000)]
    body = pod({"cpu": "1"}, extra=[container("big", {}, env=[*padding, *VISIBLE_ALL])])
    response = await post(client, "/mutate", review(body))
    assert response["allowed"] is False
    assert 'container "big": env NVIDIA_VISIBLE_DEVICES=all' in response["status"]["message"]


HAMI_SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"


@pytest.mark.parametrize(
    ("user", "allowed"),
    [
        pytest.param("alice", False, id="a-tenant"),
        pytest.param(TRUSTED, False, id="gpuadm"),
        pytest.param(HAMI_SCHEDULER, True, id="hamis-scheduler"),
        pytest.param("system:serviceaccount:kube-system:hami-device-plugin", True, id="plugin"),
    ],
)
async def test_only_the_gpu_stack_changes_what_its_device_plugin_allocates(
    client: Client, user: str, allowed: bool
) -> None:
    stored = pod({"nvidia.com/gpu": "1"}, annotations={TO_ALLOCATE: "GPU-1,NVIDIA,8192,10:;"})
    more = copy.deepcopy(stored)
    more["metadata"]["annotations"][TO_ALLOCATE] = "GPU-1,NVIDIA,81920,100:;"
    response = await post(
        client, "/validate", review(more, operation="UPDATE", old=stored, user=user)
    )
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["message"].startswith(
            f"annotation {TO_ALLOCATE} may be changed only by the GPU stack's scheduler"
        )


async def test_hamis_scheduler_may_annotate_a_gpuadm_pod(client: Client) -> None:
    """What HAMi's scheduler writes at Filter and Bind passes, on a pod gpuadm wrote."""
    stored = pod(
        {"nvidia.com/gpu": "1"},
        annotations={"gpuadm.io/class": "a100", "gpuadm.io/demand": "a100=0.5"},
    )
    stored["metadata"]["labels"] = {"gpuadm.io/class": "a100"}
    scheduled = copy.deepcopy(stored)
    scheduled["metadata"]["annotations"].update(
        {
            TO_ALLOCATE: "GPU-1,NVIDIA,40960,50:;",
            "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,40960,50:;",
            "hami.io/vgpu-node": "node-a",
            "hami.io/vgpu-time": "1700000000",
            "hami.io/bind-phase": "allocating",
        }
    )
    update = review(scheduled, operation="UPDATE", old=stored, user=HAMI_SCHEDULER)
    assert (await post(client, "/validate", update))["allowed"] is True
