"""Checks that the test control plane is a real, usable Kubernetes API."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane

# Must match KUBE_VERSION in controlplane/build.sh.
EXPECTED_VERSION = "v1.34.4"
# Never pulled: there is no kubelet.
PAUSE_IMAGE = "registry.invalid/pause:1"


def make_pod(name: str) -> kubernetes.client.V1Pod:
    """Return a minimal single-container pod manifest."""
    return kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(name=name),
        spec=kubernetes.client.V1PodSpec(
            containers=[kubernetes.client.V1Container(name="main", image=PAUSE_IMAGE)]
        ),
    )


def pod_exists(core_v1: kubernetes.client.CoreV1Api, namespace: str, name: str) -> bool:
    """Return whether the pod is stored in the apiserver."""
    try:
        core_v1.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_apiserver_reports_pinned_version(api_client: kubernetes.client.ApiClient) -> None:
    """The running apiserver is the version build.sh pins."""
    info = kubernetes.client.VersionApi(api_client).get_code()
    assert info.git_version == EXPECTED_VERSION


def test_pod_is_stored_and_stays_pending(
    core_v1: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    """A pod is admitted and stored; with no node to go to, it stays Pending."""
    core_v1.create_namespaced_pod(namespace, make_pod("pending"))

    pod = core_v1.read_namespaced_pod("pending", namespace).to_dict()

    assert pod["spec"]["containers"][0]["image"] == PAUSE_IMAGE
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["node_name"] is None


def test_server_side_dry_run_stores_nothing(
    core_v1: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    """A dry-run create runs admission but persists nothing."""
    returned = core_v1.create_namespaced_pod(namespace, make_pod("dry"), dry_run="All").to_dict()

    assert returned["metadata"]["name"] == "dry"
    assert not pod_exists(core_v1, namespace, "dry")
    assert core_v1.list_namespaced_pod(namespace).items == []


def test_deleting_pod_removes_it(core_v1: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Deleting an unscheduled pod removes it immediately."""
    core_v1.create_namespaced_pod(namespace, make_pod("doomed"))

    # A pod never bound to a node is deleted at once, without a grace period.
    core_v1.delete_namespaced_pod("doomed", namespace)

    assert not pod_exists(core_v1, namespace, "doomed")


def test_kubeconfig_authenticates_as_admin(control_plane: ControlPlane, namespace: str) -> None:
    """The written kubeconfig works with the official client's loader."""
    kubeconfig = str(control_plane.kubeconfig_path)
    with kubernetes.config.new_client_from_config(config_file=kubeconfig) as client:
        core_v1 = kubernetes.client.CoreV1Api(client)
        core_v1.read_namespace(namespace)


def test_anonymous_requests_are_forbidden(control_plane: ControlPlane) -> None:
    """Requests without a token are authenticated as anonymous and denied by RBAC."""
    # The admission tests rely on authorization being real, not wide open.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=str(control_plane.ca_file))
        ),
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        opener.open(f"{control_plane.url}/api/v1/namespaces", timeout=10)
    with raised.value as response:
        assert response.code == 403
