"""Allowances: room set aside for a replica, which admits from it without a write, exactly,
alone and with others, and through the death of a replica that holds some."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import pytest

from policies import plan, require_fixed_point
from tests.webhook.quota.stores import FailingStore, Fate
from tests.webhook.quota.test_ledger import QUOTAS, admit, config, judged, request, stored_pod
from webhook.quota import admissions as admissions_module
from webhook.quota.allowances import ALLOWANCE_SECONDS, WAIT_SECONDS, Allowances
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import NO_MARK, Allowance, MemoryStore, Record
from webhook.quota.usage import UsageIndex

H100 = {"gpuadm.io/h100": "1"}
A100 = {"gpuadm.io/a100": "1"}


def ledger(store: MemoryStore, *, usage: UsageIndex | None = None, **kwargs: Any) -> QuotaLedger:
    return QuotaLedger(UsageIndex() if usage is None else usage, store, pods_visible=True, **kwargs)


@contextlib.asynccontextmanager
async def keeping(*ledgers: QuotaLedger) -> AsyncIterator[None]:
    """Run each ledger's keeper, as a replica does, for the block's time."""
    tasks = [asyncio.create_task(each.keep_allowances(lambda: None)) for each in ledgers]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def held(record: Record, now: float | None = None) -> Fraction:
    """The h100s a record holds: its reservations and every allowance's room."""
    reserved = sum((r.charge for r in record.reservations.values()), Fraction(0))
    aside = sum((a.room.get("h100", Fraction(0)) for a in record.allowances.values()), Fraction(0))
    return reserved + aside


async def settled(store: MemoryStore, namespace: str = "team-a") -> Record:
    """Wait until no replica holds room aside in the namespace's record, and return it."""
    deadline = time.monotonic() + 5
    while (record := await store.read(namespace)).allowances:
        assert time.monotonic() < deadline, f"room still aside: {record.allowances}"
        await asyncio.sleep(0.02)
    return record


async def test_after_one_write_the_pods_that_fit_the_room_aside_are_admitted_without_one() -> None:
    store = MemoryStore()
    quota = ledger(store)
    assert await admit(quota, stored_pod(H100))
    # The first write reserved the pod and set half of the 9 left aside: 4.5 GPUs.
    record = await store.read("team-a")
    assert store.writes == 1
    assert [a.room for a in record.allowances.values()] == [{"h100": Fraction(9, 2)}]
    for _ in range(4):
        assert await admit(quota, stored_pod(H100))
    assert store.writes == 1, "pods that fit the room aside wrote the record"
    # The sixth does not fit what is left (0.5): it is judged with a write, which carries
    # the four as reservations and sets half of what is then free aside.
    assert await admit(quota, stored_pod(H100))
    record = await store.read("team-a")
    assert store.writes == 2
    assert len(record.reservations) == 6
    assert [a.room for a in record.allowances.values()] == [{"h100": Fraction(2)}]


async def test_one_replica_fills_its_quota_exactly_and_writes_a_few_times() -> None:
    store = MemoryStore()
    quota = ledger(store)
    results = [await admit(quota, stored_pod(H100)) for _ in range(12)]
    assert results == [True] * 10 + [False] * 2
    async with keeping(quota):
        record = await settled(store)
    assert len(record.reservations) == 10
    # Writes halve the room left each time, and give the last of it back: far fewer than
    # one a pod.
    assert store.writes <= 6


@pytest.mark.parametrize("replicas", [2, 3])
async def test_replicas_admitting_side_by_side_fill_the_quota_exactly(replicas: int) -> None:
    """Each replica admits a stream of pods from its own room aside and by writes; those
    that meet room another holds wait for it. Every round, exactly the room is admitted."""
    for _ in range(3):
        store = MemoryStore()
        quotas = [ledger(store) for _ in range(replicas)]
        granted_without_write = 0

        async def stream(quota: QuotaLedger, count: int, store: MemoryStore = store) -> list[bool]:
            nonlocal granted_without_write
            results = []
            for _ in range(count):
                writes = store.writes
                results.append(await admit(quota, stored_pod(H100)))
                granted_without_write += results[-1] and store.writes == writes
            return results

        async with keeping(*quotas):
            results = await asyncio.gather(*(stream(quota, 8) for quota in quotas))
            record = await settled(store)
        assert sum(map(sum, results)) == 10
        assert len(record.reservations) == 10
        assert granted_without_write > 0, "no pod was admitted from room aside"


