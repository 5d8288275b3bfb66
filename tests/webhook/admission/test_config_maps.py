"""KAI's share ConfigMaps through the server: in a namespace gpuadm governs, only the GPU
stack writes a ConfigMap named as KAI's binder names those that hand a share its GPUs.

The apiserver's side (the routing by name, the refusal a user reads) is proven in
tests/e2e/test_kai.py; the CEL that routes them in tests/deploy/test_manifests.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, review
from tests.webhook.calls import Client, MakeClient, post
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.server.app import create_app
from webhook.server.settings import Settings

KAI_POLICY_YAML = """
domain: gpuadm.io
defaultClass: a100-kai
exemptNamespaces: [kube-system]
classes:
  a100-kai:
    backend: kai
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
"""
TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"
BINDER = "system:serviceaccount:kai-scheduler:binder"
KAIS = "train-x7k2m9q-shared-gpu-0"


async def serving(aiohttp_client: MakeClient, policy: str) -> Client:
    snapshot = snapshot_from_text(
        policy, QUOTAS_YAML, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )
    settings = Settings(trusted_user=TRUSTED)
    return await aiohttp_client(create_app(settings, ConfigHolder(snapshot)))


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    return await serving(aiohttp_client, KAI_POLICY_YAML)


def config_map(name: str, devices: str = "GPU-0") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "team-x"},
        "data": {"NVIDIA_VISIBLE_DEVICES": devices},
    }


def config_map_review(
    name: str,
    *,
    user: str = "alice",
    operation: str = "CREATE",
    namespace: str = "team-x",
) -> dict[str, Any]:
    """A review of a ConfigMap write as the apiserver sends it; an UPDATE names every GPU."""
    new = config_map(name, "GPU-0,GPU-1,GPU-2,GPU-3" if operation == "UPDATE" else "GPU-0")
    old = config_map(name) if operation in ("UPDATE", "DELETE") else None
    body = review(
        None if operation == "DELETE" else new,
        operation=operation,
        namespace=namespace,
        user=user,
        old=old,
    )
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    body["request"]["name"] = name
    return body


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize(
    "name", [KAIS, "train-x7k2m9q-shared-gpu-i1", "train-x7k2m9q-shared-gpu-0-evar"]
)
async def test_a_tenant_may_not_write_kais_share_configmap(
    client: Client, name: str, operation: str
) -> None:
    response = await post(client, "/validate", config_map_review(name, operation=operation))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith(
        f"ConfigMap {name} in namespace team-x is named as KAI's binder names the ConfigMap "
        "that hands a GPU share its GPUs"
    )
    stack = "only the GPU stack (the policy's gpuStackUsers) may create or change it, not alice"
    assert stack in message
    assert response["auditAnnotations"] == {"decision": "denied", "reason": message}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
async def test_kais_binder_writes_it(client: Client, operation: str) -> None:
    body = config_map_review(KAIS, user=BINDER, operation=operation)
    response = await post(client, "/validate", body)
    assert response == {
        "uid": body["request"]["uid"],
        "allowed": True,
        "auditAnnotations": {"decision": "allowed"},
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param(config_map_review("settings"), "an ordinary ConfigMap", id="ordinary"),
        pytest.param(config_map_review(KAIS, operation="DELETE"), "a delete", id="delete"),
        pytest.param(
            config_map_review(KAIS, namespace="kube-system"), "an exempt namespace", id="exempt"
        ),
    ],
)
async def test_what_is_not_refused(client: Client, body: dict[str, Any], why: str) -> None:
    assert (await post(client, "/validate", body))["allowed"] is True, why


async def test_without_a_kai_class_no_configmap_is_refused(aiohttp_client: MakeClient) -> None:
    client = await serving(aiohttp_client, POLICY_YAML)
    assert (await post(client, "/validate", config_map_review(KAIS)))["allowed"] is True


async def test_with_the_guard_off_no_configmap_is_refused(aiohttp_client: MakeClient) -> None:
    policy = KAI_POLICY_YAML + "guard: {allocationAnnotations: false}\n"
    client = await serving(aiohttp_client, policy)
    assert (await post(client, "/validate", config_map_review(KAIS)))["allowed"] is True


async def test_mutate_lets_a_configmap_pass_unchanged(client: Client) -> None:
    """Only /validate judges ConfigMaps; a misrouted one is not rewritten, nor refused."""
    body = config_map_review(KAIS)
    response = await post(client, "/mutate", body)
    assert response["allowed"] is True
    assert "patch" not in response
