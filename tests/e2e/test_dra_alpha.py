"""DRA with Kubernetes 1.34's alpha gates on: GPUs shared by several claims, and a DeviceClass
that serves an extended resource.

NVIDIA's DRA driver shares a GPU's memory among claims through consumable capacity
(KEP-5075, gate `DRAConsumableCapacity`), and its chart maps `nvidia.com/gpu` onto the
DeviceClass `gpu.nvidia.com` (KEP-5004, gate `DRAExtendedResource`). Both gates are alpha
and off by default: without them the apiserver drops the fields, and a kube-scheduler without
`DRAConsumableCapacity` allocates no claim that asks for capacity. Turning them on for the
whole suite would test every other scenario on a cluster few run, so this one module has a
control plane of its own, with both gates on in kube-apiserver, kube-scheduler and
kube-controller-manager, and gpuadm deployed on it. The session's control plane stays as
1.34 runs by default, and the first tests compare the two.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from tests.e2e.cluster import ControlPlane
from tests.e2e.dra import (
    DRIVER,
    GROUP,
    VERSION,
    dra_pools_created,
    gpu_device_class,
    resource_slice,
    templates_in,
)
from tests.e2e.fixtures import (
    IMAGE,
    Deployment,
    controller_manager_running,
    deployed,
    scheduler_running,
)
from tests.e2e.gpuadm import wait_until
from tests.e2e.nodes import A100_SXM, Pool
from tests.e2e.scheduling import Scheduler
from tests.e2e.test_dra import DRA_POLICY_YAML

ALPHA_GATES = {"DRAConsumableCapacity": True, "DRAExtendedResource": True}
# What NVIDIA's chart writes into its DeviceClass on a cluster that serves resource.k8s.io/v1.
EXTENDED_RESOURCE = "nvidia.com/gpu"
# One node with one GPU that claims share. An A100's 81920Mi halves into whole MiB; an H100's
# 81559Mi would not, and the 1Mi step would round each half up past what the GPU has.
SHARED_POOLS = (Pool("shared-a100", None, A100_SXM, size=1, gpus_per_node=1),)
HALF_A100 = f"{A100_SXM.memory_mib // 2}Mi"
# Named in gpuadm's webhook registrations as a namespace the apiserver never asks gpuadm
# about (deploy/base), and made by the apiserver itself. Claims there are the scheduler's
# alone: in a governed namespace gpuadm refuses a claim for DeviceClass gpu.nvidia.com that
# it did not write.
UNGOVERNED = "kube-system"
pytestmark = pytest.mark.usefixtures("shared_pools")


@pytest.fixture(scope="module")
def alpha_plane() -> Iterator[ControlPlane]:
    """Yield a control plane of the module's own with the alpha DRA gates on."""
    with ControlPlane(feature_gates=ALPHA_GATES) as plane:
        yield plane


