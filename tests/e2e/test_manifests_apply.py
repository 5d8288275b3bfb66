"""Every object deploy/ renders is accepted by a real apiserver (server-side apply, dry run)."""

from __future__ import annotations

import uuid

import kubernetes.client
import pytest
from kubernetes.dynamic import DynamicClient

from tests.deploy.test_manifests import RENDERS, Render, render, tools  # noqa: F401

# cert-manager's CRDs are not installed in the test control plane; the fast suite checks
# those objects against cert-manager's API by hand.
NOT_SERVED_HERE = {"cert-manager.io"}


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_every_rendered_object_is_accepted_by_the_apiserver(
    api_client: kubernetes.client.ApiClient,
    render: Render,  # noqa: F811
    name: str,
) -> None:
    # Into a namespace of its own, and under names of its own for cluster-wide objects, so
    # that the suite's running gpuadm (registered by other fixtures) is never touched.
    suffix = uuid.uuid4().hex[:8]
    target = f"manifests-{suffix}"
    kubernetes.client.CoreV1Api(api_client).create_namespace({"metadata": {"name": target}})
    dynamic = DynamicClient(api_client)
    applied = []
    for obj in render(name):
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        if group in NOT_SERVED_HERE:
            continue
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        if resource.namespaced:
            obj["metadata"]["namespace"] = target
        elif obj["kind"] != "CustomResourceDefinition":
            # A CRD's name must be <plural>.<group>; the dry run stores nothing anyway.
            obj["metadata"]["name"] = f"{obj['metadata']['name']}-{suffix}"
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager="gpuadm-e2e",
            dry_run="All",
        )
        applied.append(obj["kind"])
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ClusterRole",
        "Role",
        "Service",
        "PodDisruptionBudget",
    } <= set(applied)
