"""Every object deploy/ renders is accepted by a real apiserver (server-side apply, dry run)."""

from __future__ import annotations

import contextlib

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.unit.test_manifests import RENDERS, Render, render, tools  # noqa: F401

# cert-manager's CRDs are not installed in the test control plane; the fast suite checks
# those objects against cert-manager's API by hand.
NOT_SERVED_HERE = {"cert-manager.io"}


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_every_rendered_object_is_accepted_by_the_apiserver(
    api_client: kubernetes.client.ApiClient,
    render: Render,  # noqa: F811
    name: str,
) -> None:
    # A dry run does not create the Namespace, and namespaced objects need it to exist.
    with contextlib.suppress(ApiException):
        kubernetes.client.CoreV1Api(api_client).create_namespace(
            {"metadata": {"name": "gpuadm-system"}}
        )
    dynamic = DynamicClient(api_client)
    applied = []
    for obj in render(name):
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        if group in NOT_SERVED_HERE:
            continue
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        if resource.namespaced and namespace is None:
            namespace = "gpuadm-system"
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=namespace,
            field_manager="gpuadm-e2e",
            # Other tests wrote some of these objects (the ConfigMaps) already; a dry run
            # only asks whether the apiserver accepts ours.
            force_conflicts=True,
            dry_run="All",
        )
        applied.append(f"{obj['kind']}/{obj['metadata']['name']}")
    assert "Deployment/gpuadm" in applied
    assert "MutatingWebhookConfiguration/gpuadm" in applied
    assert "ValidatingWebhookConfiguration/gpuadm" in applied