@pytest.fixture(scope="module")
def alpha_api(alpha_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    """Yield an admin ``ApiClient`` for the module's control plane."""
    with alpha_plane.api_client() as client:
        yield client


@pytest.fixture(scope="module")
def alpha_scheduler(
    alpha_plane: ControlPlane, alpha_api: kubernetes.client.ApiClient
) -> Iterator[Scheduler]:
    """Run kube-scheduler on the module's control plane, as the session runs its own."""
    with scheduler_running(alpha_plane, kubernetes.client.CoreV1Api(alpha_api)) as scheduler:
        yield scheduler


@pytest.fixture(scope="module")
def alpha_controller_manager(alpha_plane: ControlPlane) -> Iterator[None]:
    """Run kube-controller-manager on the module's control plane: its resourceclaim
    controller frees a claim's device once the claim's pods are gone."""
    with controller_manager_running(alpha_plane):
        yield


@pytest.fixture(scope="module")
def alpha_gpuadm(
    alpha_plane: ControlPlane,
    alpha_api: kubernetes.client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """Run gpuadm on the module's control plane with the DRA policy of tests/e2e/test_dra.py."""
    workdir: Path = tmp_path_factory.mktemp("gpuadm-alpha")
    core = kubernetes.client.CoreV1Api(alpha_api)
    # One replica: it is up in about 2 s, three in about 3 s, and what replicas do together
    # (the Lease, the usage records, one killed mid-burst) is the session's to test and
    # does not change with these gates. `replicas=3` deploys the module as the session does.
    with deployed(
        alpha_plane, alpha_api, core, workdir, replicas=1, policy_text=DRA_POLICY_YAML
    ) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def shared_pools(
    alpha_gpuadm: Deployment,
    alpha_api: kubernetes.client.ApiClient,
    alpha_scheduler: Scheduler,
    alpha_controller_manager: None,
) -> Iterator[list[str]]:
    """Create the shared pools' nodes, their shared slices and the DeviceClass as NVIDIA's
    chart writes it (with its extended resource); yield the node names once the scheduler
    has seen them."""
    device_class = gpu_device_class(extended_resource_name=EXTENDED_RESOURCE)
    with dra_pools_created(
        alpha_api, SHARED_POOLS, shared=True, device_class=device_class
    ) as names:
        alpha_scheduler.wait_until_seen(names[-1])
        yield names


def quantities(value: Any) -> Any:
    """Return ``value`` with every string read as a Kubernetes quantity, to compare amounts
    however the apiserver spells them."""
    if isinstance(value, dict):
        return {key: quantities(item) for key, item in value.items()}
    return parse_quantity(value) if isinstance(value, str) else value


@contextlib.contextmanager
def stored_cluster_object(
    api: kubernetes.client.ApiClient, plural: str, body: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """Create a cluster-scoped resource.k8s.io object; yield it as stored; delete it after."""
    custom = kubernetes.client.CustomObjectsApi(api)
    name = body["metadata"]["name"]
    custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
    try:
        yield custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)


def test_a_shared_gpu_keeps_its_shares_only_where_the_gate_is_on(
    alpha_api: kubernetes.client.ApiClient,
    shared_pools: list[str],
    api_client: kubernetes.client.ApiClient,
) -> None:
    node = shared_pools[0]
    sent = resource_slice(SHARED_POOLS[0], node, shared=True)
    (sent_device,) = sent["spec"]["devices"]
    custom = kubernetes.client.CustomObjectsApi(alpha_api)
    stored = custom.get_cluster_custom_object(
        GROUP, VERSION, "resourceslices", sent["metadata"]["name"]
    )
    (device,) = stored["spec"]["devices"]
    assert device.get("allowMultipleAllocations") is True
    assert quantities(device["capacity"]) == quantities(sent_device["capacity"])
    # The same slice, under a name of its own, on the session's control plane: gate off.
    gate_off = resource_slice(SHARED_POOLS[0], f"gate-off-{uuid.uuid4().hex[:8]}", shared=True)
    with stored_cluster_object(api_client, "resourceslices", gate_off) as dropped:
        (device,) = dropped["spec"]["devices"]
        assert "allowMultipleAllocations" not in device
        assert quantities(device["capacity"]) == {
            "memory": {"value": parse_quantity(sent_device["capacity"]["memory"]["value"])}
        }


def test_a_device_class_keeps_its_extended_resource_only_where_the_gate_is_on(
    alpha_api: kubernetes.client.ApiClient, api_client: kubernetes.client.ApiClient
) -> None:
    custom = kubernetes.client.CustomObjectsApi(alpha_api)
    stored = custom.get_cluster_custom_object(GROUP, VERSION, "deviceclasses", DRIVER)
    assert stored["spec"].get("extendedResourceName") == EXTENDED_RESOURCE
    # The same class, under a name of its own, on the session's control plane: gate off.
    name = f"gate-off-{uuid.uuid4().hex[:8]}.example.com"
    body = gpu_device_class(name, extended_resource_name=EXTENDED_RESOURCE)
    with stored_cluster_object(api_client, "deviceclasses", body) as dropped:
        assert "extendedResourceName" not in dropped["spec"]
        assert dropped["spec"]["selectors"] == body["spec"]["selectors"]


def half_gpu_claim() -> dict[str, Any]:
    """Return a ResourceClaim for half an A100's memory on one device of NVIDIA's class."""
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": HALF_A100}}},
    }
    return {
        "metadata": {"generateName": "half-a100-"},
        "spec": {"devices": {"requests": [request]}},
    }


def pod_with_claim(claim: str) -> dict[str, Any]:
    """Return a pod that names an existing claim and nothing else of the GPU's."""
    container = {"name": "main", "image": IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "metadata": {"generateName": "half-a100-"},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


@contextlib.contextmanager
def half_gpu_pods(api: kubernetes.client.ApiClient) -> Iterator[Callable[[], tuple[str, str]]]:
    """Yield a function that creates a half-GPU claim and a pod naming it in the ungoverned
    namespace and returns (pod, claim); then delete all it made and wait until every claim
    is gone, so the device is free again."""
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    made: list[tuple[str, str]] = []

    def make() -> tuple[str, str]:
        claim = custom.create_namespaced_custom_object(
            GROUP, VERSION, UNGOVERNED, "resourceclaims", half_gpu_claim()
        )["metadata"]["name"]
        pod = core.create_namespaced_pod(UNGOVERNED, pod_with_claim(claim)).metadata.name
        made.append((pod, claim))
        return pod, claim

    try:
        yield make
    finally:
        for pod, _ in made:
            # No kubelet confirms a bound pod's end: only a deletion without grace removes it.
            core.delete_namespaced_pod(pod, UNGOVERNED, grace_period_seconds=0)
        delete_claims(api, UNGOVERNED)


def claim_in(api: kubernetes.client.ApiClient, name: str) -> dict[str, Any]:
    """Return a claim of the ungoverned namespace as stored."""
    custom = kubernetes.client.CustomObjectsApi(api)
    claim: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, UNGOVERNED, "resourceclaims", name
    )
    return claim


def test_the_scheduler_puts_two_half_gpu_claims_on_one_device_and_no_third(
    alpha_api: kubernetes.client.ApiClient,
    alpha_scheduler: Scheduler,
    alpha_gpuadm: Deployment,
    shared_pools: list[str],
) -> None:
    (node,) = shared_pools
    reviews = alpha_gpuadm.reviews()
    with half_gpu_pods(alpha_api) as make:
        # One at a time, each made once the one before is bound. Made together, the second
        # can be found to have no room while the first's allocation is still in flight
        # (the alpha allocator counts consumed capacity of in-flight claims beside what it
        # has seen), and another claim's allocation never requeues a pod: it then waits out
        # the scheduler's five-minute flush of unschedulable pods.
        placed = []
        for _ in range(2):
            placed.append(make())
            assert alpha_scheduler.bound(UNGOVERNED, placed[-1][0]) == node
        # The third once both are bound: made together, any two of the three could get halves.
        third, third_claim = make()
        reason = alpha_scheduler.unschedulable(UNGOVERNED, third)
        assert "cannot allocate all claims" in reason

        results = []
        for pod, claim in placed:
            status = claim_in(alpha_api, claim)["status"]
            (result,) = status["allocation"]["devices"]["results"]
            results.append(result)
            # The scheduler reserves the claim for the pod it binds: nobody else need.
            assert [r["name"] for r in status["reservedFor"]] == [pod]
        assert {(r["driver"], r["pool"], r["device"]) for r in results} == {(DRIVER, node, "gpu-0")}
        shares = {r.get("shareID") for r in results}
        assert None not in shares
        assert len(shares) == 2
        for result in results:
            assert quantities(result["consumedCapacity"]) == {"memory": parse_quantity(HALF_A100)}
        assert "allocation" not in claim_in(alpha_api, third_claim).get("status", {})
    # The claims and pods never reached gpuadm.
    assert alpha_gpuadm.reviews() == reviews


# What gpuadm makes of it ----------------------------------------------------------------


@pytest.fixture
def alpha_namespace(alpha_api: kubernetes.client.ApiClient) -> Iterator[str]:
    """Create a namespace gpuadm governs on the module's control plane; yield its name."""
    core = kubernetes.client.CoreV1Api(alpha_api)
    name = f"e2e-{uuid.uuid4().hex[:12]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


@contextlib.contextmanager
def pods_removed(api: kubernetes.client.ApiClient, namespace: str) -> Iterator[list[str]]:
    """Yield a list to name pods in; then delete them at once, and their claims, so the
    device is free again."""
    core = kubernetes.client.CoreV1Api(api)
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        delete_claims(api, namespace)


def delete_claims(api: kubernetes.client.ApiClient, namespace: str) -> None:
    """Delete every claim of a namespace whose pods are gone, and wait until none is left.

    No garbage collector runs to delete a pod's claims; the finalizer of an allocated claim
    stays until the resourceclaim controller has seen its pods go and freed the device."""
    custom = kubernetes.client.CustomObjectsApi(api)

    def claims_left() -> list[str]:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")
        return [c["metadata"]["name"] for c in listed["items"]]

    for claim in claims_left():
        with contextlib.suppress(ApiException):
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", claim
            )
    wait_until(lambda: not claims_left(), f"the claims of {namespace} to go", claims_left)


