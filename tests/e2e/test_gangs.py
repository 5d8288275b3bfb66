"""Gangs in queue mode through the real apiserver, scheduler and job controller: a gang's pods
wait together behind gpuadm's gate until the whole gang fits, and are released together."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.fixtures import IMAGE, Deployment, pod_body
from tests.e2e.gpuadm import LEASE_SECONDS, wait_until
from tests.e2e.test_queue import (
    GATE,
    H100_POD,
    bound,
    gated,
    pods,
    queue_nodes,  # noqa: F401 (a fixture)
    queue_quota,
    status_shows,
    waiting_events,
)

pytestmark = pytest.mark.usefixtures("queue_nodes", "controller_manager")

# scheduler-plugins' PodGroup, as its CRD serves it (the fields gpuadm reads: minMember).
POD_GROUP_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def gang_job(namespace: str, name: str, parallelism: int) -> dict[str, Any]:
    container = {"name": "train", "image": IMAGE, "resources": {"limits": H100_POD}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": 100,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def of_job(found: list[Any], job: str) -> list[Any]:
    return [
        p for p in found if (p.metadata.labels or {}).get("batch.kubernetes.io/job-name") == job
    ]


def never_more_than(
    core: kubernetes.client.CoreV1Api, namespace: str, most: int, seconds: float
) -> None:
    """For a while, no more than `most` pods of the namespace hold their GPUs (ungated, not
    ended): a gang is never started in part."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        holding = [
            p
            for p in pods(core, namespace)
            if not gated(p) and p.status.phase not in ("Succeeded", "Failed")
        ]
        assert len(holding) <= most, [p.metadata.name for p in holding]
        time.sleep(0.2)


def end_as_the_kubelet_would(
    core: kubernetes.client.CoreV1Api, namespace: str, names: list[str]
) -> None:
    """Report pods as succeeded, as a kubelet does when their containers exit 0: the suite's
    GPU nodes are Node objects that run nothing."""
    for name in names:
        core.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": "Succeeded",
                    "conditions": [{"type": "Ready", "status": "False"}],
                }
            },
        )


def test_a_job_of_three_with_room_for_two_starts_no_pod_until_three_fit(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 3))
    holder = gpuadm.create_pod(namespace, H100_POD, name="holder")["metadata"]["name"]
    wait_until(lambda: not gated(core.read_namespaced_pod(holder, namespace)), "holder released")
    kubernetes.client.BatchV1Api(api_client).create_namespaced_job(
        namespace, gang_job(namespace, "train", 3)
    )
    wait_until(
        lambda: len(of_job(pods(core, namespace), "train")) == 3, "the job's 3 pods", seconds=30
    )
    names = sorted(p.metadata.name for p in of_job(pods(core, namespace), "train"))

    def told_no_room() -> bool:
        told = waiting_events(core, namespace)
        return all(
            "h100 quota has no room for the gang 'train' (job): its 3 waiting pods need 3 at "
            "once, in use 1 of 3" in told.get(n, "")
            for n in names
        )

    wait_until(told_no_room, "each pod of the gang told why it waits", seconds=30)
    never_more_than(core, namespace, 1, 2 * LEASE_SECONDS)
    wait_until(
        lambda: status_shows(api_client, namespace, limit="3", inUse="1", waiting=3),
        "the GPUQuota object to show the gang waiting",
    )

    core.delete_namespaced_pod(holder, namespace, grace_period_seconds=0)
    wait_until(
        lambda: all(not gated(core.read_namespaced_pod(n, namespace)) for n in names),
        "the gang of 3 released",
        seconds=30,
    )
    wait_until(lambda: all(bound(core.read_namespaced_pod(n, namespace)) for n in names), "3 bound")

    def all_told_released() -> bool:
        events = core.list_namespaced_event(namespace, field_selector="reason=GPUQuotaReleased")
        return set(names) <= {e.involved_object.name for e in events.items}

    wait_until(all_told_released, "each pod of the gang told it was released", seconds=30)


