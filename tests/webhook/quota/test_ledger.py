"""The quota ledger: exact under concurrency, with one replica and with three sharing a store."""

from __future__ import annotations

import asyncio
import functools
import re
import uuid
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest

from policies import plan, require_fixed_point
from policies.quota.judge import QuotaVerdict
from tests.builders import POLICY_YAML, pod
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.quota.ledger import QuotaLedger
from webhook.quota.readings import quota_readings
from webhook.quota.reservations import (
    NO_MARK,
    Allowance,
    Mark,
    MemoryStore,
    Record,
    RecordFull,
    Reservation,
    UnreadableRecord,
)
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

QUOTAS = """
namespaces:
  team-a: {h100: 10, a100: 1}
  team-b: {h100: 0}
  team-w: {h100: 1}
"""
ROUNDS = 20


@functools.cache
def config(quotas: str = QUOTAS) -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q")


def stored_pod(limits: dict[str, str], namespace: str = "team-a") -> dict[str, Any]:
    body = pod(limits)
    body = dict(jsonpatch.apply_patch(body, plan(body, config().policy).patch))
    body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), name=uuid.uuid4().hex[:8])
    return body


def request(body: dict[str, Any], *, dry_run: bool = False) -> AdmissionRequest:
    return AdmissionRequest(
        uid=str(uuid.uuid4()),
        operation="CREATE",
        namespace=body["metadata"]["namespace"],
        name=body["metadata"]["name"],
        object=body,
        old_object=None,
        dry_run=dry_run,
        user="alice",
        groups=(),
    )


async def admit(ledger: QuotaLedger, body: dict[str, Any], **kwargs: Any) -> bool:
    snapshot = config(**kwargs)
    outcome = await ledger.admit(
        request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    return outcome is None or outcome.allowed


async def judged(
    ledger: QuotaLedger, body: dict[str, Any], snapshot: ConfigSnapshot, *, dry_run: bool = False
) -> QuotaVerdict:
    """Return the ledger's verdict on a pod that a limit applies to."""
    outcome = await ledger.admit(
        request(body, dry_run=dry_run), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert outcome is not None, "a limit applies to this pod, so the ledger must judge it"
    return outcome


def ledger(store: MemoryStore | None = None, **kwargs: Any) -> QuotaLedger:
    return QuotaLedger(UsageIndex(), store or MemoryStore(), pods_visible=True, **kwargs)


@pytest.mark.parametrize("replicas", [1, 3])
async def test_fifty_concurrent_creates_against_room_for_ten_admit_exactly_ten(
    replicas: int,
) -> None:
    for _ in range(ROUNDS):
        store = MemoryStore()
        ledgers = [ledger(store) for _ in range(replicas)]
        pods = [stored_pod({"gpuadm.io/h100": "1"}) for _ in range(50)]
        results = await asyncio.gather(
            *(admit(ledgers[i % replicas], body) for i, body in enumerate(pods))
        )
        assert sum(results) == 10
        assert len((await store.read("team-a")).reservations) == 10
        # Admissions that wait on one replica's write go together in its next one: one write
        # for one replica, at most one per admitted pod for several.
        if replicas == 1:
            assert store.writes == 1
        else:
            assert store.writes <= 10
        if replicas > 1:
            assert store.conflicts > 0, "the replicas never raced; the test proves nothing"


async def test_ten_shares_of_a_tenth_fill_a_quota_of_one_exactly() -> None:
    quota = ledger()
    results = [await admit(quota, stored_pod({"gpuadm.io/a100": "0.1"})) for _ in range(11)]
    assert results == [True] * 10 + [False]


async def test_denial_names_namespace_class_requested_used_and_limit() -> None:
    quota = ledger()
    for _ in range(3):
        assert await admit(quota, stored_pod({"gpuadm.io/h100": "3"}))
    snapshot = config()
    body = stored_pod({"gpuadm.io/h100": "2"})
    outcome = await judged(quota, body, snapshot)
    assert outcome.message == 'namespace "team-a": h100 quota exceeded: requested 2, in use 9 of 10'


async def test_a_dry_run_is_judged_but_reserves_nothing() -> None:
    store = MemoryStore()
    quota = ledger(store)
    snapshot = config()
    for _ in range(3):
        body = stored_pod({"gpuadm.io/h100": "10"})
        outcome = await judged(quota, body, snapshot, dry_run=True)
        assert outcome.allowed
    assert store.writes == 0
    body = stored_pod({"gpuadm.io/h100": "11"})
    outcome = await judged(quota, body, snapshot, dry_run=True)
    assert not outcome.allowed


async def test_zero_forbids_and_unlisted_classes_are_unlimited() -> None:
    quota = ledger()
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}, namespace="team-b"))
    assert await admit(quota, stored_pod({"gpuadm.io/t4": "8"}, namespace="team-b"))