def claim_of_pod(api: kubernetes.client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """Wait until a pod's claim is allocated; return it."""
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    found: list[dict[str, Any]] = []

    def allocated() -> bool:
        statuses = core.read_namespaced_pod(pod, namespace).status.resource_claim_statuses
        for status in statuses or ():
            if status.resource_claim_name:
                claim = custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", status.resource_claim_name
                )
                if (claim.get("status") or {}).get("allocation"):
                    found[:] = [claim]
                    return True
        return False

    wait_until(allocated, f"the claim of pod {namespace}/{pod} allocated")
    return found[0]


SHARED_CLASS = {"gpuadm.io/class": "a100-shared"}
# The annotation of the claim the scheduler makes itself for a pod's DRA extended resources.
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def test_two_half_gpu_pods_of_a_class_share_one_device_and_a_third_waits(
    alpha_gpuadm: Deployment,
    alpha_api: kubernetes.client.ApiClient,
    alpha_scheduler: Scheduler,
    shared_pools: list[str],
    alpha_namespace: str,
) -> None:
    (node,) = shared_pools
    alpha_gpuadm.set_quotas(f"namespaces:\n  {alpha_namespace}: {{a100-shared: 1.5}}\n")
    with pods_removed(alpha_api, alpha_namespace) as made:
        placed = []
        for _ in range(2):
            stored = alpha_gpuadm.create_pod(alpha_namespace, {"gpuadm.io/a100-shared": "0.5"})
            made.append(stored["metadata"]["name"])
            placed.append(stored)
            assert stored["metadata"]["annotations"]["gpuadm.io/demand"] == "a100-shared=0.5"
            (entry,) = stored["spec"]["resourceClaims"]
            assert entry["resourceClaimTemplateName"].startswith("gpuadm-a100-shared-p50-")
            assert alpha_scheduler.bound(alpha_namespace, made[-1]) == node
        # The template as stored: the gate keeps the capacity request gpuadm wrote.
        (template,) = templates_in(alpha_api, alpha_namespace)
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert quantities(request["exactly"]["capacity"]) == {
            "requests": {"memory": parse_quantity("40Gi")}
        }
        results = []
        for stored in placed:
            claim = claim_of_pod(alpha_api, alpha_namespace, stored["metadata"]["name"])
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            results.append(result)
            assert quantities(result["consumedCapacity"]) == {"memory": parse_quantity("40Gi")}
        assert {(r["pool"], r["device"]) for r in results} == {(node, "gpu-0")}
        assert len({r["shareID"] for r in results}) == 2
        # Quota has room for a third half (1.5); the one A100 has not.
        third = alpha_gpuadm.create_pod(alpha_namespace, {"gpuadm.io/a100-shared": "0.5"})
        made.append(third["metadata"]["name"])
        reason = alpha_scheduler.unschedulable(alpha_namespace, made[-1])
        assert "cannot allocate all claims" in reason


