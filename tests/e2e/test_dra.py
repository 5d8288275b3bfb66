"""The dra backend through a real apiserver, kube-scheduler and resourceclaim controller.

A pod asks for `gpuadm.io/h100: 1` as on any other backend. gpuadm makes the class's
ResourceClaimTemplate and names it in the pod; kube-controller-manager makes the pod's claim
from it; kube-scheduler allocates a device that the claim's CEL selects from the nodes'
ResourceSlices, writes the allocation into the claim, and binds the pod. Beside the DRA nodes
runs a device-plugin pool, so one policy serves a class on each path, under one quota.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.builders import POLICY_YAML
from tests.e2e.cluster import GPUADM_USER, ControlPlane
from tests.e2e.dra import GROUP, VERSION, device_of, dra_pools_created, templates_in
from tests.e2e.fixtures import Deployment
from tests.e2e.gpuadm import wait_until
from tests.e2e.nodes import A100_SXM, H100, Pool
from tests.e2e.scheduling import Scheduler
from webhook.claims.templates import UNUSED_GRACE_SECONDS, ClusterTemplates
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.kube.client import connect
from webhook.kube.rest import AsyncApi

DRA_POLICY_YAML = """
domain: gpuadm.io
classes:
  h100:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
  l4:
    backend: dra
    models: [NVIDIA L4]
  a100-shared:
    backend: dra
    models: [NVIDIA A100-SXM4-80GB]
    sharing:
      strategy: capacity
      capacity: {memory: 80Gi}
  a100:
    backend: nvidia
    models: [NVIDIA A100-SXM4-80GB]