async def test_a_pod_seen_by_the_watch_is_counted_once() -> None:
    usage = UsageIndex()
    quota = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    body = stored_pod({"gpuadm.io/h100": "6"})
    assert await admit(quota, body)
    snapshot = config()
    usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    assert quota.book.in_use("team-a") == {"h100": 6}
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "4"}))


async def test_deleting_a_pod_frees_its_room() -> None:
    usage = UsageIndex()
    quota = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    snapshot = config()
    body = stored_pod({"gpuadm.io/h100": "10"})
    assert await admit(quota, body)
    usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    usage.forget(body["metadata"]["uid"])
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))


async def test_a_reservation_for_a_pod_never_stored_expires() -> None:
    now = [1000.0]
    quota = ledger(clock=lambda: now[0], reservation_ttl=90)
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "10"}))
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    now[0] += 89
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    now[0] += 2
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))


async def test_standalone_reservations_never_expire() -> None:
    now = [0.0]
    quota = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False, clock=lambda: now[0])
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "10"}))
    now[0] += 10**6
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))


async def test_warn_mode_admits_over_quota_with_a_warning() -> None:
    quota = ledger()
    snapshot = config("mode: warn\n" + QUOTAS)
    body = stored_pod({"gpuadm.io/h100": "2"}, namespace="team-w")
    outcome = await judged(quota, body, snapshot)
    assert outcome.allowed
    assert "enforce would deny" in outcome.warnings[0]
    assert outcome.would_deny
    assert (outcome.in_use, outcome.limit) == (Fraction(0), Fraction(1))


async def test_usage_not_in_sync_fails_closed() -> None:
    quota = ledger(usage_ready=lambda: False)
    snapshot = config()
    body = stored_pod({"gpuadm.io/h100": "1"})
    outcome = await judged(quota, body, snapshot)
    assert not outcome.allowed
    assert "retry" in (outcome.message or "")


async def test_prune_drops_expired_reservations_from_the_record() -> None:
    now = [0.0]
    store = MemoryStore()
    quota = ledger(store, clock=lambda: now[0], reservation_ttl=90)
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    now[0] = 50
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    now[0] = 100
    await quota.book.prune_all()
    assert await store.namespaces() == ["team-a"]
    assert len((await store.read("team-a")).reservations) == 1


async def test_a_record_left_without_reservations_is_deleted() -> None:
    now = [0.0]
    store = MemoryStore()
    quota = ledger(store, clock=lambda: now[0], reservation_ttl=90)
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    assert await store.namespaces() == ["team-a"]
    now[0] = 100
    await quota.book.prune_all()
    assert await store.namespaces() == []
    assert quota_readings(quota.book, config().quotas) == []


