"""The `kai` backend through a real apiserver and kube-scheduler: KAI pods stored as KAI reads
them, bound in their class's pool by a scheduler profile named `kai-scheduler`, and charged
to quota, a share as much as a whole GPU.

kube-scheduler stands in for KAI's scheduler: it knows nothing of shares, so a share pod
fits by its node affinity alone, as the pod carries no `nvidia.com/gpu` (KAI refuses one
beside a share). What KAI's admission webhook adds to a share pod (the
`NVIDIA_VISIBLE_DEVICES` its binder fills, through a ConfigMap) is written into the pod
here, as that webhook would have left it before gpuadm's validating webhook sees it.
"""

from __future__ import annotations

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
    gpuadm: Deployment, namespace: str, limits: dict[str, str], **annotations: str
) -> dict[str, Any]:
    """Create a share pod as it reaches gpuadm's validating webhook in a KAI cluster."""
    kai = as_kais_webhook_leaves_it()
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
            {"gpu-memory": "10240", "gpu-fraction-container-name": "main"},
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
    create_share(gpuadm, namespace, {"gpuadm.io/a100-kai-memory": "20Gi"})  # 0.26 of 81900 MiB
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100-kai": "1"})
    assert (
        f'namespace "{namespace}": a100-kai quota exceeded: requested 1, in use 0.76 of 1'
    ) in message
    # A share is judged like any pod: 0.25 more fits, 0.01 after it does not.
    create_share(gpuadm, namespace, {"gpuadm.io/a100-kai": "0.24"})
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