def test_two_gangs_for_one_room_run_in_turn_without_deadlock(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    batch = kubernetes.client.BatchV1Api(api_client)
    gpuadm.set_quotas(queue_quota(namespace, 2))
    batch.create_namespaced_job(namespace, gang_job(namespace, "first", 2))
    batch.create_namespaced_job(namespace, gang_job(namespace, "second", 2))

    def one_gang_released() -> bool:
        found = pods(core, namespace)
        return len(found) == 4 and sum(not gated(p) for p in found) == 2

    wait_until(one_gang_released, "one gang released, the other waiting", seconds=30)
    found = pods(core, namespace)
    running = [p for p in found if not gated(p)]
    # Whole gangs only: the two pods released are of one job.
    jobs = {p.metadata.labels["batch.kubernetes.io/job-name"] for p in running}
    assert len(jobs) == 1, [p.metadata.name for p in running]
    (ahead,) = jobs
    behind = "second" if ahead == "first" else "first"
    never_more_than(core, namespace, 2, LEASE_SECONDS)

    end_as_the_kubelet_would(core, namespace, [p.metadata.name for p in running])
    wait_until(
        lambda: batch.read_namespaced_job_status(ahead, namespace).status.succeeded == 2,
        f"job {ahead} to complete",
    )
    wait_until(
        lambda: all(not gated(p) for p in of_job(pods(core, namespace), behind)),
        f"job {behind}'s gang released once {ahead} ended",
        seconds=30,
    )
    later = of_job(pods(core, namespace), behind)
    assert len(later) == 2
    end_as_the_kubelet_would(core, namespace, [p.metadata.name for p in later])
    wait_until(
        lambda: batch.read_namespaced_job_status(behind, namespace).status.succeeded == 2,
        f"job {behind} to complete",
    )


@pytest.fixture(scope="module")
def pod_group_crd(api_client: kubernetes.client.ApiClient) -> Iterator[None]:
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    try:
        extensions.create_custom_resource_definition(POD_GROUP_CRD)
    except ApiException as error:
        if error.status != 409:
            raise

    def served() -> bool:
        crd = extensions.read_custom_resource_definition("podgroups.scheduling.x-k8s.io")
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or ()
        )

    wait_until(served, "the PodGroup CRD established")
    yield
    extensions.delete_custom_resource_definition("podgroups.scheduling.x-k8s.io")


def test_a_coscheduling_pod_group_waits_until_whole_then_goes_together(
    gpuadm: Deployment,
    namespace: str,
    api_client: kubernetes.client.ApiClient,
    pod_group_crd: None,
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 4))
    kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "scheduling.x-k8s.io",
        "v1alpha1",
        namespace,
        "podgroups",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "workers"},
            "spec": {"minMember": 3},
        },
    )

    def member(name: str) -> str:
        body = pod_body(H100_POD, name=name)
        body["metadata"].setdefault("labels", {})["scheduling.x-k8s.io/pod-group"] = "workers"
        stored = core.create_namespaced_pod(namespace, body)
        assert any(g.name == GATE for g in stored.spec.scheduling_gates)
        return str(stored.metadata.name)

    first = [member("w0"), member("w1")]
    wait_until(
        lambda: all(
            "is not whole: 2 of its 3 pods exist, it waits for 1 more"
            in waiting_events(core, namespace).get(n, "")
            for n in first
        ),
        "the first two told the gang is not whole",
        seconds=30,
    )
    assert all(gated(core.read_namespaced_pod(n, namespace)) for n in first)
    last = member("w2")
    wait_until(
        lambda: all(not gated(core.read_namespaced_pod(n, namespace)) for n in [*first, last]),
        "the pod group released whole",
        seconds=30,
    )