async def test_a_namespace_that_does_not_exist_is_refused_and_leaves_nothing() -> None:
    store = MemoryStore()

    async def only_team_a(name: str) -> bool:
        return name == "team-a"

    quota = ledger(store, namespace_exists=only_team_a)
    limited_everywhere = config("default: {h100: 1}\n" + QUOTAS)
    body = stored_pod({"gpuadm.io/h100": "1"}, namespace="made-up")
    outcome = await judged(quota, body, limited_everywhere)
    assert not outcome.allowed
    assert outcome.message == 'namespace "made-up" does not exist'
    assert store.writes == 0
    assert await store.namespaces() == []
    assert quota_readings(quota.book, limited_everywhere.quotas) == []


async def test_readings_cover_namespaces_that_hold_gpus_with_their_limits() -> None:
    quota = ledger()
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "2"}))
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}, namespace="team-w"))
    assert await admit(quota, stored_pod({"gpuadm.io/t4": "1"}, namespace="team-x"))
    readings = quota_readings(quota.book, config().quotas)
    assert {(r.namespace, r.gpu_class): (r.in_use, r.limit) for r in readings} == {
        ("team-a", "h100"): (2.0, 10.0),
        ("team-w", "h100"): (1.0, 1.0),
    }


def test_usage_index_sums_are_exact_and_drop_terminal_pods() -> None:
    snapshot = config()
    usage = UsageIndex()
    pods = [stored_pod({"gpuadm.io/a100": "0.1"}) for _ in range(10)]
    for body in pods:
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    assert usage.in_use("team-a") == {"a100": Fraction(1)}
    pods[0]["status"] = {"phase": "Succeeded"}
    usage.observe(pods[0], snapshot.policy, snapshot.quotas, now=1)
    assert usage.in_use("team-a") == {"a100": Fraction(9, 10)}
    assert usage.seen(pods[0]["metadata"]["uid"])
    for body in pods[1:]:
        usage.forget(body["metadata"]["uid"])
    assert usage.in_use("team-a") == {}
    assert len(usage) == 0


async def test_a_replica_whose_cached_record_is_stale_reads_it_again_after_one_lost_race() -> None:
    store = MemoryStore()
    a, b = ledger(store), ledger(store)
    assert await admit(a, stored_pod({"gpuadm.io/h100": "4"}))
    assert await admit(b, stored_pod({"gpuadm.io/h100": "4"}))  # a's cached record is stale
    assert store.conflicts == 0
    # a writes at the version it cached, loses once, reads b's write, and judges with it.
    assert await admit(a, stored_pod({"gpuadm.io/h100": "2"}))
    assert store.conflicts == 1
    assert not await admit(a, stored_pod({"gpuadm.io/h100": "1"}))  # 10 of 10 in use


class UnreachableStore(MemoryStore):
    """A record store whose apiserver refuses every write, as during an outage."""

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        raise KubeError(0, "connection refused")


async def test_an_unreachable_apiserver_is_a_clean_denial_asking_to_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quota = ledger(UnreachableStore())
    outcome = await judged(quota, stored_pod({"gpuadm.io/h100": "1"}), config())
    assert not outcome.allowed
    assert outcome.message == "gpuadm cannot reach the apiserver (connection refused); retry"
    assert "Traceback" not in caplog.text


