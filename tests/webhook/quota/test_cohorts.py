"""Cohorts on the ledger: one record per cohort, exact across replicas."""

from __future__ import annotations

import asyncio
import functools
import random
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction

import pytest

from policies import plan, require_fixed_point
from policies.quota.judge import QuotaVerdict
from tests.builders import POLICY_YAML
from tests.webhook.quota.test_ledger import ledger, request, stored_pod
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.quota.book import RecordBusy
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore, RecordFull, Reservation, UnreadableRecord
from webhook.quota.usage import UsageIndex

QUOTAS = """
namespaces:
  team-a: {cohort: research, h100: 4, borrow: {h100: 3}}
  team-b: {cohort: research, h100: 4, lend: {h100: 2}, reclaim: any}
  team-c: {cohort: research, h100: 2}
  team-d: {h100: 1}
"""
# What the cohort holds at most: every member's nominal quota (10); team-a at most 4 + 3.
COHORT_TOTAL = 10
MOST = {"team-a": 7, "team-b": 10, "team-c": 10}


@functools.cache
def config(quotas: str = QUOTAS) -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q")


async def verdict_for(ledger_: QuotaLedger, namespace: str, gpus: str = "1") -> QuotaVerdict:
    body = stored_pod({"gpuadm.io/h100": gpus}, namespace)
    snapshot = config()
    outcome = await ledger_.admit(
        request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert outcome is not None
    return outcome


def held(reservations: Mapping[str, Reservation]) -> dict[str, Fraction]:
    counted: dict[str, Fraction] = {}
    for reservation in reservations.values():
        ns = reservation.namespace
        counted[ns] = counted.get(ns, Fraction(0)) + reservation.charge
    return counted


@pytest.mark.parametrize("replicas", [1, 3])
async def test_a_burst_across_a_cohort_admits_exactly_its_total(replicas: int) -> None:
    chooser = random.Random(replicas)
    for _ in range(10):
        store = MemoryStore()
        ledgers = [ledger(store) for _ in range(replicas)]
        namespaces = [chooser.choice(["team-a", "team-b", "team-c"]) for _ in range(200)]
        verdicts = await asyncio.gather(
            *(verdict_for(ledgers[i % replicas], ns) for i, ns in enumerate(namespaces))
        )
        admitted = Counter(ns for ns, v in zip(namespaces, verdicts, strict=True) if v.allowed)
        assert sum(admitted.values()) == COHORT_TOTAL
        for namespace, most in MOST.items():
            assert admitted[namespace] <= most
        record = await store.read("cohort.research")
        assert held(record.reservations) == dict(admitted)
        assert await store.namespaces() == ["cohort.research"], "one record for the cohort"
        if replicas > 1:
            assert store.conflicts > 0, "the replicas never raced; the test proves nothing"


async def test_a_pod_beyond_its_nominal_quota_borrows_and_is_told_so() -> None:
    one = ledger()
    for _ in range(4):
        assert (await verdict_for(one, "team-a")).allowed
    borrowed = await verdict_for(one, "team-a")
    assert borrowed.allowed
    assert any("borrows 1 h100 from cohort research" in w for w in borrowed.warnings)


async def test_borrowing_stops_at_the_member_s_bound() -> None:
    one = ledger()
    for _ in range(7):
        assert (await verdict_for(one, "team-a")).allowed
    refused = await verdict_for(one, "team-a")
    assert not refused.allowed
    assert "nominal quota 4, borrowing up to 7" in (refused.message or "")


async def test_a_lender_within_its_nominal_quota_is_told_borrowers_hold_its_room() -> None:
    one = ledger()
    # team-a borrows all the pool holds for it: 4 of its own, and 3 more lent.
    for _ in range(7):
        assert (await verdict_for(one, "team-a")).allowed
    # team-c lends its 2 and team-b lends 2: the borrowers hold 3 of those 4.
    assert (await verdict_for(one, "team-c")).allowed
    refused = await verdict_for(one, "team-c")
    assert not refused.allowed
    assert "within its nominal quota of 2, but borrowers in cohort research" in (
        refused.message or ""
    )
    assert "reclaim: never" in (refused.message or "")
    # team-b's guaranteed 2 is never lent: it fits whatever the borrowers hold.
    assert (await verdict_for(one, "team-b")).allowed
    assert (await verdict_for(one, "team-b")).allowed
    third = await verdict_for(one, "team-b")
    assert not third.allowed
    assert "reclaim: any: gpuadm evicts borrowed pods" in (third.message or "")


async def test_a_namespace_outside_any_cohort_keeps_its_own_record() -> None:
    store = MemoryStore()
    one = ledger(store)
    assert (await verdict_for(one, "team-d")).allowed
    assert not (await verdict_for(one, "team-d")).allowed
    assert await store.namespaces() == ["team-d"]
    record = await store.read("team-d")
    assert [r.namespace for r in record.reservations.values()] == [""]


def test_a_member_with_no_quota_of_its_own_may_still_borrow_what_the_pool_holds() -> None:
    """A pod past the nominal quota alone is not one that could never fit: the pool may
    take it. Past nominal + borrow (or the pool) it could never run, and is refused."""
    from webhook.quota.verdicts import gate_verdict

    snapshot = config(
        "mode: queue\nnamespaces:\n"
        "  team-a: {cohort: research, h100: 0, borrow: {h100: 2}}\n"
        "  team-b: {cohort: research, h100: 4}\n"
    )
    for gpus, allowed in (("2", True), ("3", False)):
        body = stored_pod({"gpuadm.io/h100": gpus}, "team-a")
        verdict = gate_verdict("team-a", plan(body, snapshot.policy), snapshot)
        assert verdict is not None
        assert verdict.allowed is allowed, gpus
        assert verdict.queued is allowed


async def test_a_members_pods_of_a_class_it_has_no_limit_of_take_nothing_from_the_others() -> None:
    """team-b has no a100 limit: it runs as many as it likes, and team-a keeps its own 2."""
    snapshot = config(
        "namespaces:\n"
        "  team-a: {cohort: research, h100: 1, a100: 2}\n"
        "  team-b: {cohort: research, h100: 3}\n"
    )
    usage = UsageIndex()
    one = QuotaLedger(usage, MemoryStore(), pods_visible=True)

    async def admitted(namespace: str) -> bool:
        body = stored_pod({"gpuadm.io/a100": "1"}, namespace)
        verdict = await one.admit(
            request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
        )
        allowed = verdict is None or verdict.allowed  # None: no limit to judge by
        if allowed:  # the pod watch shows it
            usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
        return allowed

    assert [await admitted("team-b") for _ in range(5)] == [True] * 5
    assert [await admitted("team-a") for _ in range(3)] == [True, True, False]
    assert await admitted("team-b")


def test_a_cohorts_record_is_named_as_the_cohorts_in_messages() -> None:
    assert RecordBusy("cohort.research").detail == 'the quota record of cohort "research" is busy'
    assert RecordBusy("team-a").detail == 'the quota record of namespace "team-a" is busy'
    assert RecordFull("cohort.research", 3, 2048).headline == (
        'the quota record of cohort "research" is full'
    )
    assert UnreadableRecord("cohort.research", "why").detail == (
        'gpuadm cannot read the quota record of cohort "research": why'
    )