async def test_a_replica_waits_for_room_another_holds_aside_and_is_then_admitted() -> None:
    store = MemoryStore()
    a, b = ledger(store), ledger(store)
    async with keeping(a, b):
        for _ in range(4):  # a holds 4.5 - 3 = 1.5 aside, and the namespace 4 + 1.5 of 10
            assert await admit(a, stored_pod(H100))
        assert await admit(b, stored_pod({"gpuadm.io/h100": "4"}))
        # 4 + 1.5 + 4 held: room for 1 more only once a gives its room back, when it idles.
        started = time.monotonic()
        assert await admit(b, stored_pod(H100))
        assert time.monotonic() - started < WAIT_SECONDS
        assert await admit(b, stored_pod(H100))  # 10 of 10
        assert not await admit(b, stored_pod(H100))


async def test_a_pod_that_waits_for_room_held_aside_is_not_starved_by_its_holder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a pod waits for room another replica holds, the record says so, and no replica
    sets room aside: what the busy holder gives back stays free for the pod, even when the
    holder's next pod comes before the waiting pod's next look at the record."""
    monkeypatch.setattr(admissions_module, "POLL_SECONDS", 0.3)
    store = MemoryStore()
    a, b = ledger(store), ledger(store)
    bigger = QUOTAS.replace("h100: 10", "h100: 24")
    async with keeping(a, b):
        assert await admit(a, stored_pod(H100), quotas=bigger)  # 1 reserved, 11.5 aside

        async def stream() -> list[bool]:
            results = []
            for _ in range(11):  # never idle; its room ends after 1 s, and its next pod
                results.append(await admit(a, stored_pod(H100), quotas=bigger))
                await asyncio.sleep(0.15)  # then writes, and would set half the rest aside
            return results

        streaming = asyncio.create_task(stream())
        await asyncio.sleep(0.05)
        # 12 fits beside a's pods, but not beside the room a holds aside: it waits.
        waited = await judged(b, stored_pod({"gpuadm.io/h100": "12"}), config(bigger))
        results = await streaming
    assert waited.allowed, waited.message
    assert results == [True] * 11  # 12 of a's and b's 12: 24 of 24


async def test_only_a_refusal_waits_for_room_held_aside_not_warn_mode_nor_a_dry_run() -> None:
    """A dry run is answered at once with what a create would meet: a wait for the room,
    then admitted; warn mode admits past the limit anyway."""
    store = MemoryStore()
    a, b = ledger(store), ledger(store)
    assert await admit(a, stored_pod(H100))  # 1 reserved, 4.5 aside for a
    assert await admit(b, stored_pod({"gpuadm.io/h100": "4"}))  # 9.5 of 10 held
    started = time.monotonic()
    dry = await judged(b, stored_pod(H100), config(), dry_run=True)
    warned = await judged(b, stored_pod(H100), config("mode: warn\n" + QUOTAS))
    assert time.monotonic() - started < WAIT_SECONDS / 2, "they waited for a's room"
    assert dry.allowed
    (said,) = dry.warnings
    assert "quota exceeded" in said
    assert "other gpuadm replicas hold aside: a create now would wait up to 1.5 s" in said
    too_big = await judged(b, stored_pod({"gpuadm.io/h100": "8"}), config(), dry_run=True)
    assert not too_big.allowed, "a dry run that would not fit even then is refused"
    assert warned.allowed
    assert warned.would_deny
    assert warned.message is not None
    assert "room aside" not in warned.message
    assert all(not x.wants for x in (await store.read("team-a")).allowances.values())


async def test_a_pod_that_waits_says_so_once_while_writes_take_their_time() -> None:
    """The keeper, looking while the write that says a pod waits is in flight, must not
    forget the wait: else each look at the record says it again, in a write each time."""
    store = FailingStore(delay=lambda: 0.06)  # as an apiserver's write takes milliseconds
    a, b = ledger(store), ledger(store)
    assert await admit(a, stored_pod(H100))  # 1 reserved, 4.5 aside; a never gives it back
    assert await admit(b, stored_pod({"gpuadm.io/h100": "4"}))
    async with keeping(b):
        writes = store.writes
        assert not (await judged(b, stored_pod(H100), config())).allowed  # waited 1.5 s
    assert store.writes - writes <= 2, f"{store.writes - writes} writes while it waited"


async def test_a_wait_said_in_the_record_stops_room_being_set_aside_until_it_ends() -> None:
    store = MemoryStore()
    now = time.time()
    said = {
        "ended": Allowance({}, until=0.0, wants=now - 1),
        "waits": Allowance({}, until=0.0, wants=now + 60),
    }
    await store.write("team-a", {}, None, NO_MARK, said)
    quota = ledger(store)
    assert await admit(quota, stored_pod(H100))
    # The wait that ended is left out; the other is kept, and no room was set aside.
    assert set((await store.read("team-a")).allowances) == {"waits"}
    assert not quota.book.allowances.remaining("team-a")


async def test_room_aside_of_a_replica_that_died_is_held_until_no_pod_can_come_from_it() -> None:
    """The failover story: a killed holder's unused room is never given twice; it is held
    until its end plus the reservations' lifetime, and then the quota fills exactly."""
    skipped = [0.0]

    def clock() -> float:
        return time.time() + skipped[0]

    store = MemoryStore()
    usage_b = UsageIndex()
    a = ledger(store, clock=clock)
    b = ledger(store, usage=usage_b, clock=clock)
    stored = [stored_pod(H100) for _ in range(3)]
    for body in stored:
        assert await admit(a, body)
    # a dies here, its memory gone: 2 pods admitted from its 4.5 aside were never written.
    del a
    record = await store.read("team-a")
    assert len(record.reservations) == 1
    assert held(record) == Fraction(11, 2)
    # b counts all of a's room: 1 + 4.5 of 10, so 4 fit, and a 5th waits for a's room,
    # then is refused, naming the room held aside.
    async with keeping(b):
        for _ in range(4):
            body = stored_pod(H100)
            assert await admit(b, body)
            stored.append(body)
        started = time.monotonic()
        outcome = await judged(b, stored_pod(H100), config())
        assert time.monotonic() - started >= WAIT_SECONDS
        assert not outcome.allowed
        assert outcome.message is not None
        assert outcome.message == (
            'namespace "team-a": h100 quota exceeded: requested 1, in use 9.5 of 10 (of which '
            "other gpuadm replicas hold room aside, not given back within 1.5 s; retry)"
        )
        # Every pod admitted is stored and shown by then: b's watch shows them (a's two
        # are then counted twice, as pods and in a's room: never too few).
        snapshot = config()
        for body in stored:
            usage_b.observe(body, snapshot.policy, snapshot.quotas, now=clock())
        # Still held until a's allowance ended and the lifetime of a reservation (90 s) has
        # passed: a pod a admitted at its last moment may be stored that late.
        (ended,) = (allowance.until for allowance in record.allowances.values())
        skipped[0] = ended + 90 - 5 - time.time()
        assert not await admit(b, stored_pod(H100))
        skipped[0] = ended + 90 - time.time()
        # Then exactly the room left: 10 - 3 (a's) - 4 (b's).
        results = [await admit(b, stored_pod(H100)) for _ in range(4)]
        assert results == [True] * 3 + [False]