"""
# H100s and A100s behind NVIDIA's DRA driver, and A100s behind its device plugin. The h100
# class's pods fit on the DRA A100s by every count, so only the claim's selector keeps
# them on H100s. No node has an L4. Nothing frees a device during the module (deleted
# namespaces are never finalized here), so there are H100s for every test's pods.
GPUS_PER_NODE = 4
DRA_POOLS = (
    Pool("dra-h100", "h100", H100, size=3, gpus_per_node=GPUS_PER_NODE),
    Pool("dra-a100", None, A100_SXM, size=2, gpus_per_node=GPUS_PER_NODE),
    Pool("dp-a100", "a100", A100_SXM, "nvidia", gpus_per_node=GPUS_PER_NODE),
)
H100_NODES = set(DRA_POOLS[0].node_names)
pytestmark = pytest.mark.usefixtures("dra_cluster")


@pytest.fixture(scope="module")
def dra_cluster(
    gpuadm: Deployment,
    api_client: kubernetes.client.ApiClient,
    scheduler: Scheduler,
    controller_manager: None,
) -> Iterator[None]:
    """Serve the DRA policy on the DRA and device-plugin pools; then the test policy again."""
    gpuadm.set_policy(DRA_POLICY_YAML)
    try:
        with dra_pools_created(api_client, DRA_POOLS) as names:
            scheduler.wait_until_seen(names[-1])
            yield
    finally:
        gpuadm.set_policy(POLICY_YAML)


def quota(namespace: str, **limits: int) -> str:
    entries = ", ".join(f"'{cls}': {limit}" for cls, limit in limits.items())
    return f"namespaces:\n  {namespace}: {{{entries}}}\n"


def claim_of(api: kubernetes.client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """Wait for the claim the resourceclaim controller made for a pod; return it."""
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    names: list[str] = []

    def made() -> bool:
        statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses
        names.extend(s.resource_claim_name for s in statuses or () if s.resource_claim_name)
        return bool(names)

    wait_until(made, f"the claim of pod {namespace}/{pod}")
    claim: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", names[0]
    )
    return claim


def test_a_class_pod_binds_where_its_claim_gets_a_device_of_the_class(
    gpuadm: Deployment,
    api_client: kubernetes.client.ApiClient,
    scheduler: Scheduler,
    namespace: str,
) -> None:
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1", "cpu": "1"})
    name = stored["metadata"]["name"]
    # What the apiserver stored: the class key gone, a claim in its place.
    container = stored["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1"}
    assert container["resources"]["claims"] == [{"name": "gpuadm-c0"}]
    (entry,) = stored["spec"]["resourceClaims"]
    assert entry["name"] == "gpuadm-c0"
    assert entry["resourceClaimTemplateName"].startswith("gpuadm-h100-1-")
    assert stored["metadata"]["annotations"]["gpuadm.io/demand"] == "h100=1"
    (template,) = templates_in(api_client, namespace)
    assert template["metadata"]["name"] == entry["resourceClaimTemplateName"]
    assert template["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuadm"}

    node = scheduler.node_of(namespace, name)
    assert node in H100_NODES
    claim = claim_of(api_client, namespace, name)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == ("gpu.nvidia.com", node, "gpu")
    device = device_of(api_client, result["pool"], result["device"])
    assert device["attributes"]["productName"] == {"string": H100.name}


def test_a_model_no_node_has_stays_pending(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/l4": "1"})
    reason = scheduler.unschedulable(namespace, stored["metadata"]["name"])
    assert "cannot allocate all claims" in reason


def test_more_devices_than_a_node_has_stay_pending(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    # Four H100s per node, and eight DRA A100s beside them that the selector must not count.
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": str(GPUS_PER_NODE + 1)})
    assert "cannot allocate all claims" in scheduler.unschedulable(
        namespace, stored["metadata"]["name"]
    )


def test_pods_of_one_class_and_count_share_a_template(
    gpuadm: Deployment, api_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    first = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    second = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    third = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "2"})
    named = [
        p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in (first, second, third)
    ]
    assert named[0] == named[1] != named[2]
    assert sorted(t["metadata"]["name"] for t in templates_in(api_client, namespace)) == sorted(
        {named[0], named[2]}
    )


def test_a_dry_run_writes_nothing(
    gpuadm: Deployment, api_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    would_be = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"}, dry_run=True)
    assert would_be["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith(
        "gpuadm-h100-1-"
    )
    assert templates_in(api_client, namespace) == []
    assert gpuadm.core.list_namespaced_pod(namespace).items == []


def test_a_share_is_refused_where_the_apiserver_drops_its_capacity_request(
    gpuadm: Deployment, api_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    # This control plane runs without DRAConsumableCapacity, as 1.34 does by default: the
    # apiserver stores the share's template without `capacity`, and its claim would hold a
    # whole A100 while the pod is charged half of one.
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100-shared": "0.5"})
    assert "did not store ResourceClaimTemplate gpuadm-a100-shared-p50-" in message
    assert "needs the feature gate DRAConsumableCapacity" in message
    # Whole devices of a sharing class ask all of every capacity, so that no share can sit
    # beside them: refused too, where that request cannot be stored.
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100-shared": "1"})
    assert "did not store ResourceClaimTemplate gpuadm-a100-shared-1-" in message
    assert templates_in(api_client, namespace) == []
    # A class that does not share needs no gate.
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    assert stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith(
        "gpuadm-h100-1-"
    )


def test_quota_charges_dra_and_device_plugin_classes_alike(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    # One quota for the namespace: three GPUs of any class.
    gpuadm.set_quotas(quota(namespace, **{"*": 3}))
    on_plugin = gpuadm.create_pod(namespace, {"gpuadm.io/a100": "1"})
    on_dra = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "2"})
    message = gpuadm.refusal(namespace, {"gpuadm.io/h100": "1"})
    assert (
        f'namespace "{namespace}": all classes ("*") quota exceeded: requested 1, in use 3 of 3'
        in message
    )
    assert scheduler.node_of(namespace, on_plugin["metadata"]["name"]) == "dp-a100-0"
    assert on_plugin["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "resourceClaims" not in on_plugin["spec"]
    assert scheduler.node_of(namespace, on_dra["metadata"]["name"]) in H100_NODES


def test_gpus_through_claims_gpuadm_did_not_write_are_refused(
    gpuadm: Deployment, api_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}
    spec = {"devices": {"requests": [request]}}
    template = {"metadata": {"name": "mine"}, "spec": {"spec": spec}}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaimtemplates", template
        )
    assert "requests DeviceClass gpu.nvidia.com" in json.loads(refused.value.body)["message"]
    claim = {"metadata": {"name": "mine"}, "spec": spec}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim)
    assert "requests DeviceClass gpu.nvidia.com" in json.loads(refused.value.body)["message"]
    # Naming a claim: one that does not exist (yet) could be made for GPUs after the pod.
    message = gpuadm.refusal(
        namespace,
        {"cpu": "1"},
        spec={"resourceClaims": [{"name": "x", "resourceClaimName": "later"}]},
    )
    assert "ResourceClaim 'later', which does not exist" in message
    # gpuadm's own template, and its own claim entries, are for it alone to write.
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    ours = stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "resourceclaimtemplates",
            ours,
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
        )
    assert "only gpuadm writes it" in json.loads(refused.value.body)["message"]
    message = gpuadm.refusal(
        namespace,
        {"cpu": "1"},
        spec={"resourceClaims": [{"name": "mine", "resourceClaimTemplateName": ours}]},
    )
    assert f"ResourceClaimTemplate {ours} is gpuadm's" in message
    # A claim made by the resourceclaim controller for another pod: naming it shares its GPUs.
    made = claim_of(api_client, namespace, stored["metadata"]["name"])["metadata"]["name"]
    message = gpuadm.refusal(
        namespace, {"cpu": "1"}, spec={"resourceClaims": [{"name": "x", "resourceClaimName": made}]}
    )
    assert (
        f"names ResourceClaim '{made}', which holds devices of DeviceClass gpu.nvidia.com"
        in message
    )


def test_claims_for_other_devices_pass(
    gpuadm: Deployment, api_client: kubernetes.client.ApiClient, namespace: str
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    spec = {
        "devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]
        }
    }
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", {"metadata": {"name": "nic"}, "spec": spec}
    )
    stored = gpuadm.create_pod(
        namespace,
        {"cpu": "1"},
        spec={"resourceClaims": [{"name": "nic", "resourceClaimName": "nic"}]},
    )
    assert stored["spec"]["resourceClaims"] == [{"name": "nic", "resourceClaimName": "nic"}]
    assert "gpuadm.io/class" not in (stored["metadata"].get("labels") or {})


def test_a_sweep_remakes_a_missing_template_and_removes_an_unused_one(
    gpuadm: Deployment,
    control_plane: ControlPlane,
    api_client: kubernetes.client.ApiClient,
    namespace: str,
) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    name = stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    custom.delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates", name
    )
    assert templates_in(api_client, namespace) == []
    # This replica's clock is the test's; the three serving replicas sweep too, on theirs, and
    # may make the template again first: either way it is back, and none deletes it early.
    now = [0.0]
    holder = ConfigHolder()
    holder.offer(snapshot_from_text(DRA_POLICY_YAML, None, policy_source="p", quotas_source="q"))
    api = AsyncApi(connect(str(control_plane.kubeconfig_of(GPUADM_USER))).endpoint())
    keeper = ClusterTemplates(api, holder, clock=lambda: now[0])

    def delete_pod() -> None:
        gpuadm.core.delete_namespaced_pod(
            stored["metadata"]["name"], namespace, grace_period_seconds=0
        )
        wait_until(lambda: not gpuadm.core.list_namespaced_pod(namespace).items, "pod deleted")

    async def sweeps() -> list[tuple[str, ...]]:
        deleted = []
        try:
            await keeper.sweep()
            kept = await asyncio.to_thread(templates_in, api_client, namespace)
            assert [t["metadata"]["name"] for t in kept] == [name]
            await asyncio.to_thread(delete_pod)
            for advance in (0, UNUSED_GRACE_SECONDS - 1, 1):
                now[0] += advance
                result = await keeper.sweep()
                deleted.append(tuple(d for d in result.deleted if d.startswith(f"{namespace}/")))
        finally:
            await api.close()
        return deleted

    # Other tests leave templates no pod names too (a pod refused after its mutation), and
    # the same sweeps delete them; this test looks at its own namespace.
    assert asyncio.run(sweeps()) == [(), (), (f"{namespace}/{name}",)]
    assert templates_in(api_client, namespace) == []