class SmallStore(MemoryStore):
    """A record store that holds at most `room` reservations a record, as a ConfigMap holds
    at most 1 MiB."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        if len(reservations) > self.room:
            raise RecordFull(namespace, len(reservations), 1024 * 1024)
        return await super().write(namespace, reservations, version, mark, allowances)


async def test_a_full_record_is_a_clean_denial_that_admits_nothing_until_it_empties(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    store = SmallStore(room=2)
    quota = ledger(store, clock=lambda: now[0], reservation_ttl=90)
    snapshot = config()
    # Pods of 4 of the limit of 10: half of what is left never holds another, so no room
    # is set aside, and each admission writes.
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "4"}))
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "4"}))
    # The quota has room for 2 more; the record has none, and says so. A dry run in the
    # same batch reserves nothing, and is judged as ever.
    dry_run = judged(quota, stored_pod({"gpuadm.io/h100": "1"}), snapshot, dry_run=True)
    dry, *outcomes = await asyncio.gather(
        dry_run,
        *(judged(quota, stored_pod({"gpuadm.io/h100": "1"}), snapshot) for _ in range(2)),
    )
    assert dry.allowed
    assert [o.allowed for o in outcomes] == [False] * 2
    for outcome in outcomes:
        assert re.fullmatch(
            'the quota record of namespace "team-a" is full: [34] reservations of recent '
            "admissions would take more than its 1024 KiB; retry in a minute, when the "
            "oldest have expired",
            outcome.message or "",
        )
    assert len((await store.read("team-a")).reservations) == 2
    # Every batch meets the full record; it is logged once a minute.
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))
    assert caplog.text.count('the quota record of namespace "team-a" is full') == 1
    assert "Traceback" not in caplog.text
    now[0] += 91  # the two reservations expire: the record has room again
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}))


async def test_a_namespace_that_cannot_be_checked_is_a_clean_denial() -> None:
    async def unreachable(name: str) -> bool:
        raise KubeError(503, "apiserver is shutting down")

    quota = ledger(namespace_exists=unreachable)
    outcome = await judged(quota, stored_pod({"gpuadm.io/h100": "1"}), config())
    assert not outcome.allowed
    assert "cannot reach the apiserver (503: apiserver is shutting down); retry" in (
        outcome.message or ""
    )


async def test_a_pod_judged_again_is_not_counted_against_itself_alone_or_in_a_batch() -> None:
    # The apiserver retries a webhook call after a timeout: the pod's first reservation must
    # not make its second judgement refuse it, nor count twice for the pods judged with it.
    quota = ledger()
    snapshot = config()
    first = stored_pod({"gpuadm.io/h100": "4"})
    assert (await judged(quota, first, snapshot)).allowed
    again = await judged(quota, first, snapshot)
    assert again.allowed
    assert again.in_use == 0
    retried, fits, over = await asyncio.gather(
        judged(quota, first, snapshot),
        judged(quota, stored_pod({"gpuadm.io/h100": "6"}), snapshot),
        judged(quota, stored_pod({"gpuadm.io/h100": "1"}), snapshot),
    )
    assert (retried.allowed, fits.allowed, over.allowed) == (True, True, False)
    assert over.message == 'namespace "team-a": h100 quota exceeded: requested 1, in use 10 of 10'
    assert quota.book.in_use("team-a")["h100"] == 10


class LaterFormat(MemoryStore):
    """A store in which one namespace's record is in a later gpuadm's format."""

    def __init__(self, unreadable: str) -> None:
        super().__init__()
        self.unreadable = unreadable

    async def read(self, namespace: str) -> Record:
        if namespace == self.unreadable:
            raise UnreadableRecord(namespace, "it is in format '3', of a later gpuadm")
        return await super().read(namespace)

    async def namespaces(self) -> list[str]:
        return sorted({*await super().namespaces(), self.unreadable})


async def test_a_record_of_a_later_format_is_neither_judged_by_nor_pruned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    store = LaterFormat("team-a")
    quota = ledger(store, clock=lambda: now[0], reservation_ttl=90)
    verdict = await judged(quota, stored_pod({"gpuadm.io/h100": "1"}), config())
    assert (verdict.allowed, verdict.message) == (
        False,
        "gpuadm cannot read the quota record of namespace \"team-a\": it is in format '3', "
        "of a later gpuadm; retry",
    )
    assert store.writes == 0
    # Another namespace's record is pruned all the same, the pass going past the one it
    # cannot read (which sorts first), and saying so.
    assert await admit(quota, stored_pod({"gpuadm.io/h100": "1"}, namespace="team-w"))
    now[0] = 100
    await quota.book.prune_all()
    assert await store.namespaces() == ["team-a"]
    assert 'cannot read the quota record of namespace "team-a"' in caplog.text
    assert "left as it is" in caplog.text
