"""Queue mode through the real apiserver, scheduler and job controller: pods that do not fit
wait behind gpuadm's scheduling gate and are released, in order, as room frees up; tenants
read their quota through the standard `view` role; `gpuadm quota` counts the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment
from tests.e2e.gpuadm import LEASE_SECONDS, NAMESPACE, wait_until
from tests.e2e.nodes import H100, Pool, pools_created
from tests.e2e.scheduling import Scheduler
from tests.support import ROOT

GATE = "gpuadm.io/quota"
# Two nodes of four H100s: room for more than any namespace's quota here, so what holds a
# pod back is its quota, never the nodes.
POOL = Pool("queue-h100", "h100", H100, "nvidia", size=2, gpus_per_node=4)
H100_POD = {"gpuadm.io/h100": "1"}

pytestmark = pytest.mark.usefixtures("queue_nodes", "controller_manager")


@pytest.fixture(scope="module")
def queue_nodes(core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler) -> Iterator[None]:
    with pools_created(core_v1, [POOL]) as names:
        scheduler.wait_until_seen(names[-1])
        yield


def queue_quota(namespace: str, limit: int) -> str:
    return f"namespaces:\n  {namespace}:\n    mode: queue\n    h100: {limit}\n"


def pods(core: kubernetes.client.CoreV1Api, namespace: str) -> list[Any]:
    """Return the namespace's pods that are not being deleted."""
    items = core.list_namespaced_pod(namespace).items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def gated(pod: Any) -> bool:
    return any(g.name == GATE for g in pod.spec.scheduling_gates or ())


def bound(pod: Any) -> bool:
    return bool(pod.spec.node_name)


def waiting_events(core: kubernetes.client.CoreV1Api, namespace: str) -> dict[str, str]:
    """Return the GPUQuotaWaiting message of each pod that has one, by pod name."""
    events = core.list_namespaced_event(namespace, field_selector="reason=GPUQuotaWaiting").items
    return {e.involved_object.name: e.message for e in events}


