"""The `kai` backend through a real apiserver and kube-scheduler: KAI pods stored as KAI reads
them, bound in their class's pool by a scheduler profile named `kai-scheduler`, and charged
to quota, a share as much as a whole GPU; and the ConfigMaps through which KAI's binder hands
a share its GPUs written by the binder alone.

kube-scheduler stands in for KAI's scheduler: it knows nothing of shares, so a share pod
fits by its node affinity alone, as the pod carries no `nvidia.com/gpu` (KAI refuses one
beside a share). What KAI's admission webhook adds to a share pod (the
`NVIDIA_VISIBLE_DEVICES` its binder fills, through a ConfigMap) is written into the pod
here, as that webhook would have left it before gpuadm's validating webhook sees it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from tests.e2e.fixtures import Deployment, serving_on_pools
from tests.e2e.gpuadm import wait_until
from tests.e2e.nodes import KAI_POOLS, nodes_of
from tests.e2e.scheduling import Scheduler

KAI_POLICY_YAML = """
domain: gpuadm.io
defaultClass: a100-kai
exemptNamespaces: [kube-system]
classes:
  a100-kai:
    backend: kai
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
    queue: research
  h100-kai:
    backend: kai
    memory: 81559Mi
    models: [NVIDIA H100 80GB HBM3]
"""
GPU = "nvidia.com/gpu"
QUEUE = "kai.scheduler/queue"
SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"
BINDER = "system:serviceaccount:kai-scheduler:binder"

pytestmark = pytest.mark.usefixtures("kai_cluster")


@pytest.fixture(scope="module")
def kai_cluster(
    gpuadm: Deployment, core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler
) -> Iterator[None]:
    """Serve the KAI policy on its pools for this module; then the test policy again."""
    with serving_on_pools(gpuadm, core_v1, scheduler, KAI_POLICY_YAML, KAI_POOLS):
        yield


def as_kais_webhook_leaves_it(prefix: str = "kai-test-shared-gpu") -> dict[str, Any]:
    """Return the pod fields KAI's admission webhook gives a share pod: the ConfigMap name in
    an annotation, and the share's container reading NVIDIA_VISIBLE_DEVICES from it."""
    reference = {"name": f"{prefix}-0", "key": "NVIDIA_VISIBLE_DEVICES"}
    return {
        "annotations": {SHARED_GPU_CONFIGMAP: prefix},
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": reference}}],
    }


def create_share(
    gpuadm: Deployment,
    namespace: str,
    limits: dict[str, str],
    *,
    prefix: str = "kai-test-shared-gpu",
    **annotations: str,
) -> dict[str, Any]:
    """Create a share pod as it reaches gpuadm's validating webhook in a KAI cluster."""
    kai = as_kais_webhook_leaves_it(prefix)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "kai-", "annotations": {**kai["annotations"], **annotations}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/app:1",
                    "env": kai["env"],
                    "resources": {"limits": limits},
                }
            ]
        },
    }
    stored: dict[str, Any] = gpuadm.core.api_client.sanitize_for_serialization(
        gpuadm.core.create_namespaced_pod(namespace, body)
    )
    return stored


@pytest.mark.parametrize(
    ("gpu_class", "limits", "annotations", "resources", "share"),
    [
        pytest.param("a100-kai", {"gpuadm.io/a100-kai": "2"}, {}, {GPU: "2"}, {}, id="whole"),
        pytest.param(
            "a100-kai",
            {"gpuadm.io/a100-kai": "0.5"},
            {},
            {},
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
            id="share",
        ),
        pytest.param(
            "h100-kai",
            {"gpuadm.io/h100-kai-memory": "10Gi"},
            {},
            {},
            # 10240 of the 81500 MiB KAI counts of an H100 is 12.56 hundredths: a MiB under 12.
            {"gpu-memory": "9779", "gpu-fraction-container-name": "main"},
            id="memory",
        ),
        pytest.param(
            "h100-kai", {GPU: "1"}, {"gpuadm.io/class": "h100-kai"}, {GPU: "1"}, {}, id="raw"
        ),
    ],
)
def test_a_kai_pod_is_stored_as_kai_reads_it_and_bound_in_its_pool(
    gpuadm: Deployment,
    scheduler: Scheduler,
    namespace: str,
    gpu_class: str,
    limits: dict[str, str],
    annotations: dict[str, str],
    resources: dict[str, str],
    share: dict[str, str],
) -> None:
    pod = gpuadm.create_pod(namespace, limits, annotations=annotations)
    stored = pod["spec"]["containers"][0].get("resources") or {}
    assert stored.get("limits", {}) == resources
    assert stored.get("requests", {}) == resources
    metadata = pod["metadata"]
    kais = {k: v for k, v in metadata["annotations"].items() if not k.startswith("gpuadm.io/")}
    assert kais == share
    if "gpu-fraction" in share:
        # As KAI's validator reads it: a float strictly between 0 and 1, no suffix.
        assert 0 < float(share["gpu-fraction"]) < 1
    assert metadata["labels"]["gpuadm.io/class"] == gpu_class
    assert metadata["labels"].get(QUEUE) == ("research" if gpu_class == "a100-kai" else None)
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    node = scheduler.node_of(namespace, metadata["name"])
    assert node in nodes_of(KAI_POOLS, gpu_class)


