"""DRA without a kubelet: NVIDIA's DeviceClass, and ResourceSlices for fake nodes.

What NVIDIA's DRA driver publishes for a node is written here as it writes it
(NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go): one ResourceSlice per
node, driver `gpu.nvidia.com`, a device `gpu-<n>` per GPU with the attributes `type`,
`productName`, `uuid`, and the capacity `memory`. kube-scheduler's DynamicResources plugin
allocates from these slices, and kube-controller-manager's resourceclaim controller makes the
claims of pods that name a template.

Two shapes need Kubernetes 1.34's alpha DRA gates on the control plane (the apiserver drops
their fields otherwise): devices shared by several claims through consumable capacity
(`DRAConsumableCapacity`, `resource_slice(..., shared=True)`), and a DeviceClass that serves an
extended resource (`DRAExtendedResource`, `gpu_device_class(extended_resource_name=...)`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.e2e.nodes import Pool, create_node

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
# The smallest share of a shared GPU's memory, and the step between shares, in NVIDIA's driver.
SHARE_STEP = "1Mi"


def gpu_device_class(
    name: str = "gpu.nvidia.com", *, extended_resource_name: str | None = None
) -> dict[str, Any]:
    """Return the DeviceClass the driver's Helm chart installs for whole GPUs.

    With ``extended_resource_name`` (the chart writes ``nvidia.com/gpu`` where the cluster
    serves resource.k8s.io/v1) pods that ask for that extended resource get the class's
    devices through DRA, once ``DRAExtendedResource`` is on; without the gate the apiserver
    drops the field.
    """
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource_name is not None:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


GPU_DEVICE_CLASS = gpu_device_class()


def create_device_class(api: kubernetes.client.ApiClient, body: Mapping[str, Any]) -> None:
    """Create a DeviceClass; one of the same name already there is left as it is."""
    custom = kubernetes.client.CustomObjectsApi(api)
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
    except ApiException as error:
        if error.status != 409:
            raise


def resource_slice(pool: Pool, node: str, *, shared: bool = False) -> dict[str, Any]:
    """Return the ResourceSlice NVIDIA's driver publishes for one node of a DRA pool.

    ``shared`` publishes each GPU as the driver does with ``--consumable-shares=memory``
    (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/consumable_shares.go,
    ``applyConsumableShares``): the device allows several allocations, and its ``memory``
    capacity has a request policy whose default is the whole memory and whose valid range is
    1Mi to the whole memory in steps of 1Mi, so each claim takes the memory it asks for.
    The apiserver keeps these fields only with ``DRAConsumableCapacity`` on.
    """
    assert pool.gpu is not None
    memory = f"{pool.gpu.memory_mib}Mi"
    devices: list[dict[str, Any]] = [
        {
            "name": f"gpu-{index}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": pool.gpu.name},
                "uuid": {"string": f"GPU-{uuid.uuid4()}"},
            },
            "capacity": {"memory": {"value": memory}},
        }
        for index in range(pool.gpus_per_node)
    ]
    for device in devices if shared else ():
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"]["requestPolicy"] = _shares(memory)
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


def _shares(memory: str) -> dict[str, Any]:
    """Return the request policy of a shared GPU's ``memory`` capacity (``resource_slice``)."""
    return {
        "default": memory,
        "validRange": {"min": SHARE_STEP, "step": SHARE_STEP, "max": memory},
    }


@contextlib.contextmanager
def dra_pools_created(
    api: kubernetes.client.ApiClient,
    pools: Sequence[Pool],
    *,
    shared: bool = False,
    device_class: Mapping[str, Any] = GPU_DEVICE_CLASS,
) -> Iterator[list[str]]:
    """Create the DeviceClass, the pools' nodes and their slices; delete them after.

    Pools with a ``stack`` are device-plugin pools and get no slice. With ``shared`` each
    GPU allows several allocations (``resource_slice``). Yields the node names in the order
    they were written.
    """
    core = kubernetes.client.CoreV1Api(api)
    custom = kubernetes.client.CustomObjectsApi(api)
    names: list[str] = []
    slices: list[str] = []
    create_device_class(api, device_class)
    try:
        for pool in pools:
            for node in pool.node_names:
                create_node(core, pool, node)
                names.append(node)
                if pool.stack is None and pool.gpu is not None:
                    body = resource_slice(pool, node, shared=shared)
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
