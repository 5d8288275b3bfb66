"""The leader's cohort work: borrowed pods marked, and evicted for a lender's waiting pod."""

from __future__ import annotations

import copy
import functools
from fractions import Fraction
from typing import Any

from policies import plan, require_fixed_point
from policies.quota.borrowing import BORROWED
from tests.builders import POLICY_YAML
from tests.webhook.leader.test_release import Cluster
from tests.webhook.quota.test_queue_ledger import request, stored_pod
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.reclaim import CohortKeeper
from webhook.observe.metrics import Metrics
from webhook.quota.claims import claims_in
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex

QUOTAS = """
mode: queue
namespaces:
  team-a: {cohort: research, h100: 1, borrow: {h100: 3}}
  team-b: {cohort: research, h100: 3, reclaim: RECLAIM}
"""


@functools.cache
def config(reclaim: str = "any") -> ConfigSnapshot:
    return snapshot_from_text(
        POLICY_YAML, QUOTAS.replace("RECLAIM", reclaim), policy_source="p", quotas_source="q"
    )


class Evictions(Cluster):
    """The stand-in's pods can be evicted; those named in `budgets` are protected (429)."""

    def __init__(self, *pods: dict[str, Any], budgets: set[str] | None = None) -> None:
        super().__init__(*pods)
        self.budgets = budgets or set()
        self.evicted: list[str] = []
        self.recorded: list[tuple[str, str, str]] = []

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        found = self.pods.get((namespace, name))
        if found is None or found["metadata"]["uid"] != uid:
            raise KubeError(404, "not found")
        if name in self.budgets:
            raise KubeError(
                429, "Cannot evict pod as it would violate the pod's disruption budget."
            )
        found["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self.evicted.append(name)

    async def record_event(self, **event: Any) -> None:
        self.recorded.append((event["name"], event["reason"], event["message"]))


def keeper(
    cluster: Evictions,
    usage: UsageIndex,
    reclaim: str = "any",
    store: MemoryStore | None = None,
    snapshot: ConfigSnapshot | None = None,
) -> CohortKeeper:
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    ledger = QuotaLedger(usage, store or MemoryStore(), pods_visible=True)
    return CohortKeeper(
        ledger.line,
        usage,
        ConfigHolder(snapshot or config(reclaim)),
        api,
        leading=lambda: True,
        ready=lambda: True,
        metrics=Metrics(),
    )


def observe(usage: UsageIndex, reclaim: str, *pods: dict[str, Any]) -> None:
    snapshot = config(reclaim)
    for body in pods:
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)


def borrowers_and_a_lender(reclaim: str = "any") -> tuple[UsageIndex, Evictions, list[Any]]:
    """team-a runs 4 pods (1 nominal, 3 borrowed, the whole of team-b's idle 3); team-b,
    within its nominal 3, waits with one pod."""
    running = [stored_pod({"gpuadm.io/h100": "1"}, "team-a") for _ in range(4)]
    waiting = stored_pod({"gpuadm.io/h100": "1"}, "team-b", gated=True, priority=5)
    usage = UsageIndex()
    observe(usage, reclaim, *running, waiting)
    return usage, Evictions(*running, waiting), running


async def test_the_newest_borrowed_pod_is_evicted_for_a_lender_s_waiting_pod_and_only_it() -> None:
    usage, cluster, running = borrowers_and_a_lender()
    work = keeper(cluster, usage)
    await work.pass_once()
    newest = running[-1]["metadata"]["name"]
    assert cluster.evicted == [newest]
    assert (newest, "GPUQuotaReclaimed") in [(n, r) for n, r, _ in cluster.recorded]
    told = [m for n, r, m in cluster.recorded if r == "GPUQuotaReclaiming"]
    assert told == ["gpuadm evicted borrowed pods in cohort research to return 1 h100 to team-b"]
    # The next pass, before the watch shows the eviction, evicts nothing more.
    await work.pass_once()
    assert cluster.evicted == [newest]


async def test_a_new_leader_sees_the_eviction_under_way_and_evicts_nothing_more() -> None:
    usage, cluster, _running = borrowers_and_a_lender()
    await keeper(cluster, usage).pass_once()
    evicted = cluster.pods["team-a", cluster.evicted[0]]
    observe(usage, "any", copy.deepcopy(evicted))  # the watch shows its deletionTimestamp
    successor = keeper(cluster, usage)
    await successor.pass_once()
    assert len(cluster.evicted) == 1


async def test_an_eviction_a_disruption_budget_refuses_moves_on_to_the_next() -> None:
    usage, cluster, running = borrowers_and_a_lender()
    names = [p["metadata"]["name"] for p in running]
    cluster.budgets = {names[-1]}
    work = keeper(cluster, usage)
    await work.pass_once()
    assert cluster.evicted == [names[-2]]
    assert (
        work.metrics.cohort_reclaims.labels("research", "h100", "disruption_budget")._value.get()
        == 1
    )