def test_a_leader_killed_mid_release_of_a_gang_releases_it_whole_and_charges_it_once(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 8))
    annotations = {"gpuadm.io/gang": "big", "gpuadm.io/gang-size": "8"}
    names = [
        gpuadm.create_pod(namespace, H100_POD, name=f"g{i}", annotations=annotations)["metadata"][
            "name"
        ]
        for i in range(7)
    ]
    wait_until(
        lambda: all(
            "it waits for 1 more" in waiting_events(core, namespace).get(n, "") for n in names
        ),
        "the gang told it waits for its eighth pod",
        seconds=30,
    )
    leader = next(p for p in gpuadm.processes if p.leading())
    try:
        names.append(
            gpuadm.create_pod(namespace, H100_POD, name="g7", annotations=annotations)["metadata"][
                "name"
            ]
        )
        # The leader charges all 8 in one write, then removes their gates one by one: it is
        # killed as soon as the first gate is gone.
        wait_until(
            lambda: any(not gated(p) for p in pods(core, namespace)), "the first gate removed"
        )
        leader.kill()
        at_kill = sum(not gated(p) for p in pods(core, namespace))
        wait_until(
            lambda: all(not gated(p) for p in pods(core, namespace)),
            "the whole gang released",
            seconds=30,
        )
        wait_until(
            lambda: status_shows(api_client, namespace, limit="8", inUse="8", waiting=0),
            "the GPUQuota object to count each pod of the gang once",
        )
        print(f"\nleader killed with {at_kill} of 8 gates removed; the next removed the rest")
    finally:
        leader.start()
        wait_until(leader.ready, "the killed replica back", leader.log_tail)


def test_enforce_mode_refuses_a_gangs_first_pod_unless_the_whole_gang_fits(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    batch = kubernetes.client.BatchV1Api(api_client)
    gpuadm.set_quotas(f"namespaces:\n  {namespace}:\n    h100: 3\n")
    holder = gpuadm.create_pod(namespace, H100_POD, name="holder")["metadata"]["name"]
    batch.create_namespaced_job(namespace, gang_job(namespace, "train", 3))

    def refused_whole() -> bool:
        events = core.list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
        return any(
            "the gang 'train' of 3 (job) needs 3 at once (3 pods of 1), in use 1 of 3: its "
            "first pod is refused" in e.message
            for e in events
        )

    def seen() -> str:
        events = core.list_namespaced_event(namespace).items
        return (
            "\n".join(f"{e.reason}: {e.message}" for e in events)
            + "\npods: "
            + ", ".join(p.metadata.name for p in pods(core, namespace))
        )

    wait_until(refused_whole, "the job controller told the gang's first pod was refused", seen)
    assert of_job(pods(core, namespace), "train") == []  # no part of the gang runs
    core.delete_namespaced_pod(holder, namespace, grace_period_seconds=0)
    # Room for all three: the job controller's next try makes them, the first setting aside
    # the room the other two are charged against.
    wait_until(
        lambda: len(of_job(pods(core, namespace), "train")) == 3,
        "the whole gang created once it fits",
        seconds=90,
    )
    with pytest.raises(ApiException) as full:
        gpuadm.create_pod(namespace, H100_POD, name="one-more")
    assert "in use 3 of 3" in full.value.body


def test_a_job_that_could_never_fit_is_refused_at_its_first_pod_in_queue_mode(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 2))
    kubernetes.client.BatchV1Api(api_client).create_namespaced_job(
        namespace, gang_job(namespace, "huge", 3)
    )

    def refused() -> bool:
        events = core.list_namespaced_event(namespace, field_selector="reason=FailedCreate").items
        return any(
            "more than the whole limit of 2, so the gang could never run (the gang 'huge' of 3 "
            "(job): 3 pods of 1 at once)" in e.message
            for e in events
        )

    wait_until(refused, "the job controller told the gang could never run")
    assert of_job(pods(core, namespace), "huge") == []