async def test_killing_the_replica_that_holds_room_in_the_middle_of_a_burst_never_over_admits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three replicas take a burst of pods against room for 10; the one holding room aside
    is killed mid-burst, with its requests in flight. The pods admitted never exceed 10, and
    once its room is no longer held, the survivors fill the quota exactly."""
    monkeypatch.setattr(admissions_module, "WAIT_SECONDS", 0.2)
    skipped = [0.0]

    def clock() -> float:
        return time.time() + skipped[0]

    store = MemoryStore()
    usages = [UsageIndex() for _ in range(3)]
    quotas = [ledger(store, usage=usage, clock=clock) for usage in usages]
    admitted: list[dict[str, Any]] = []
    snapshot = config()

    async def one(quota: QuotaLedger) -> None:
        body = stored_pod(H100)
        if await admit(quota, body):
            admitted.append(body)

    async def stream(quota: QuotaLedger, count: int) -> None:
        for _ in range(count):
            await one(quota)

    victim = quotas[0]
    async with keeping(*quotas[1:]):
        killed = asyncio.create_task(stream(victim, 8))
        survivors = asyncio.gather(*(stream(quota, 8) for quota in quotas[1:]))
        # It has admitted a pod from its room aside, not yet written: kill it now.
        while not victim.book.allowances.pending("team-a") and not killed.done():  # noqa: ASYNC110
            await asyncio.sleep(0)
        assert victim.book.allowances.remaining("team-a"), "killed holding no room: no test"
        # Killed: its requests in flight and what it held in memory are gone with it.
        killed.cancel()
        for task in list(victim.judge._committers.values()):
            task.cancel()
        await asyncio.gather(killed, return_exceptions=True)
        await survivors
        assert len(admitted) <= 10
        assert len(admitted) < 10, "the victim's room was never held; no test"
        # Everything admitted is stored and shown by every survivor, in time.
        for usage in usages[1:]:
            for body in admitted:
                usage.observe(body, snapshot.policy, snapshot.quotas, now=clock())
        skipped[0] += ALLOWANCE_SECONDS + 91
        for _ in range(12):
            await one(quotas[1])
        assert len(admitted) == 10


async def test_a_limit_lowered_under_room_aside_is_obeyed_at_once() -> None:
    store = MemoryStore()
    quota = ledger(store)
    assert await admit(quota, stored_pod(H100))  # 4.5 aside
    lowered = QUOTAS.replace("h100: 10", "h100: 2")
    assert await admit(quota, stored_pod(H100), quotas=lowered)
    assert not await admit(quota, stored_pod(H100), quotas=lowered)


async def test_room_aside_under_a_limit_since_lowered_admits_nothing_more() -> None:
    """Room set aside under a limit serves only under that limit: after a change, the next
    pod is judged with a write against the record, where another replica's pods are."""
    store = MemoryStore()
    a, b = ledger(store), ledger(store)
    assert await admit(a, stored_pod(H100))  # 1 reserved, 4.5 aside for a
    assert await admit(b, stored_pod({"gpuadm.io/h100": "4"}))  # a's copy does not show it
    lowered = QUOTAS.replace("h100: 10", "h100: 6")
    assert [await admit(a, stored_pod(H100), quotas=lowered) for _ in range(3)] == [
        True,
        False,
        False,
    ]