def test_quota_charges_each_share_as_its_part_of_the_device(
    alpha_gpuadm: Deployment,
    alpha_api: kubernetes.client.ApiClient,
    shared_pools: list[str],
    alpha_namespace: str,
) -> None:
    alpha_gpuadm.set_quotas(f"namespaces:\n  {alpha_namespace}: {{a100-shared: 1}}\n")
    with pods_removed(alpha_api, alpha_namespace) as made:
        quarter = alpha_gpuadm.create_pod(alpha_namespace, {"gpuadm.io/a100-shared-memory": "20Gi"})
        half = alpha_gpuadm.create_pod(alpha_namespace, {"gpuadm.io/a100-shared": "0.5"})
        made += [quarter["metadata"]["name"], half["metadata"]["name"]]
        assert quarter["metadata"]["annotations"]["gpuadm.io/demand"] == "a100-shared=0.25"
        message = alpha_gpuadm.refusal(alpha_namespace, {"gpuadm.io/a100-shared": "0.5"})
        assert "quota exceeded: requested 0.5, in use 0.75 of 1" in message
        last = alpha_gpuadm.create_pod(alpha_namespace, {"gpuadm.io/a100-shared": "0.25"})
        made.append(last["metadata"]["name"])


def test_a_dra_extended_resource_becomes_gpuadms_claim_where_gpuadm_governs(
    alpha_gpuadm: Deployment,
    alpha_api: kubernetes.client.ApiClient,
    alpha_scheduler: Scheduler,
    shared_pools: list[str],
    alpha_namespace: str,
) -> None:
    (node,) = shared_pools
    alpha_gpuadm.set_quotas(f"namespaces:\n  {alpha_namespace}: {{a100-shared: 1}}\n")
    resource = f"deviceclass.resource.kubernetes.io/{DRIVER}"
    with pods_removed(alpha_api, alpha_namespace) as made:
        stored = alpha_gpuadm.create_pod(alpha_namespace, {resource: "1"}, annotations=SHARED_CLASS)
        made.append(stored["metadata"]["name"])
        container = stored["spec"]["containers"][0]
        assert "limits" not in container["resources"]
        assert container["resources"]["claims"] == [{"name": "gpuadm-c0"}]
        (entry,) = stored["spec"]["resourceClaims"]
        assert entry["resourceClaimTemplateName"].startswith("gpuadm-a100-shared-1-")
        assert stored["metadata"]["annotations"]["gpuadm.io/demand"] == "a100-shared=1"
        assert alpha_scheduler.bound(alpha_namespace, made[-1]) == node
        claim = claim_of_pod(alpha_api, alpha_namespace, made[-1])
        # gpuadm's claim, made by the resourceclaim controller; not the scheduler's own.
        assert EXTENDED_RESOURCE_CLAIM not in (claim["metadata"].get("annotations") or {})
        # Charged: the namespace's one A100 is spent.
        message = alpha_gpuadm.refusal(
            alpha_namespace, {EXTENDED_RESOURCE: "1"}, annotations=SHARED_CLASS
        )
        assert "quota exceeded: requested 1, in use 1 of 1" in message