def test_a_share_with_kais_device_wiring_is_admitted_and_placed(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    """What KAI's webhook adds passes the guard and the fixed-point check, and the pod
    reaches the validating webhook (its NVIDIA_VISIBLE_DEVICES routes it there)."""
    validated = gpuadm.reviews()
    pod = create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.25"})
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    assert gpuadm.reviews() >= validated + 2, "the pod was not reviewed by both webhooks"
    node = scheduler.node_of(namespace, pod["metadata"]["name"])
    assert node in nodes_of(KAI_POOLS, "a100-kai")


def test_any_other_devices_variable_is_still_refused(gpuadm: Deployment, namespace: str) -> None:
    main = {
        "name": "main",
        "image": "registry.invalid/app:1",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "resources": {"limits": {"gpuadm.io/a100-kai": "0.5"}},
    }
    message = gpuadm.refusal(namespace, {}, spec={"containers": [main]})
    assert 'container "main": env NVIDIA_VISIBLE_DEVICES=all may give it GPUs' in message


def test_a_share_may_not_read_its_gpus_from_a_configmap_the_tenant_may_write(
    gpuadm: Deployment, namespace: str
) -> None:
    """KAI keeps a ConfigMap prefix the pod brings: one outside KAI's form (`...-shared-gpu`)
    would name a ConfigMap gpuadm lets the tenant write, so the pod is refused."""
    with pytest.raises(kubernetes.client.exceptions.ApiException) as refusal:
        create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.5"}, prefix="mine")
    message = json.loads(refusal.value.body)["message"]
    assert 'container "main": env NVIDIA_VISIBLE_DEVICES from valueFrom' in message


def test_a_namespace_gets_its_own_queue_from_the_policy(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    own = KAI_POLICY_YAML + f"    namespaces:\n      {namespace}: {{queue: {namespace}-queue}}\n"
    # The entry belongs to h100-kai, the last class of the policy.
    gpuadm.set_policy(own)
    try:
        pod = gpuadm.create_pod(namespace, {"gpuadm.io/h100-kai": "0.5"})
        assert pod["metadata"]["labels"][QUEUE] == f"{namespace}-queue"
        other = gpuadm.create_pod(namespace, {"gpuadm.io/a100-kai": "0.5"})
        assert other["metadata"]["labels"][QUEUE] == "research"
        assert scheduler.node_of(namespace, pod["metadata"]["name"]) in nodes_of(
            KAI_POOLS, "h100-kai"
        )
    finally:
        gpuadm.set_policy(KAI_POLICY_YAML)


def test_kai_shares_count_against_the_class_s_quota(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(f"namespaces:\n  {namespace}: {{a100-kai: 1}}\n")
    create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.5"})
    # 20Gi is 25.006 hundredths of 81900 MiB: 0.25, rounded down.
    create_share(gpuadm, namespace, {"gpuadm.io/a100-kai-memory": "20Gi"})
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100-kai": "1"})
    assert (
        f'namespace "{namespace}": a100-kai quota exceeded: requested 1, in use 0.75 of 1'
    ) in message
    # A share is judged like any pod: 0.25 more fits, 0.01 after it does not.
    create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.25"})
    with pytest.raises(kubernetes.client.exceptions.ApiException) as refused:
        create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.01"})
    assert "a100-kai quota exceeded: requested 0.01, in use 1 of 1" in str(refused.value.body)


def test_a_share_kai_was_given_is_counted_once_stored(gpuadm: Deployment, namespace: str) -> None:
    """A share pod is charged by its annotations wherever gpuadm counts stored pods: a
    replica's pod watch sees it, and the next pod is judged against it. (Without KAI's
    wiring, the share pod itself carries nothing the shipped webhooks route to validation.)"""
    gpuadm.set_quotas(f"namespaces:\n  {namespace}: {{a100-kai: 1}}\n")
    gpuadm.create_pod(namespace, {"gpuadm.io/a100-kai": "0.75"})

    def counted() -> bool:
        try:
            gpuadm.create_pod(namespace, {"gpuadm.io/a100-kai": "1"}, dry_run=True)
        except kubernetes.client.exceptions.ApiException as refused:
            return "requested 1, in use 0.75 of 1" in str(refused.body)
        return False

    wait_until(counted, "the share counted against the quota")


# --- KAI's share ConfigMaps --------------------------------------------------------------------


@pytest.fixture
def kais_binder(api_client: kubernetes.client.ApiClient) -> Iterator[kubernetes.client.CoreV1Api]:
    """Act as KAI's binder: the admin impersonates its service account, in the admin group so
    that RBAC lets it write ConfigMaps, as KAI's chart lets the binder."""
    with kubernetes.client.ApiClient(api_client.configuration) as client:
        client.set_default_header("Impersonate-User", BINDER)
        client.set_default_header("Impersonate-Group", "system:masters")
        yield kubernetes.client.CoreV1Api(client)


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def refused(call: Any, *args: Any) -> str:
    """Make a call that must be refused; return the apiserver's message."""
    with pytest.raises(kubernetes.client.exceptions.ApiException) as refusal:
        call(*args)
    message: str = json.loads(refusal.value.body)["message"]
    return message


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("train-x7k2m9q-shared-gpu-0", id="app-container"),
        pytest.param("train-x7k2m9q-shared-gpu-i0", id="init-container"),
        pytest.param("train-x7k2m9q-shared-gpu-0-evar", id="evar"),
    ],
)
def test_only_kais_binder_writes_the_configmap_that_hands_a_share_its_gpus(
    gpuadm: Deployment, kais_binder: kubernetes.client.CoreV1Api, namespace: str, name: str
) -> None:
    tenant = gpuadm.core
    every_gpu = config_map(name, NVIDIA_VISIBLE_DEVICES="all")
    message = refused(tenant.create_namespaced_config_map, namespace, every_gpu)
    assert (
        f"ConfigMap {name} in namespace {namespace} is named as KAI's binder names the "
        "ConfigMap that hands a GPU share its GPUs (its container reads NVIDIA_VISIBLE_DEVICES "
        "from it), so only the GPU stack (the policy's gpuStackUsers) may create or change "
        "it, not admin"
    ) in message
    # As the binder upserts it (config_map.go): created empty, then merge-patched as it binds.
    kais_binder.create_namespaced_config_map(namespace, config_map(name))
    kais_binder.patch_namespaced_config_map(
        name, namespace, {"data": {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}}
    )
    message = refused(
        tenant.patch_namespaced_config_map,
        name,
        namespace,
        {"data": {"NVIDIA_VISIBLE_DEVICES": "all"}},
    )
    assert "may create or change it, not admin" in message
    stored = tenant.read_namespaced_config_map(name, namespace)
    assert stored.data == {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}
    # A delete takes no GPU from anyone: the tenant's pod only fails to start.
    tenant.delete_namespaced_config_map(name, namespace)


def test_an_ordinary_configmap_is_never_sent_to_gpuadm(gpuadm: Deployment, namespace: str) -> None:
    """The webhook's matchCondition sends gpuadm KAI's names only, as the apiserver reads it."""
    before = gpuadm.reviews()
    gpuadm.core.create_namespaced_config_map(namespace, config_map("settings", mode="fast"))
    gpuadm.core.patch_namespaced_config_map("settings", namespace, {"data": {"mode": "slow"}})
    assert gpuadm.reviews() == before
    name = "train-x7k2m9q-shared-gpu-1"
    refused(gpuadm.core.create_namespaced_config_map, namespace, config_map(name))
    assert gpuadm.reviews() == before + 1
