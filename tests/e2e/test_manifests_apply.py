"""Every object deploy/ renders is accepted by a real apiserver (server-side apply, dry run)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import kubernetes.client
import pytest
from kubernetes.dynamic import DynamicClient

from tests.deploy.test_manifests import RENDERS, REPO, Render, render, tools  # noqa: F401
from tests.e2e.cluster import ControlPlane

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


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_install_notes_say_the_removed_http2_value_is_ignored(
    control_plane: ControlPlane,
    tools: dict[str, Path],  # noqa: F811
    value: str,
) -> None:
    """A values file that still sets `http2` installs (tests/deploy/test_chart.py); its install
    says to remove it. Helm prints the notes only on an install, which asks an apiserver for
    its version even in a dry run, so this one runs here."""
    warning = "the value http2 is ignored; remove it from your values"
    helm = tools["helm"]
    assert warning in _install_notes(control_plane, helm, "--set", f"http2={value}")
    assert "http2" not in _install_notes(control_plane, helm)


def test_the_install_notes_say_when_no_class_is_configured_and_which_image_must_be_pulled(
    control_plane: ControlPlane,
    tools: dict[str, Path],  # noqa: F811
) -> None:
    """With the chart's defaults nothing is rewritten, and the notes say so; with a policy of
    classes they do not. Either way they name the image the pods must pull, and what to do
    when they cannot."""
    helm = tools["helm"]
    no_class = "No GPU class is configured: gpuadm rewrites and charges nothing"
    defaults = _install_notes(control_plane, helm)
    assert no_class in defaults
    example = _install_notes(control_plane, helm, "-f", "examples/values-example.yaml")
    assert no_class not in example
    image = _install_notes(control_plane, helm, "--set", "image.repository=registry.example/gpu")
    assert "Pods in ErrImagePull or ImagePullBackOff cannot pull registry.example/gpu:" in image


def _install_notes(plane: ControlPlane, helm: Path, *values: str) -> str:
    """The notes `helm install` prints, in a dry run that stores nothing."""
    result = subprocess.run(
        [
            str(helm),
            "install",
            f"notes-{uuid.uuid4().hex[:8]}",
            "deploy/helm/gpuadm",
            "--dry-run=client",
            # The suite's own cluster-wide objects (its ClusterRoles) are not this release's:
            # an install would refuse them as taken, before the dry run's end.
            "--take-ownership",
            "--kubeconfig",
            str(plane.kubeconfig_path),
            "--namespace",
            "gpuadm-notes",
            *values,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_the_install_notes_say_when_no_class_is_configured_and_which_image_to_pull(
    control_plane: ControlPlane,
    tools: dict[str, Path],  # noqa: F811
) -> None:
    """The chart's defaults hold no class: the notes say that nothing is rewritten, until a
    policy is given, and name the image that pods in ImagePullBackOff could not pull."""
    helm = tools["helm"]
    defaults = _install_notes(control_plane, helm)
    assert "No GPU class is configured: gpuadm rewrites and charges nothing" in defaults
    assert "cannot pull ghcr.io/gpuadm/gpuadm:" in defaults
    example = _install_notes(
        control_plane,
        helm,
        "-f",
        "examples/values-example.yaml",
        "--set",
        "image.repository=registry.example.com/gpuadm",
    )
    assert "No GPU class" not in example
    assert "cannot pull registry.example.com/gpuadm:" in example
