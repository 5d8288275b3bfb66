"""Gangs in enforce mode, on the record: a gang's first pod is admitted only if the whole gang
fits, and sets aside in the same write the room its other pods are charged against."""

from __future__ import annotations

import asyncio
import random
from fractions import Fraction
from typing import Any

import pytest

from policies import plan, require_fixed_point
from policies.quota.judge import QuotaVerdict
from policies.workloads import Gang
from tests.webhook.quota.test_queue_ledger import config, request, stored_pod, uid, ungated
from webhook.quota.gang_room import ROOM_PREFIX
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex

QUOTAS = "namespaces:\n  team-g: {h100: 4}\n"
H100 = {"gpuadm.io/h100": "1"}
ROOM = f"{ROOM_PREFIX}gpuadm/train"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def member(size: int = 3, gang: str = "train") -> dict[str, Any]:
    body = stored_pod(H100, "team-g")
    body["metadata"]["annotations"].update(
        {"gpuadm.io/gang": gang, "gpuadm.io/gang-size": str(size)}
    )
    return body


async def admit(
    ledger: QuotaLedger, body: dict[str, Any], *, dry_run: bool = False
) -> QuotaVerdict:
    snapshot = config(QUOTAS)
    verdict = await ledger.admit(
        request(body, dry_run=dry_run), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert verdict is not None
    return verdict


async def charges(store: MemoryStore) -> dict[str, Fraction]:
    return {k: r.charge for k, r in (await store.read("team-g")).reservations.items()}


def ledger_on(store: MemoryStore, clock: Clock | None = None, **kwargs: Any) -> QuotaLedger:
    usage = UsageIndex()
    return QuotaLedger(usage, store, pods_visible=True, clock=clock or Clock(), **kwargs)


@pytest.mark.parametrize(
    ("held", "admitted"),
    [
        pytest.param(1, True, id="room-for-the-whole-gang-exactly"),
        pytest.param(2, False, id="room-for-two-of-three"),
    ],
)
async def test_the_first_pod_is_admitted_only_if_the_whole_gang_fits(
    held: int, admitted: bool
) -> None:
    store = MemoryStore()
    ledger = ledger_on(store)
    for _ in range(held):
        assert (await admit(ledger, stored_pod(H100, "team-g"))).allowed
    first = member()
    verdict = await admit(ledger, first)
    assert verdict.allowed is admitted
    if admitted:
        assert (await charges(store))[ROOM] == 2
        assert (await charges(store))[uid(first)] == 1
    else:
        assert verdict.message == (
            "namespace \"team-g\": h100 quota exceeded: the gang 'train' of 3 (gpuadm) needs 3 "
            "at once (3 pods of 1), in use 2 of 4: its first pod is refused, so that no part "
            "of the gang holds GPUs it cannot use; retry when there is room for all of it"
        )
        assert ROOM not in await charges(store)


async def test_the_later_pods_are_charged_against_the_room_which_no_one_else_takes() -> None:
    store = MemoryStore()
    ledger = ledger_on(store)
    assert (await admit(ledger, stored_pod(H100, "team-g"))).allowed
    pods = [member() for _ in range(3)]
    assert (await admit(ledger, pods[0])).allowed
    # The room set aside for the gang is held: a pod of no gang finds the quota full.
    other = await admit(ledger, stored_pod(H100, "team-g"))
    assert not other.allowed
    assert "in use 4 of 4" in (other.message or "")
    assert (await admit(ledger, pods[1])).allowed
    assert (await charges(store))[ROOM] == 1
    assert (await admit(ledger, pods[2])).allowed  # the last of the room, exactly
    held = await charges(store)
    assert ROOM not in held
    assert sum(held.values()) == 4


async def test_a_dry_run_of_a_first_pod_is_judged_and_sets_nothing_aside() -> None:
    store = MemoryStore()
    ledger = ledger_on(store)
    verdict = await admit(ledger, member(), dry_run=True)
    assert verdict.allowed
    assert await charges(store) == {}


async def test_a_pod_of_a_gang_already_running_is_judged_alone() -> None:
    store = MemoryStore()
    ledger = ledger_on(store)
    snapshot = config(QUOTAS)
    running = ungated(member(size=4))
    for _ in range(3):
        ledger.book.usage.observe(ungated(member(size=4)), snapshot.policy, snapshot.quotas, now=0)
    ledger.book.usage.observe(running, snapshot.policy, snapshot.quotas, now=0)
    ledger.book.usage.forget(uid(running))  # a worker that failed: three run, one replaces it
    replacement = member(size=4)
    verdict = await admit(ledger, replacement)
    assert verdict.allowed  # 1 more fits beside the 3 running: not judged as 4 at once
    assert ROOM not in await charges(store)


async def test_the_room_lasts_as_long_as_a_reservation() -> None:
    store = MemoryStore()
    clock = Clock()
    ledger = ledger_on(store, clock, reservation_ttl=90.0)
    assert (await admit(ledger, member())).allowed
    clock.now += 91
    # The room expired: the next pod is judged alone, as the first of a gang whose pods are
    # not seen running, so the whole gang again.
    late = member()
    assert (await admit(ledger, late)).allowed
    assert (await charges(store))[ROOM] == 2


async def test_a_gang_whose_size_cannot_be_read_is_refused_with_retry() -> None:
    async def unreadable(namespace: str, gang: Gang) -> int | str:
        return "gpuadm cannot read its Job train (HTTP 503); it tries again"

    store = MemoryStore()
    ledger = ledger_on(store, gang_size=unreadable)
    body = stored_pod(H100, "team-g")
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j", "controller": True}
    ]
    verdict = await admit(ledger, body)
    assert not verdict.allowed
    assert "is in the gang 'train' of unknown size (job), whose size gpuadm cannot read" in (
        verdict.message or ""
    )
    assert (verdict.message or "").endswith("; retry")


