"""The chart's `tenantAccess.readConfig` against a real apiserver and its RBAC: a tenant it
names runs `gpuadm review --from-cluster` with their own kubeconfig, and may read gpuadm's
policy and quotas and nothing else of gpuadm's namespace."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.deploy.test_manifests import Obj, Render, render, tools  # noqa: F401
from tests.e2e.cluster import TENANT_USER, ControlPlane
from tests.e2e.gpuadm import install_quota_view, wait_until
from tests.support import run_gpuadm

CONFIG_MAPS = ("gpuadm-policy", "gpuadm-quotas")
# Another ConfigMap of the chart beside them (its config check's copy of both), to be refused.
OTHER_CONFIG_MAP = "gpuadm-config-check"
CONFIG_VIEW = "gpuadm-config-view"
# One pod asking for two H100s (a class of examples/values-example.yaml, which the render
# installs) in a namespace whose quota is three, one of them in use.
LIMIT, IN_USE, ASKED = 3, 1, 2


def _pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": {"gpuadm.io/h100": ASKED}},
                }
            ]
        },
    }


def _apply(api: kubernetes.client.ApiClient, objects: list[Obj]) -> None:
    """Apply `objects` as kubectl's server-side apply would, as the admin."""
    dynamic = DynamicClient(api)
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager="gpuadm-e2e",
        )


def _review(plane: ControlPlane, pod: Path, gpuadm_namespace: str) -> tuple[int, str, str]:
    """`gpuadm review --from-cluster` run as the tenant, with the tenant's kubeconfig."""
    result = run_gpuadm(
        "review",
        str(pod),
        "--from-cluster",
        "--kubeconfig",
        str(plane.kubeconfig_of(TENANT_USER)),
        "--gpuadm-namespace",
        gpuadm_namespace,
        "-o",
        "json",
    )
    return result.returncode, result.stdout, result.stderr


def _status(call: Any, *args: str) -> int:
    """The HTTP status of a call: 200, or the apiserver's refusal."""
    try:
        call(*args)
    except ApiException as error:
        return int(error.status)
    return 200


def test_a_tenant_the_chart_names_reviews_against_the_live_quota_and_reads_nothing_else(
    control_plane: ControlPlane,
    api_client: kubernetes.client.ApiClient,
    render: Render,  # noqa: F811
    namespace: str,
    tmp_path: Path,
) -> None:
    """Rendered with `tenantAccess.readConfig` for a User, the chart's Role and RoleBinding let
    that user's `review --from-cluster` read the policy and quotas by name: its verdict counts
    the quota's limit from the ConfigMap and the namespace's use from its GPUQuota object. The
    same user may not list gpuadm's ConfigMaps, nor get another one; and without the option
    the review fails saying it is forbidden, not with a traceback."""
    # gpuadm's namespace, of this test alone: the suite's own gpuadm-system is never touched.
    gpuadm_namespace = f"gpuadm-{uuid.uuid4().hex[:8]}"
    kubernetes.client.CoreV1Api(api_client).create_namespace(
        {"metadata": {"name": gpuadm_namespace}}
    )
    tenant_subject = {"kind": "User", "name": TENANT_USER, "apiGroup": "rbac.authorization.k8s.io"}
    objects = render(
        "helm",
        "--namespace",
        gpuadm_namespace,
        "--set",
        f"quotas.namespaces.{namespace}.h100={LIMIT}",
        "--set",
        "tenantAccess.readConfig=true",
        *(
            a
            for k, v in tenant_subject.items()
            for a in ("--set", f"tenantAccess.subjects[0].{k}={v}")
        ),
    )
    config_maps = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] in {*CONFIG_MAPS, OTHER_CONFIG_MAP}
    ]
    view = [o for o in objects if o["metadata"]["name"] == CONFIG_VIEW]
    assert sorted(o["metadata"]["name"] for o in config_maps) == sorted(
        {*CONFIG_MAPS, OTHER_CONFIG_MAP}
    )
    assert sorted(o["kind"] for o in view) == ["Role", "RoleBinding"]
    assert {o["metadata"]["namespace"] for o in config_maps + view} == {gpuadm_namespace}

    # What the tenant has without the option: its namespace's GPUQuota objects (the chart's
    # gpuadm-quota-view, which `view` aggregates), one saying an H100 is in use. Its limit is
    # the quotas ConfigMap's alone: gpuadm's record of it is left out.
    install_quota_view(api_client)
    _apply(api_client, config_maps)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant-quota-view"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpuadm-quota-view",
            },
            "subjects": [tenant_subject],
        },
    )
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "gpuadm.io",
        "v1alpha1",
        namespace,
        "gpuquotas",
        {
            "apiVersion": "gpuadm.io/v1alpha1",
            "kind": "GPUQuota",
            "metadata": {"name": "h100"},
            "status": {"class": "h100", "inUse": str(IN_USE)},
        },
    )
    pod = tmp_path / "pod.yaml"
    pod.write_text(json.dumps(_pod(namespace)))

    code, out, err = _review(control_plane, pod, gpuadm_namespace)
    assert (code, out) == (2, ""), err
    # One line, said as every command says its failure: no traceback.
    assert (err[: len("gpuadm: ")], err.count("\n")) == ("gpuadm: ", 1), err
    assert (
        f'configmaps "gpuadm-policy" is forbidden: User "{TENANT_USER}" cannot get resource '
        f'"configmaps" in API group "" in the namespace "{gpuadm_namespace}"'
    ) in err
    assert "ask your admin to turn on the chart's tenantAccess.readConfig for you" in err

    _apply(api_client, view)
    reviews: list[tuple[int, str, str]] = []

    def read_the_config() -> bool:
        # The authorizer sees a new RoleBinding a moment after it is stored: until then, the
        # review is refused as above.
        reviews.append(_review(control_plane, pod, gpuadm_namespace))
        return reviews[-1][0] != 2

    wait_until(
        read_the_config, f"{TENANT_USER}'s review to read the config", lambda: reviews[-1][2], 30
    )
    code, out, err = reviews[-1]
    assert code == 0, out + err
    review = json.loads(out)
    assert review["allowed"] is True
    (total,) = review["totals"]
    assert (total["namespace"], total["class"]) == (namespace, "h100")
    assert (total["limit"], total["inUse"], total["asked"]) == (str(LIMIT), str(IN_USE), str(ASKED))
    assert review["warnings"] == [
        f'namespace "{namespace}": h100 quota is 100% used after this pod '
        f"({IN_USE + ASKED} of {LIMIT})"
    ]

    # By name, those two alone: no list of the namespace's ConfigMaps (gpuadm's usage and
    # GPU-hour records), no other one by name.
    with kubernetes.config.new_client_from_config(
        config_file=str(control_plane.kubeconfig_of(TENANT_USER))
    ) as tenant_client:
        tenant = kubernetes.client.CoreV1Api(tenant_client)
        with pytest.raises(ApiException) as listed:
            tenant.list_namespaced_config_map(gpuadm_namespace)
        assert listed.value.status == 403
        assert _status(tenant.read_namespaced_config_map, OTHER_CONFIG_MAP, gpuadm_namespace) == 403
