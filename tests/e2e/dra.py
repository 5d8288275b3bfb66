"""DRA without a kubelet: NVIDIA's DeviceClass, and ResourceSlices for fake nodes.

What NVIDIA's DRA driver publishes for a node is written here as it writes it
(NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go): one ResourceSlice per
node, driver `gpu.nvidia.com`, a device `gpu-<n>` per GPU with the attributes `type`,
`productName`, `uuid`, and the capacity `memory`. kube-scheduler's DynamicResources plugin
allocates from these slices, and kube-controller-manager's resourceclaim controller makes the
claims of pods that name a template.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.e2e.nodes import Pool, create_node

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
# The DeviceClass the driver's Helm chart installs for whole GPUs.
GPU_DEVICE_CLASS = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                }
            }
        ]
    },
}


def resource_slice(pool: Pool, node: str) -> dict[str, Any]:
    """Return the ResourceSlice NVIDIA's driver publishes for one node of a DRA pool."""
    assert pool.gpu is not None
    devices = [
        {
            "name": f"gpu-{index}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": pool.gpu.name},
                "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            },
            "capacity": {"memory": {"value": f"{pool.gpu.memory_mib}Mi"}},
        }
        for index in range(pool.gpus_per_node)
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@contextlib.contextmanager
def dra_pools_created(
    api: kubernetes.client.ApiClient, pools: Sequence[Pool]
) -> Iterator[list[str]]:
    """Create the DeviceClass, the pools' nodes and their slices; delete them after.

    Pools with a ``stack`` are device-plugin pools and get no slice. Yields the node names
    in the order they were written.
    """
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    names: list[str] = []
    slices: list[str] = []
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", GPU_DEVICE_CLASS)
    try:
        for pool in pools:
            for node in pool.node_names:
                create_node(core, pool, node)
                names.append(node)
                if pool.stack is None and pool.gpu is not None:
                    body = resource_slice(pool, node)
                    custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body)
                    slices.append(body["metadata"]["name"])
        yield names
    finally:
        for name in slices:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        for node in names:
            with contextlib.suppress(ApiException):
                core.delete_node(node)


def device_of(api: kubernetes.client.ApiClient, pool_name: str, device: str) -> dict[str, Any]:
    """Return a device of the slice that publishes pool ``pool_name`` (a node's name)."""
    custom = kubernetes.client.CustomObjectsApi(api)
    found = custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    for item in found:
        if item["spec"]["pool"]["name"] == pool_name:
            for entry in item["spec"]["devices"]:
                if entry["name"] == device:
                    return dict(entry)
    raise AssertionError(f"no device {device} in pool {pool_name}")


def templates_in(api: kubernetes.client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """Return the ResourceClaimTemplates of a namespace."""
    custom = kubernetes.client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates"
    )["items"]
    return items