async def test_a_job_gang_in_enforce_mode_reads_its_size() -> None:
    asked: list[str] = []

    async def sizes(namespace: str, gang: Gang) -> int | str:
        asked.append(gang.key)
        return 5

    ledger = ledger_on(MemoryStore(), gang_size=sizes)
    body = stored_pod(H100, "team-g")
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j", "controller": True}
    ]
    verdict = await admit(ledger, body)
    assert asked == ["job/train"]
    assert not verdict.allowed
    assert "needs 5 at once (5 pods of 1), more than" not in (verdict.message or "")
    assert "the gang 'train' of 5 (job) needs 5 at once (5 pods of 1), in use 0 of 4" in (
        verdict.message or ""
    )


@pytest.mark.parametrize("seed", range(5))
async def test_gangs_and_pods_racing_through_three_replicas_never_start_half_a_gang(
    seed: int,
) -> None:
    """Five gangs of 3 and six lone pods, all at once, through three replicas on one record,
    against room for 4: never more than 4 held, pods and gangs' room together, and each gang
    whole or not at all."""
    store = MemoryStore()
    clock = Clock()
    replicas = [ledger_on(store, clock, holder=f"r{i}") for i in range(3)]
    gangs = {f"g{g}": [member(gang=f"g{g}") for _ in range(3)] for g in range(5)}
    lone = [stored_pod(H100, "team-g") for _ in range(6)]
    creates = [p for pods in gangs.values() for p in pods] + lone
    random.Random(seed).shuffle(creates)
    verdicts = await asyncio.gather(
        *(admit(replicas[i % 3], body) for i, body in enumerate(creates))
    )
    admitted = {
        uid(body) for body, verdict in zip(creates, verdicts, strict=True) if verdict.allowed
    }
    held = await charges(store)
    assert 1 <= len(admitted) <= 4  # room was used, never past the limit
    assert sum(held.values()) <= 4
    for name, pods in gangs.items():
        whole = sum(uid(p) in admitted for p in pods)
        assert whole in (0, 3), (name, whole)


async def test_a_gangs_first_pod_and_lone_pods_judged_in_one_batch_share_the_limit() -> None:
    """The room the first pod sets aside counts for the pods judged after it in the same
    write: a gang of 4 and 3 lone pods against 4 admit the gang's first pod alone."""
    store = MemoryStore()
    ledger = ledger_on(store)
    first = member(size=4)
    lone = [stored_pod(H100, "team-g") for _ in range(3)]
    verdicts = await asyncio.gather(admit(ledger, first), *(admit(ledger, p) for p in lone))
    assert [v.allowed for v in verdicts] == [True, False, False, False]
    assert sum((await charges(store)).values()) == 4