async def test_an_idle_replica_gives_its_room_back_with_the_pods_admitted_from_it() -> None:
    store = MemoryStore()
    quota = ledger(store)
    bodies = [stored_pod(H100) for _ in range(3)]
    for body in bodies:
        assert await admit(quota, body)
    assert len((await store.read("team-a")).reservations) == 1
    async with keeping(quota):
        record = await settled(store)
    assert set(record.reservations) == {body["metadata"]["uid"] for body in bodies}
    assert quota.book.allowances.namespaces() == []


async def test_a_retried_request_for_a_pod_admitted_from_room_aside_is_not_charged_twice() -> None:
    store = MemoryStore()
    quota = ledger(store)
    assert await admit(quota, stored_pod(H100))  # 4.5 aside
    body = stored_pod({"gpuadm.io/h100": "4"})
    snapshot = config()
    planned = require_fixed_point(plan(body, snapshot.policy))
    for _ in range(2):
        outcome = await quota.admit(request(body), planned, snapshot)
        assert outcome is not None
        assert outcome.allowed
    assert quota.book.in_use("team-a", set_aside=False) == {"h100": 5}


async def test_dry_runs_and_warn_mode_take_no_room_aside() -> None:
    store = MemoryStore()
    quota = ledger(store)
    assert (await judged(quota, stored_pod(H100), config(), dry_run=True)).allowed
    warn = "mode: warn\n" + QUOTAS
    assert await admit(quota, stored_pod(H100, namespace="team-w"), quotas=warn)
    assert all(not r.allowances for r in [await store.read(n) for n in ("team-a", "team-w")])


async def test_room_just_set_aside_is_not_given_back_before_the_next_pod_can_use_it() -> None:
    """A pod every 100 ms: the keeper gives room back only once it has been idle 0.2 s."""
    store = MemoryStore()
    quota = ledger(store)
    async with keeping(quota):
        for _ in range(5):
            assert await admit(quota, stored_pod(H100))
            await asyncio.sleep(0.1)
    assert store.writes == 1, f"{store.writes} writes for 5 pods"