def test_where_gpuadm_does_not_govern_the_scheduler_makes_the_claim_itself(
    alpha_api: kubernetes.client.ApiClient,
    alpha_scheduler: Scheduler,
    alpha_gpuadm: Deployment,
    shared_pools: list[str],
) -> None:
    # What gpuadm keeps governed namespaces from: a pod asking `nvidia.com/gpu`, which no
    # node advertises, gets a claim for a device of the DeviceClass that names it, made and
    # allocated by the scheduler, charged to no class.
    (node,) = shared_pools
    core = kubernetes.client.CoreV1Api(alpha_api)
    custom = kubernetes.client.CustomObjectsApi(alpha_api)
    reviews = alpha_gpuadm.reviews()
    body = {
        "metadata": {"generateName": "extended-"},
        "spec": {
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"limits": {EXTENDED_RESOURCE: "1"}}}
            ]
        },
    }
    pod = core.create_namespaced_pod(UNGOVERNED, body).metadata.name
    try:
        assert alpha_scheduler.bound(UNGOVERNED, pod) == node
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, UNGOVERNED, "resourceclaims")
        (claim,) = [
            c
            for c in listed["items"]
            if (c["metadata"].get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM) == "true"
        ]
        assert claim["metadata"]["ownerReferences"][0]["name"] == pod
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["pool"], result["device"]) == (node, "gpu-0")
    finally:
        core.delete_namespaced_pod(pod, UNGOVERNED, grace_period_seconds=0)
        delete_claims(alpha_api, UNGOVERNED)
    assert alpha_gpuadm.reviews() == reviews
