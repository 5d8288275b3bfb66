"""Gangs in queue mode, through admission, the record and the leader's turns: a gang's pods
wait uncharged, are charged together in one write once the gang is whole and fits, and are
ungated together."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from tests.webhook.leader.test_release import Cluster
from tests.webhook.quota.test_queue_ledger import (
    admit_gated,
    config,
    observe,
    stored_charges,
    stored_pod,
    uid,
    ungated,
)
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.events import EventWriter, PodEvents
from webhook.leader.release import Releaser
from webhook.observe.metrics import Metrics
from webhook.quota.gang_sizes import GangSizes
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex

H100 = {"gpuadm.io/h100": "1"}  # team-q may hold 2 h100


class Jobs(Cluster):
    """The stand-in's pods and Events, and Jobs by name; a read can be made to fail."""

    def __init__(self, *pods: dict[str, Any], jobs: dict[str, int] | None = None) -> None:
        super().__init__(*pods)
        self.jobs = {name: {"spec": {"parallelism": n}} for name, n in (jobs or {}).items()}
        self.failing = False
        self.reads = 0

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.failing:
            raise KubeError(503, "the apiserver is shutting down")
        return copy.deepcopy(self.jobs.get(name))


def member(gang: str, *, size: int | None = None, job: str | None = None) -> dict[str, Any]:
    body = stored_pod(H100, gated=True)
    if size is not None:
        body["metadata"].setdefault("annotations", {}).update(
            {"gpuadm.io/gang": gang, "gpuadm.io/gang-size": str(size)}
        )
    if job is not None:
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": "j", "controller": True}
        ]
    return body


def leader(
    ledger: QuotaLedger, usage: UsageIndex, cluster: Jobs, quotas: str | None = None
) -> Releaser:
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    snapshot = config() if quotas is None else config(quotas)
    sizes = GangSizes(api, usage, strict=lambda _namespace: False, ttl=0)
    return Releaser(
        ledger.line,
        usage,
        ConfigHolder(snapshot),
        api,
        EventWriter(
            PodEvents(api, "gpuadm-0"),
            usage,
            lambda namespace: ledger.line.placer(
                namespace, snapshot.quotas.limits_for(namespace), gangs=sizes.known(namespace)
            ),
            sweep_every=0,  # each step may sweep a line again: the tests drive it
        ),
        leading=lambda: True,
        ready=lambda: True,
        metrics=Metrics(),
        gang_sizes=sizes,
    )


async def test_a_gang_that_fits_waits_at_admission_then_goes_whole_in_one_write() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    pods = [member("pair", size=2), member("pair", size=2)]
    for body in pods:
        verdict = await admit_gated(ledger, body)
        assert verdict.allowed, verdict
        assert verdict.queued
        assert "is a gang: its pods go together" in (verdict.message or "")
        observe(usage, body)
    assert await stored_charges(store, "team-q") == {}
    cluster = Jobs(*pods)
    writes = store.writes

    await leader(ledger, usage, cluster).pass_once()
    assert await stored_charges(store, "team-q") == {uid(p): 1 for p in pods}
    assert store.writes == writes + 1
    assert sorted(cluster.patched) == sorted(p["metadata"]["name"] for p in pods)


async def test_a_job_of_three_under_a_limit_of_two_runs_none_and_says_it_never_could() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    pods = [member("", job="train") for _ in range(3)]
    observe(usage, *pods)
    cluster = Jobs(*pods, jobs={"train": 3})
    releaser = leader(ledger, usage, cluster)

    await releaser.pass_once()
    assert await stored_charges(store, "team-q") == {}
    assert cluster.patched == []
    await releaser.events.step()
    told = {e["involvedObject"]["name"]: e["message"] for e in cluster.events.values()}
    assert set(told) == {p["metadata"]["name"] for p in pods}
    for message in told.values():
        assert (
            "h100 quota: the gang 'train' (job) needs 3 at once for its 3 waiting pods, more "
            "than the whole limit of 2, so it could never run; it waits until the limit grows"
        ) in message