async def test_reclaim_never_and_lower_priority_evict_nothing_they_may_not() -> None:
    for reclaim in ("never", "lowerPriority"):
        usage, cluster, running = borrowers_and_a_lender(reclaim)
        for body in running:  # the borrowers outrank the waiting pod (priority 5)
            body["spec"]["priority"] = 7
        observe(usage, reclaim, *running)
        await keeper(cluster, usage, reclaim).pass_once()
        assert cluster.evicted == [], reclaim


async def test_the_borrowed_pods_are_labelled_and_the_nominal_ones_are_not() -> None:
    usage, cluster, running = borrowers_and_a_lender("never")
    work = keeper(cluster, usage, "never")
    await work.pass_once()
    labelled = [
        name
        for (ns, name), body in cluster.pods.items()
        if (body["metadata"].get("labels") or {}).get(BORROWED) == "true"
    ]
    assert sorted(labelled) == sorted(p["metadata"]["name"] for p in running[1:])
    first = cluster.pods["team-a", running[1]["metadata"]["name"]]
    assert first["metadata"]["annotations"][BORROWED] == "1 h100 from cohort research"
    # The oldest pod ends: the next is within the nominal quota now, and loses its label.
    del cluster.pods["team-a", running[0]["metadata"]["name"]]
    usage.forget(running[0]["metadata"]["uid"])
    for (_ns, _name), body in cluster.pods.items():
        observe(usage, "never", copy.deepcopy(body))
    await work.pass_once()
    assert BORROWED not in (
        cluster.pods["team-a", running[1]["metadata"]["name"]]["metadata"].get("labels") or {}
    )
    gauge = work.metrics.cohort_borrowed.labels("research", "team-a", "h100")._value.get()
    assert gauge == 2


SPLIT_QUOTAS = """
mode: queue
namespaces:
  team-a: {cohort: research, h100: 1, a100: 2, reclaim: any}
  team-b: {cohort: research, h100: 3}
"""


async def test_a_members_pods_of_a_class_it_has_no_limit_of_are_never_borrowed() -> None:
    """team-b may run as many A100s as it likes: they are its own, not team-a's lent quota,
    so team-a's waiting A100 pod evicts none of them, and none is labelled borrowed."""
    snapshot = snapshot_from_text(POLICY_YAML, SPLIT_QUOTAS, policy_source="p", quotas_source="q")
    running = [stored_pod({"gpuadm.io/a100": "1"}, "team-b") for _ in range(3)]
    waiting = stored_pod({"gpuadm.io/a100": "1"}, "team-a", gated=True, priority=5)
    usage = UsageIndex()
    for body in (*running, waiting):
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    cluster = Evictions(*running, waiting)
    work = keeper(cluster, usage, snapshot=snapshot)
    await work.pass_once()
    assert cluster.evicted == []
    assert not [
        name
        for (_ns, name), body in cluster.pods.items()
        if BORROWED in (body["metadata"].get("labels") or {})
    ]
    for ns in ("team-a", "team-b"):
        gauge = work.metrics.cohort_borrowed.labels("research", ns, "a100")._value.get()
        assert gauge == 0, ns


async def test_a_waiting_pod_the_record_charges_already_needs_nothing_back() -> None:
    """Released (charged, its gate about to go), the lender's pod holds its room: nothing
    more is evicted for it."""
    usage, cluster, running = borrowers_and_a_lender()
    store = MemoryStore()
    work = keeper(cluster, usage, store=store)
    await work.pass_once()
    assert len(cluster.evicted) == 1
    gone = running[-1]["metadata"]["uid"]
    usage.forget(gone)  # the kubelet ended it; the line's next turn charges team-b's pod
    ledger = QuotaLedger(usage, store, pods_visible=True)
    released, _ = await ledger.line.release("team-b", config("any").quotas)
    assert [p.namespace for p in released] == ["team-b"]
    await work.pass_once()
    assert len(cluster.evicted) == 1


async def test_an_enforce_lender_s_refused_pod_leaves_a_claim_the_leader_evicts_for() -> None:
    snapshot = snapshot_from_text(
        POLICY_YAML,
        QUOTAS.replace("RECLAIM", "any").replace("mode: queue", "mode: enforce"),
        policy_source="p",
        quotas_source="q",
    )
    running = [stored_pod({"gpuadm.io/h100": "1"}, "team-a") for _ in range(4)]
    usage = UsageIndex()
    for body in running:
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    store = MemoryStore()
    admitting = QuotaLedger(usage, store, pods_visible=True)
    body = stored_pod({"gpuadm.io/h100": "1"}, "team-b", priority=3)
    refused = await admitting.admit(
        request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert refused is not None
    assert not refused.allowed
    assert "reclaim: any: gpuadm evicts borrowed pods to return it; retry" in (
        refused.message or ""
    )
    claims = claims_in((await store.read("cohort.research")).reservations)
    assert [(c.namespace, c.class_name, c.charge, c.priority) for c in claims] == [
        ("team-b", "h100", Fraction(1), 3)
    ]
    cluster = Evictions(*running)
    await keeper(cluster, usage, store=store, snapshot=snapshot).pass_once()
    assert cluster.evicted == [running[-1]["metadata"]["name"]]
    # The claim is no reservation of a pod: reports do not show it.
    assert await admitting.line.reserved("team-b", "cohort.research") == {}