def gpuquota(api: kubernetes.client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = kubernetes.client.CustomObjectsApi(api)
    found: dict[str, Any] = custom.get_namespaced_custom_object(
        "gpuadm.io", "v1alpha1", namespace, "gpuquotas", name
    )
    return found


def status_shows(api: kubernetes.client.ApiClient, namespace: str, **expected: Any) -> bool:
    try:
        status = gpuquota(api, namespace, "h100").get("status") or {}
    except ApiException:
        return False
    return all(status.get(k) == v for k, v in expected.items())


def gpuadm_quota(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    """Run `gpuadm quota -n NS -o json` as an admin would."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "quota",
            "-n",
            namespace,
            "-o",
            "json",
            "--gpuadm-namespace",
            NAMESPACE,
            "--kubeconfig",
            str(plane.kubeconfig_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_pods_beyond_their_quota_wait_and_are_released_one_for_one(
    gpuadm: Deployment,
    namespace: str,
    api_client: kubernetes.client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 4))
    # Pods of no gang (a Job's pods are one: tests/e2e/test_gangs.py), each judged alone.
    for i in range(6):
        gpuadm.create_pod(namespace, H100_POD, name=f"worker-{i}")

    def four_bound_two_waiting() -> bool:
        found = pods(core, namespace)
        return (
            len(found) == 6
            and sum(bound(p) for p in found) == 4
            and sum(gated(p) for p in found) == 2
        )

    wait_until(four_bound_two_waiting, "4 pods bound and 2 gated")
    waiting = [p for p in pods(core, namespace) if gated(p)]
    for pod in waiting:
        condition = next(c for c in pod.status.conditions or () if c.type == "PodScheduled")
        assert condition.reason == "SchedulingGated"
    # Each waiting pod says what it waits for and how many pods are ahead of it.
    names = {p.metadata.name for p in waiting}
    # A pod's Event is written when it joins the line and rewritten at most every 5 s, so the
    # first pod to be judged may say "0 pods ahead" until the next pass sees the second.
    expected = ["0 pods ahead of it in line", "1 pod ahead of it in line"]

    def positions_told() -> bool:
        told = waiting_events(core, namespace)
        return names <= told.keys() and (
            sorted(told[n].rsplit("; ", 1)[1] for n in names) == expected
        )

    wait_until(positions_told, "the waiting Events to give each pod its place", seconds=30)
    messages = waiting_events(core, namespace)
    for name in names:
        assert (
            f'namespace "{namespace}": h100 quota exceeded: requested 1, in use 4 of 4'
            in (messages[name])
            or "held for the pods ahead" in messages[name]
        )
    first = next(n for n in names if messages[n].endswith("0 pods ahead of it in line"))

    # The tenant's view, and the admin's command, say the same.
    wait_until(
        lambda: status_shows(api_client, namespace, limit="4", inUse="4", waiting=2),
        "the GPUQuota object to show 4 in use and 2 waiting",
    )
    status = gpuquota(api_client, namespace, "h100")["status"]
    assert [q["pod"] for q in status["queue"]] == [first, *(names - {first})]
    report = next(
        r for r in gpuadm_quota(control_plane, namespace)["items"] if r["class"] == "h100"
    )
    assert {
        k: report[k] for k in ("limit", "inUse", "reserved", "waiting", "holders", "queue")
    } == {k: status[k] for k in ("limit", "inUse", "reserved", "waiting", "holders", "queue")}

    # Deleting a running pod releases exactly one waiting pod: the first in line.
    victim = next(p for p in pods(core, namespace) if bound(p))
    freed = time.monotonic()
    core.delete_namespaced_pod(victim.metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not gated(core.read_namespaced_pod(first, namespace)), f"{first} released")
    released_after = time.monotonic() - freed
    deadline = time.monotonic() + 3 * LEASE_SECONDS
    while time.monotonic() < deadline:  # and nothing more, for a while
        found = pods(core, namespace)
        assert sum(not gated(p) for p in found) <= 4, [p.metadata.name for p in found]
        time.sleep(0.2)
    found = pods(core, namespace)
    assert len(found) == 5
    assert sum(not gated(p) for p in found) == 4
    assert sum(gated(p) for p in found) == 1
    wait_until(lambda: all(bound(p) for p in pods(core, namespace) if not gated(p)), "4 bound")
    released = [
        e for e in core.list_namespaced_event(namespace).items if e.reason == "GPUQuotaReleased"
    ]
    assert [e.involved_object.name for e in released] == [first]
    print(f"\nfreed slot to the next pod's release: {released_after:.2f} s")


def test_a_pod_that_could_never_fit_is_refused_at_once(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(queue_quota(namespace, 2))
    message = gpuadm.refusal(namespace, {"gpuadm.io/h100": "3"})
    assert "more than the whole limit of 2, so the pod could never run" in message


def test_a_deleted_waiting_pod_leaves_the_line(gpuadm: Deployment, namespace: str) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 1))
    created = time.monotonic()
    holder = create_in_line(gpuadm, namespace, "holder")
    released(core, namespace, holder)
    print(f"\na pod that fits, created to ungated: {time.monotonic() - created:.2f} s")
    second = create_in_line(gpuadm, namespace, "second")
    third = create_in_line(gpuadm, namespace, "third")
    told_waiting(core, namespace, second, "0 pods ahead")
    told_waiting(core, namespace, third, "1 pod ahead")
    core.delete_namespaced_pod(second, namespace, grace_period_seconds=0)
    told_waiting(core, namespace, third, "0 pods ahead")
    freed = time.monotonic()
    core.delete_namespaced_pod(holder, namespace, grace_period_seconds=0)
    wait_until(lambda: not gated(core.read_namespaced_pod(third, namespace)), "third released")
    print(f"\nfreed slot (a bare pod) to the next pod's release: {time.monotonic() - freed:.2f} s")


def test_only_gpuadm_removes_its_gate(gpuadm: Deployment, namespace: str) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 1))
    released(core, namespace, create_in_line(gpuadm, namespace, "holder"))
    waiting = create_in_line(gpuadm, namespace, "waiting")
    told_waiting(core, namespace, waiting, "0 pods ahead")
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod(
            waiting, namespace, [{"op": "remove", "path": "/spec/schedulingGates/0"}]
        )
    assert refused.value.status == 403
    assert f"the scheduling gate {GATE} may be removed by gpuadm only" in refused.value.body


def test_a_pod_that_brings_the_gate_outside_queue_mode_is_refused(
    gpuadm: Deployment, namespace: str
) -> None:
    gpuadm.set_quotas(f"namespaces:\n  {namespace}:\n    h100: 2\n")
    message = gpuadm.refusal(
        namespace, H100_POD, name="own-gate", spec={"schedulingGates": [{"name": GATE}]}
    )
    assert f"the scheduling gate {GATE} is gpuadm's" in message
    assert f'namespace "{namespace}" is in enforce mode: create the pod without it' in message
    # The same pod without it fits, and is charged as any other.
    stored = gpuadm.create_pod(namespace, H100_POD, name="plain")
    assert not stored["spec"].get("schedulingGates")


def create_in_line(gpuadm: Deployment, namespace: str, name: str) -> str:
    """Create a one-H100 pod: in a queue namespace it is created behind the gate, which is
    removed at once if it fits, and stays while it waits."""
    stored = gpuadm.create_pod(namespace, H100_POD, name=name)
    assert any(g["name"] == GATE for g in stored["spec"]["schedulingGates"])
    return name


def released(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> None:
    wait_until(lambda: not gated(core.read_namespaced_pod(name, namespace)), f"{name} released")


def told_waiting(core: kubernetes.client.CoreV1Api, namespace: str, name: str, ahead: str) -> None:
    wait_until(
        lambda: waiting_events(core, namespace).get(name, "").endswith(f"{ahead} of it in line"),
        f"{name} to wait with {ahead}",
    )


def test_killing_the_leader_mid_release_releases_no_pod_twice_and_loses_none(
    gpuadm: Deployment, namespace: str, api_client: kubernetes.client.ApiClient
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 1))
    names = [create_in_line(gpuadm, namespace, f"p{i:02d}") for i in range(12)]
    released(core, namespace, names[0])
    told_waiting(core, namespace, names[-1], "10 pods ahead")
    leader = next(p for p in gpuadm.processes if p.leading())
    try:
        # Room for 6 more: the leader charges them in one write, then removes their gates
        # one by one. It is killed as soon as the first gate is gone.
        gpuadm.set_quotas(queue_quota(namespace, 7))
        wait_until(
            lambda: sum(not gated(p) for p in pods(core, namespace)) > 1,
            "the first release",
            seconds=30,
        )
        leader.kill()
        at_kill = sum(not gated(p) for p in pods(core, namespace))
        started = time.monotonic()
        wait_until(
            lambda: sum(not gated(p) for p in pods(core, namespace)) == 7,
            "7 pods released in all",
            seconds=30,
        )
        took = time.monotonic() - started
        time.sleep(2 * LEASE_SECONDS)  # nothing more is released later either
        found = {p.metadata.name: p for p in pods(core, namespace)}
        assert sorted(found) == names
        assert sum(not gated(p) for p in found.values()) == 7
        # Released in line order: the oldest pods first.
        assert [n for n in names if not gated(found[n])] == names[:7]
        wait_until(
            lambda: status_shows(api_client, namespace, limit="7", inUse="7", waiting=5),
            "the GPUQuota object to count each released pod once",
        )
        print(
            f"\nleader killed with {at_kill - 1} of 6 released; all 6 released "
            f"{took:.2f} s after the kill"
        )
    finally:
        leader.start()
        wait_until(leader.ready, "the killed replica back", leader.log_tail)


def test_a_tenant_with_the_view_role_reads_its_quota(
    gpuadm: Deployment,
    namespace: str,
    api_client: kubernetes.client.ApiClient,
    control_plane: ControlPlane,
) -> None:
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 2))
    released(core, namespace, create_in_line(gpuadm, namespace, "one"))
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "tenant"}})
    kubernetes.client.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant-view"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "tenant", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    tenant = control_plane.api_client()
    tenant.configuration.api_key = {"authorization": token}
    custom = kubernetes.client.CustomObjectsApi(tenant)

    def readable() -> bool:
        try:
            found = custom.get_namespaced_custom_object(
                "gpuadm.io", "v1alpha1", namespace, "gpuquotas", "h100"
            )
        except ApiException as error:
            if error.status in (403, 404):
                return False  # not yet aggregated into view, or not yet published
            raise
        return bool(found["status"].get("inUse") == "1")

    wait_until(readable, "the tenant to read its GPUQuota through view")
    listed = custom.list_namespaced_custom_object("gpuadm.io", "v1alpha1", namespace, "gpuquotas")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["h100"]
    # The view role reads; it does not write, and it does not reach other namespaces.
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object(
            "gpuadm.io", "v1alpha1", namespace, "gpuquotas", "h100", {"status": {"limit": "99"}}
        )
    assert refused.value.status == 403
    with pytest.raises(ApiException) as elsewhere:
        custom.list_namespaced_custom_object(
            "gpuadm.io", "v1alpha1", f"other-{uuid.uuid4().hex[:6]}", "gpuquotas"
        )
    assert elsewhere.value.status == 403