async def test_a_job_of_two_with_room_for_one_waits_whole_and_holds_back_the_pod_behind() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    other = ungated(stored_pod(H100, gated=True))
    pods = [member("", job="pair") for _ in range(2)]
    small = stored_pod(H100, gated=True)  # created after the gang: behind it in line
    observe(usage, other, *pods, small)
    cluster = Jobs(other, *pods, small, jobs={"pair": 2})
    releaser = leader(ledger, usage, cluster)

    await releaser.pass_once()
    assert cluster.patched == []  # one h100 free: neither the gang nor the pod behind it
    await releaser.events.step()
    told = {e["involvedObject"]["name"]: e["message"] for e in cluster.events.values()}
    assert (
        "has no room for the gang 'pair' (job): its 2 waiting pods need 2 at once, in use 1 "
        "of 2" in told[pods[0]["metadata"]["name"]]
    )
    assert "quota is held for the pods ahead" in told[small["metadata"]["name"]]

    del cluster.pods[("team-q", other["metadata"]["name"])]
    usage.forget(uid(other))
    releaser.wake_all()
    await releaser.pass_once()
    assert await stored_charges(store, "team-q") == {uid(p): 1 for p in pods}


async def test_a_job_gang_not_yet_whole_waits_and_goes_once_its_last_pod_comes() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    first = member("", job="pair")
    observe(usage, first)
    cluster = Jobs(first, jobs={"pair": 2})
    releaser = leader(ledger, usage, cluster)

    await releaser.pass_once()
    assert cluster.patched == []
    await releaser.events.step()
    by_reason = {e["reason"]: e for e in cluster.events.values()}
    assert (
        "the gang 'pair' (job) is not whole: 1 of its 2 pods exist, it waits for 1 more"
        in (by_reason["GPUQuotaWaiting"]["message"])
    )
    # Created long before this test's clock: past the timeout, the gang is warned of too.
    warning = by_reason["GPUQuotaGangIncomplete"]
    assert warning["type"] == "Warning"
    assert warning["message"] == (
        "gang still not whole after 120 s: the gang 'pair' (job) is not whole: 1 of its 2 pods "
        "exist, it waits for 1 more"
    )

    second = member("", job="pair")
    observe(usage, second)
    cluster.pods[("team-q", second["metadata"]["name"])] = second
    releaser.wake_all()
    await releaser.pass_once()
    assert await stored_charges(store, "team-q") == {uid(first): 1, uid(second): 1}


async def test_a_replaced_worker_joins_its_running_gang() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    running = ungated(member("", job="pair"))
    observe(usage, running)
    replacement = member("", job="pair")
    observe(usage, replacement)
    cluster = Jobs(running, replacement, jobs={"pair": 2})

    await leader(ledger, usage, cluster).pass_once()
    assert await stored_charges(store, "team-q") == {uid(replacement): 1}


async def test_a_failed_read_keeps_the_size_read_last_and_without_one_the_gang_waits() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    first = member("", job="pair")
    observe(usage, first)
    cluster = Jobs(first, jobs={"pair": 2})
    cluster.failing = True
    releaser = leader(ledger, usage, cluster)

    await releaser.pass_once()
    said = releaser.gang_sizes.known("team-q").unknown["job/pair"]
    assert said.startswith("gpuadm cannot read its Job pair (")
    assert said.endswith("the apiserver is shutting down); it tries again")
    cluster.failing = False
    releaser.wake_all()
    await releaser.pass_once()
    assert releaser.gang_sizes.known("team-q").sizes == {"job/pair": 2}
    cluster.failing = True
    releaser.wake_all()
    await releaser.pass_once()
    assert cluster.reads == 3
    assert releaser.gang_sizes.known("team-q").sizes == {"job/pair": 2}


async def test_a_gang_whose_job_is_gone_waits_and_says_so() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    orphan = member("", job="gone")
    observe(usage, orphan)
    cluster = Jobs(orphan)
    releaser = leader(ledger, usage, cluster)
    await releaser.pass_once()
    assert cluster.patched == []
    assert releaser.gang_sizes.known("team-q").unknown == {
        "job/gone": "its Job gone does not exist"
    }


async def test_pods_that_disagree_on_their_gang_size_wait() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    pods = [member("g", size=2), member("g", size=1)]
    observe(usage, *pods)
    cluster = Jobs(*pods)
    releaser = leader(ledger, usage, cluster)
    await releaser.pass_once()
    assert cluster.patched == []
    assert cluster.reads == 0  # sized on the pods: nothing to read
    assert "disagree on its size (1, 2)" in releaser.gang_sizes.known("team-q").unknown["gpuadm/g"]


