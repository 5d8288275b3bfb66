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

    def claims_left() -> set[str]:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, UNGOVERNED, "resourceclaims")
        return {claim for _, claim in made} & {c["metadata"]["name"] for c in listed["items"]}

    try:
        yield make
    finally:
        for pod, claim in made:
            # No kubelet confirms a bound pod's end: only a deletion without grace removes it.
            core.delete_namespaced_pod(pod, UNGOVERNED, grace_period_seconds=0)
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, UNGOVERNED, "resourceclaims", claim
            )
        # The scheduler's finalizer stays on an allocated claim until the resourceclaim
        # controller has freed the device of its deleted pod.
        wait_until(lambda: not claims_left(), "the half-GPU claims to be deleted", claims_left)


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
        placed = [make() for _ in range(2)]
        for pod, _ in placed:
            assert alpha_scheduler.node_of(UNGOVERNED, pod) == node
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
