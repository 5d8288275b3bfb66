"""Cohorts on the real node: gpuadm's image, from its chart, lends idle GPUs and takes them
back through the Eviction API, and the kubelet really ends what it evicts."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.installed import GPU_CLASS, Image, Installation, on_a_real_node, wait_for
from tests.e2e.kubelet import PAUSE_IMAGE

BORROWED = "gpuadm.io/borrowed"
GATE = "gpuadm.io/quota"
QUEUE = {"mode": "queue"}
TENANTS: dict[str, dict[str, object]] = {
    # team-a may hold 2 beyond its 1, from team-b's idle 2; team-b takes them back.
    "lab-a": {**QUEUE, "cohort": "lab", "h100": 1, "borrow": {"h100": 2}},
    "lab-b": {**QUEUE, "cohort": "lab", "h100": 2, "reclaim": "any"},
    "pdb-a": {**QUEUE, "cohort": "pdb", "h100": 1, "borrow": {"h100": 2}},
    "pdb-b": {**QUEUE, "cohort": "pdb", "h100": 2, "reclaim": "any"},
    "keep-a": {**QUEUE, "cohort": "keep", "h100": 1, "borrow": {"h100": 1}},
    "keep-b": {**QUEUE, "cohort": "keep", "h100": 1, "reclaim": "never"},
    "gang-a": {**QUEUE, "cohort": "gang", "h100": 0, "borrow": {"h100": 2}},
    "gang-b": {**QUEUE, "cohort": "gang", "h100": 2, "reclaim": "any"},
    "kill-a": {**QUEUE, "cohort": "kill", "h100": 1, "borrow": {"h100": 2}},
    "kill-b": {**QUEUE, "cohort": "kill", "h100": 2, "reclaim": "any"},
    # 200 creates: 10 + 20 + 20 nominal, burst-c never lends 10 of its 20: 50 at most, burst-a
    # at most 15.
    "burst-a": {"cohort": "burst", "h100": 10, "borrow": {"h100": 5}},
    "burst-b": {"cohort": "burst", "h100": 20},
    "burst-c": {"cohort": "burst", "h100": 20, "lend": {"h100": 10}},
}
QUOTAS = {"mode": "enforce", "namespaces": TENANTS}
PRODUCT = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def installation(image: Image) -> Iterator[Installation]:
    with on_a_real_node(image) as installed:
        node = installed.node.name
        # What NVIDIA's device plugin and GPU feature discovery would publish.
        installed.core.patch_node(
            node, {"metadata": {"labels": {"nvidia.com/gpu.product": PRODUCT}}}
        )
        installed.core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": "64"}}})
        for namespace in TENANTS:
            installed.make_namespace(namespace)
        installed.install(installed.values(installed.image, QUOTAS))
        wait_for(lambda: len(installed.ready_pods()) == 3, "3 gpuadm pods Ready")
        yield installed


def running_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A one-H100 pod that really runs on the node (the node's own pause image)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {GPU_CLASS: "1"}},
                }
            ],
        },
    }


def create(installation: Installation, namespace: str, name: str, **more: Any) -> None:
    installation.core.create_namespaced_pod(namespace, running_pod(name, **more))
    time.sleep(1.1)  # creation times a second apart: the newest is known


def phase(installation: Installation, namespace: str, name: str) -> str | None:
    try:
        pod = installation.core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    gated = any(g.name == GATE for g in pod.spec.scheduling_gates or [])
    return "Gated" if gated else pod.status.phase


def labelled(installation: Installation, namespace: str) -> set[str]:
    return {
        p.metadata.name
        for p in installation.core.list_namespaced_pod(namespace).items
        if (p.metadata.labels or {}).get(BORROWED) == "true"
    }


def wait_running(
    installation: Installation, namespace: str, names: tuple[str, ...], what: str
) -> None:
    """Wait until every pod of `names` runs on the node."""
    wait_for(lambda: all(phase(installation, namespace, n) == "Running" for n in names), what)


def reasons(installation: Installation, namespace: str) -> list[str]:
    return [e.reason for e in installation.core.list_namespaced_event(namespace).items]


def test_a_lender_s_waiting_pod_gets_its_gpu_back_from_the_newest_borrower(
    installation: Installation,
) -> None:
    for name in ("a0", "a1", "a2"):
        create(installation, "lab-a", name)
    wait_running(
        installation,
        "lab-a",
        ("a0", "a1", "a2"),
        "team-a's three pods running, two of them on team-b's idle GPUs",
    )
    wait_for(lambda: labelled(installation, "lab-a") == {"a1", "a2"}, "the borrowed two labelled")
    create(installation, "lab-b", "b0")
    wait_for(
        lambda: phase(installation, "lab-a", "a2") is None, "the newest borrower evicted, ended"
    )
    wait_for(lambda: phase(installation, "lab-b", "b0") == "Running", "team-b's pod running")
    assert phase(installation, "lab-a", "a1") == "Running", "only what team-b needed was taken"
    assert "GPUQuotaReclaimed" in reasons(installation, "lab-a")
    quota = kubernetes.client.CustomObjectsApi(installation.api)

    def shown() -> dict[str, Any]:
        found: dict[str, Any] = quota.get_namespaced_custom_object(
            "gpuadm.io", "v1alpha1", "lab-a", "gpuquotas", "h100"
        )
        status: dict[str, Any] = found.get("status", {})
        return status

    wait_for(
        lambda: (shown().get("cohort"), shown().get("borrowed")) == ("lab", "1"),
        "team-a's GPUQuota showing 1 borrowed in cohort lab",
    )


def test_a_disruption_budget_keeps_its_pod_and_the_next_borrower_goes(
    installation: Installation,
) -> None:
    create(installation, "pdb-a", "p0")
    create(installation, "pdb-a", "p1")
    create(installation, "pdb-a", "p2", labels={"app": "protected"})
    kubernetes.client.PolicyV1Api(installation.api).create_namespaced_pod_disruption_budget(
        "pdb-a",
        {
            "metadata": {"name": "protected"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}},
        },
    )
    wait_running(installation, "pdb-a", ("p0", "p1", "p2"), "three pods running")
    create(installation, "pdb-b", "q0")
    wait_for(lambda: phase(installation, "pdb-a", "p1") is None, "the next borrower evicted")
    wait_for(lambda: phase(installation, "pdb-b", "q0") == "Running", "the lender's pod running")
    assert phase(installation, "pdb-a", "p2") == "Running", "the budget kept its pod"


def test_reclaim_never_evicts_nothing_and_the_lender_waits_for_the_borrower_to_end(
    installation: Installation,
) -> None:
    create(installation, "keep-a", "k0")
    create(installation, "keep-a", "k1")
    wait_for(lambda: phase(installation, "keep-a", "k1") == "Running", "the borrower running")
    create(installation, "keep-b", "l0")
    time.sleep(12)  # two leader passes and more
    assert phase(installation, "keep-b", "l0") == "Gated"
    assert phase(installation, "keep-a", "k1") == "Running"
    installation.core.delete_namespaced_pod("k1", "keep-a")
    wait_for(lambda: phase(installation, "keep-b", "l0") == "Running", "the lender's pod released")


def test_a_borrowing_gang_is_evicted_whole(installation: Installation) -> None:
    template = running_pod("worker")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 10,
            "template": {"spec": {**template["spec"], "restartPolicy": "Never"}},
        },
    }
    kubernetes.client.BatchV1Api(installation.api).create_namespaced_job("gang-a", job)

    def workers(phase_: str) -> set[str]:
        return {
            p.metadata.name
            for p in installation.core.list_namespaced_pod("gang-a").items
            if p.status.phase == phase_
            and not any(g.name == GATE for g in p.spec.scheduling_gates or [])
            and p.metadata.deletion_timestamp is None
        }

    wait_for(lambda: len(workers("Running")) == 2, "the gang of two running on borrowed GPUs")
    first = workers("Running")
    create(installation, "gang-b", "g0")
    wait_for(lambda: phase(installation, "gang-b", "g0") == "Running", "the lender's pod running")

    def gone() -> bool:
        names = {p.metadata.name for p in installation.core.list_namespaced_pod("gang-a").items}
        return not (first & names)

    wait_for(gone, "both workers of the gang evicted and ended, not one")
    assert workers("Running") == set(), "the Job's new workers wait whole: room for one only"


def test_a_leader_killed_mid_reclaim_evicts_once_and_the_lender_runs(
    installation: Installation,
) -> None:
    for name in ("k0", "k1", "k2"):
        create(installation, "kill-a", name)
    wait_running(
        installation, "kill-a", ("k0", "k1", "k2"), "three pods of kill-a running, two borrowed"
    )
    leader = installation.leader()
    installation.core.create_namespaced_pod("kill-b", running_pod("m0"))
    installation.kill(leader)
    wait_for(lambda: phase(installation, "kill-b", "m0") == "Running", "the lender's pod running")
    time.sleep(8)  # the new leader's passes, and more
    left = {p.metadata.name for p in installation.core.list_namespaced_pod("kill-a").items}
    assert left == {"k0", "k1"}, "exactly one borrower evicted, the newest"
    wait_for(lambda: len(installation.ready_pods()) == 3, "the killed replica replaced")


def test_a_burst_across_a_cohort_of_three_admits_exactly_its_total(
    installation: Installation,
) -> None:
    admitted: Counter[str] = Counter()
    other: list[str] = []
    lock = threading.Lock()
    namespaces = ["burst-a", "burst-b", "burst-c"] * 67

    def one(index: int) -> None:
        namespace = namespaces[index]
        client = installation.plane.api_client()
        core = kubernetes.client.CoreV1Api(client)
        body = running_pod(f"burst-{index}")
        body["spec"]["nodeSelector"] = {"no-such-node": "true"}  # held, never run
        try:
            for _attempt in range(6):
                try:
                    core.create_namespaced_pod(namespace, body)
                except ApiException as error:
                    message = json.loads(error.body or "{}").get("message", "")
                    if "quota exceeded" in message:
                        return
                    if "retry" in message or "failed calling webhook" in message:
                        time.sleep(0.2)
                        continue
                    with lock:
                        other.append(f"{error.status}: {message}")
                    return
                with lock:
                    admitted[namespace] += 1
                return
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(200)))
    assert other == []
    assert sum(admitted.values()) == 50, admitted
    assert admitted["burst-a"] <= 15
    stored = sum(len(installation.core.list_namespaced_pod(ns).items) for ns in set(namespaces))
    assert stored == 50