async def test_a_leader_that_dies_after_charging_a_gang_leaves_the_next_only_its_gates() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    pods = [member("pair", size=2), member("pair", size=2)]
    observe(usage, *pods)
    # The first leader charges the gang, then dies before removing any gate.
    dead = QuotaLedger(usage, store, pods_visible=True)
    cluster = Jobs(*pods)
    to_release, _ = await dead.line.release(
        "team-q",
        config().quotas,
        gangs=GangSizes(None, usage, strict=lambda _n: False).known("team-q"),
    )
    assert {w.uid for w in to_release} == {uid(p) for p in pods}
    writes = store.writes
    ledger = QuotaLedger(usage, store, pods_visible=True)

    await leader(ledger, usage, cluster).pass_once()
    assert await stored_charges(store, "team-q") == {uid(p): 1 for p in pods}
    assert store.writes == writes  # nothing charged twice: only the gates go
    assert sorted(cluster.patched) == sorted(p["metadata"]["name"] for p in pods)


async def test_a_pod_naming_its_gang_badly_is_refused_in_line() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    body = member("g", size=2)
    body["metadata"]["annotations"]["gpuadm.io/gang-size"] = "two"
    verdict = await admit_gated(ledger, body)
    assert not verdict.allowed
    assert "gpuadm.io/gang-size is 'two': a gang's size is a whole number from 1 to 10000" in (
        verdict.message or ""
    )


class Groups(Jobs):
    """The stand-in, with PodGroups of each form by name."""

    def __init__(self, *pods: dict[str, Any], groups: dict[tuple[str, str], int]) -> None:
        super().__init__(*pods)
        self.groups = groups

    async def get_pod_group(self, form: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if (form, name) not in self.groups:
            return None
        return {"spec": {"minMember": self.groups[form, name]}}


async def test_a_turn_reads_a_bounded_number_of_sizes_and_podgroups_by_their_form() -> None:
    usage = UsageIndex()
    pods = []
    for form, key, where in [
        ("coscheduling", "scheduling.x-k8s.io/pod-group", "labels"),
        ("volcano", "scheduling.k8s.io/group-name", "annotations"),
        ("kai", "pod-group-name", "annotations"),
    ]:
        body = stored_pod(H100, gated=True)
        body["metadata"].setdefault(where, {})[key] = f"{form}-group"
        pods.append(body)
    observe(usage, *pods)
    cluster = Groups(
        *pods, groups={("coscheduling", "coscheduling-group"): 3, ("volcano", "volcano-group"): 0}
    )
    stand_in: Any = cluster
    sizes = GangSizes(stand_in, usage, strict=lambda _namespace: False, reads_per_turn=2)

    first = await sizes.read("team-q")
    assert cluster.reads == 2
    assert len(first.sizes) + len(first.unknown) == 2
    known = await sizes.read("team-q")
    assert cluster.reads == 3  # the third gang now; the first two are kept
    assert known.sizes == {"coscheduling/coscheduling-group": 3, "volcano/volcano-group": 1}
    assert known.unknown == {"kai/kai-group": "its PodGroup kai-group (kai) does not exist (yet)"}


async def test_a_gang_still_assembling_within_its_timeout_gets_no_warning() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    first = member("", job="pair")
    observe(usage, first)
    cluster = Jobs(first, jobs={"pair": 2})
    releaser = leader(ledger, usage, cluster)
    created = datetime.fromisoformat(first["metadata"]["creationTimestamp"]).timestamp()
    releaser.events.events.wall_clock = lambda: created + 119
    await releaser.pass_once()
    await releaser.events.step()
    assert {e["reason"] for e in cluster.events.values()} == {"GPUQuotaWaiting"}
    releaser.events.events.wall_clock = lambda: created + 120
    releaser.events.wake_all()
    await releaser.events.step()
    assert {e["reason"] for e in cluster.events.values()} == {
        "GPUQuotaWaiting",
        "GPUQuotaGangIncomplete",
    }


async def test_a_gang_that_could_never_fit_is_refused_at_its_first_pod() -> None:
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=True)
    verdict = await admit_gated(ledger, member("trio", size=3))  # team-q may hold 2 h100
    assert not verdict.allowed
    assert verdict.message == (
        'namespace "team-q": h100 quota exceeded: requested 3, more than the whole limit of 2, '
        "so the gang could never run (the gang 'trio' of 3 (gpuadm): 3 pods of 1 at once)"
    )
    # One that fits whole waits, uncharged, for the leader.
    fits = await admit_gated(ledger, member("pair", size=2))
    assert fits.allowed
    assert fits.queued
