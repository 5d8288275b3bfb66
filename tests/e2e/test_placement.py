"""A real kube-scheduler places what gpuadm wrote: on its class's nodes, and only there."""

from __future__ import annotations

import json
from collections.abc import Iterator

import kubernetes.client
import pytest

from tests.device_matching import hami_selects
from tests.e2e.fixtures import Deployment
from tests.e2e.nodes import (
    HAMI_REGISTER,
    TEST_POOLS,
    fits_outside,
    hostname_affinity,
    nodes_of,
    pools_created,
)
from tests.e2e.scheduling import Scheduler

pytestmark = pytest.mark.usefixtures("policy_pools")

# The form every existing chart writes; its class comes from the pod or the namespace.
RAW = {"nvidia.com/gpu": "1"}


@pytest.fixture(scope="module")
def policy_pools(core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler) -> Iterator[None]:
    """Give this module's tests a node pool per class of the test policy, and CPU nodes."""
    with pools_created(core_v1, TEST_POOLS) as names:
        scheduler.wait_until_seen(names[-1])
        yield


def named(gpu_class: str) -> dict[str, str]:
    """Return the pod annotation that names the class of raw GPU resources."""
    return {"gpuadm.io/class": gpu_class}


@pytest.mark.parametrize(
    ("limits", "annotations", "gpu_class"),
    [
        pytest.param({"gpuadm.io/a100": "2"}, {}, "a100", id="hami-whole"),
        pytest.param({"gpuadm.io/a100": "0.5"}, {}, "a100", id="hami-share"),
        pytest.param({"gpuadm.io/a100-memory": "20Gi"}, {}, "a100", id="hami-memory"),
        pytest.param(RAW, named("a100"), "a100", id="hami-raw"),
        pytest.param({"gpuadm.io/t4": "2"}, {}, "t4", id="gpu-manager-whole"),
        pytest.param({"gpuadm.io/t4": "250m"}, {}, "t4", id="gpu-manager-share"),
        pytest.param({"gpuadm.io/t4-memory": "4Gi"}, {}, "t4", id="gpu-manager-memory"),
        pytest.param(RAW, {}, "t4", id="gpu-manager-raw-default-class"),
        pytest.param({"gpuadm.io/h100": "2"}, {}, "h100", id="nvidia-whole"),
        pytest.param(RAW, named("h100"), "h100", id="nvidia-raw"),
        pytest.param({"gpuadm.io/a100-mig": "0.25"}, {}, "a100-mig", id="mig-share"),
        pytest.param({"gpuadm.io/a100-mig-memory": "15Gi"}, {}, "a100-mig", id="mig-memory"),
        pytest.param({"gpuadm.io/v100": "1"}, {}, "v100", id="gpushare-whole"),
        pytest.param({"gpuadm.io/v100": "0.5"}, {}, "v100", id="gpushare-share"),
        pytest.param({"gpuadm.io/v100-memory": "4Gi"}, {}, "v100", id="gpushare-memory"),
        pytest.param(RAW, named("v100"), "v100", id="gpushare-raw"),
        pytest.param({"gpuadm.io/l4": "1"}, {}, "l4", id="time-slicing-whole"),
        pytest.param({"gpuadm.io/l4": "0.5"}, {}, "l4", id="time-slicing-share"),
        pytest.param(RAW, named("l4"), "l4", id="time-slicing-raw"),
        pytest.param({"gpuadm.io/a10": "2"}, {}, "a10", id="volcano-whole"),
        pytest.param({"gpuadm.io/a10": "0.5"}, {}, "a10", id="volcano-share"),
        pytest.param({"gpuadm.io/a10-memory": "8Gi"}, {}, "a10", id="volcano-memory"),
        pytest.param(RAW, named("a10"), "a10", id="volcano-raw"),
    ],
)
def test_a_gpu_pod_is_bound_to_a_node_of_its_class(
    gpuadm: Deployment,
    scheduler: Scheduler,
    namespace: str,
    limits: dict[str, str],
    annotations: dict[str, str],
    gpu_class: str,
) -> None:
    pod = gpuadm.create_pod(namespace, limits, annotations=annotations)
    assert fits_outside(
        TEST_POOLS, pod["spec"]["containers"][0]["resources"]["requests"], gpu_class
    )
    node = scheduler.node_of(namespace, pod["metadata"]["name"])
    assert node in nodes_of(TEST_POOLS, gpu_class)


def test_a_pod_that_no_node_can_hold_stays_pending_with_the_schedulers_reason(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    # Every node holds four GPUs' worth of tencent.com/vcuda-core.
    pod = gpuadm.create_pod(namespace, {"gpuadm.io/t4": "8"})
    message = scheduler.unschedulable(namespace, pod["metadata"]["name"])
    assert "Insufficient tencent.com/vcuda-core" in message


def test_the_users_node_affinity_still_chooses_within_the_class(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    pod = gpuadm.create_pod(
        namespace, {"gpuadm.io/a100": "1"}, spec=hostname_affinity("a100-sxm-1")
    )
    assert scheduler.node_of(namespace, pod["metadata"]["name"]) == "a100-sxm-1"


def test_the_users_node_affinity_cannot_take_a_pod_out_of_its_class(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    # The H100 node has room for it: only the class, ANDed with the user's choice, is in the way.
    pod = gpuadm.create_pod(namespace, {"gpuadm.io/a100": "1"}, spec=hostname_affinity("h100-0"))
    message = scheduler.unschedulable(namespace, pod["metadata"]["name"])
    assert "didn't match Pod's node affinity/selector" in message


def test_a_pod_without_gpus_lands_on_any_node(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    pod = gpuadm.create_pod(namespace, {"cpu": "100m"})
    node = scheduler.node_of(namespace, pod["metadata"]["name"])
    assert node in {name for pool in TEST_POOLS for name in pool.node_names}


def test_a_hami_pods_annotations_select_exactly_its_class_devices(
    gpuadm: Deployment, core_v1: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    annotations = gpuadm.create_pod(namespace, {"gpuadm.io/a100": "0.5"})["metadata"]["annotations"]
    class_nodes = nodes_of(TEST_POOLS, "a100")
    devices = {
        (node.metadata.name, device["id"]): device["type"]
        for node in core_v1.list_node().items
        if node.metadata is not None
        for device in json.loads((node.metadata.annotations or {}).get(HAMI_REGISTER, "[]"))
    }
    selected = {device for device, kind in devices.items() if hami_selects(annotations, kind)}
    in_class = {device for device in devices if device[0] in class_nodes}
    assert in_class
    assert set(devices) > in_class, "only the class's GPUs are registered: nothing to tell apart"
    assert selected == in_class