async def test_room_of_a_class_used_up_whose_pods_are_gone_leaves_the_others_judged() -> None:
    store, usage = MemoryStore(), UsageIndex()
    quota = ledger(store, usage=usage)
    two = QUOTAS.replace("a100: 1", "a100: 5")
    first = [stored_pod(A100), stored_pod(H100)]
    assert all(await asyncio.gather(*(admit(quota, body, quotas=two) for body in first)))
    assert quota.book.allowances.remaining("team-a") == {"a100": 2, "h100": Fraction(9, 2)}
    more = [stored_pod(A100) for _ in range(2)]
    for body in more:
        assert await admit(quota, body, quotas=two)
    assert quota.book.allowances.remaining("team-a")["a100"] == 0
    snapshot = config(two)
    for body in [first[0], *more]:  # shown, then gone: a short job
        usage.observe(body, snapshot.policy, snapshot.quotas, now=quota.book.clock())
        usage.forget(body["metadata"]["uid"])
    assert await admit(quota, stored_pod(H100), quotas=two)


async def test_room_is_not_used_past_its_end_even_when_never_given_back() -> None:
    skipped = [0.0]

    def clock() -> float:
        return time.time() + skipped[0]

    store = MemoryStore()
    a, b = ledger(store, clock=clock), ledger(store, clock=clock)
    assert await admit(a, stored_pod(H100))  # 1 reserved, 4.5 aside; no keeper runs
    skipped[0] = ALLOWANCE_SECONDS + 91  # a's room and reservation no longer count
    assert [await admit(b, stored_pod(H100)) for _ in range(10)] == [True] * 10
    assert not await admit(a, stored_pod(H100)), "a admitted from room past its end"


async def test_a_dry_run_or_a_refusal_keeps_the_room_aside() -> None:
    store = MemoryStore()
    quota = ledger(store)
    assert await admit(quota, stored_pod(H100))  # one write, 4.5 aside
    assert (await judged(quota, stored_pod(H100), config(), dry_run=True)).allowed
    assert not await admit(quota, stored_pod({"gpuadm.io/h100": "10"}))  # 11 of 10: no write
    assert await admit(quota, stored_pod(H100))
    assert store.writes == 1, "the room aside was thrown away: the next pod wrote"


async def test_the_cap_over_all_classes_bounds_the_room_set_aside() -> None:
    store = MemoryStore()
    quota = ledger(store)
    capped = QUOTAS.replace("team-a: {h100: 10, a100: 1}", 'team-a: {h100: 10, a100: 5, "*": 6}')
    both = [stored_pod(A100), stored_pod(H100)]
    assert all(await asyncio.gather(*(admit(quota, body, quotas=capped) for body in both)))
    # 4 free under the cap: half of it, 2, for a100; half of the 2 left, 1, for h100.
    assert quota.book.allowances.remaining("team-a") == {"a100": 2, "h100": 1}
    results = [await admit(quota, stored_pod(H100), quotas=capped) for _ in range(6)]
    assert results == [True] * 4 + [False] * 2


async def test_room_a_write_may_have_stored_unanswered_is_given_back() -> None:
    """The apiserver stored a write but its answer was lost: the replica does not count the
    room as its own, and the keeper gives it back rather than leave it held 90 s."""
    fates: list[Fate] = ["unanswered"]
    store = FailingStore(lambda: fates.pop() if fates else None)
    quota = ledger(store)
    assert not await admit(quota, stored_pod(H100))  # stored, but refused with "retry"
    assert (await store.read("team-a")).allowances
    async with keeping(quota):
        record = await settled(store)
    assert len(record.reservations) == 1  # the pod refused for nothing holds it 90 s at most


def test_others_room_counts_until_its_end_plus_the_reservations_lifetime() -> None:
    rules = Allowances("me", enabled=True, clock=lambda: 0.0, reservation_ttl=90)
    room = {"other": Allowance({"h100": Fraction(3)}, until=100.0)}
    assert rules.others(room, 100.0 + 89.9) == {"h100": 3}
    assert rules.others(room, 190.0) == {}
    assert rules.others({"me": Allowance({"h100": Fraction(3)}, until=100.0)}, 0) == {}
