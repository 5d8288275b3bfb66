"""Room set aside, in random interleavings: three replicas, their keepers, writes that
fail before or after they land, full records, dry runs, retried requests, pods shown and
deleted, and a replica killed and started anew. Whatever happens, the pods admitted and
alive never exceed a limit.

The cluster keeps the order the apiserver keeps: an admitted pod is stored a moment later,
and only then does a replica started anew list it, or a user delete it. Each replica's watch
shows every change in order, each a moment late, so the replicas' views lag each other (the
lag a record's mark makes a judgement wait out)."""

from __future__ import annotations

import asyncio
import random
import time
from fractions import Fraction
from typing import Any, Protocol

import pytest

from policies import Plan, plan, require_fixed_point
from policies.quota.judge import QuotaVerdict
from tests.webhook.quota.stores import FailingStore, Fate
from tests.webhook.quota.test_ledger import config, request, stored_pod
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import ReservationStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

QUOTAS = """
namespaces:
  team-a: {h100: 10, a100: 4, "*": 12}
"""
LIMITS = {"h100": Fraction(10), "a100": Fraction(4), "*": Fraction(12)}
ASKS = ({"gpuadm.io/h100": "1"}, {"gpuadm.io/h100": "2"}, {"gpuadm.io/a100": "1"})
SECONDS = 4.0
# At most this long between two deletions.
DELETE_SECONDS = 0.4


def flaky(rng: random.Random, flaky: list[bool]) -> FailingStore:
    """A store whose writes fail now and then, while `flaky[0]`: refused before landing,
    the record full, or stored and then unanswered; each after up to 10 ms."""

    def fate() -> Fate:
        roll = rng.random() if flaky[0] else 1.0
        return (
            "refused"
            if roll < 0.05
            else "full"
            if roll < 0.08
            else ("unanswered" if roll < 0.11 else None)
        )

    return FailingStore(fate, delay=lambda: rng.random() * 0.01)


# How long after its admission a pod is stored, at most.
STORE_SECONDS = 0.3
# How late a replica's watch may show an event, after the apiserver stored it.
LAG_SECONDS = 0.3


class Watch:
    """One replica's watch of pods: the cluster's events, in order, each shown up to
    `LAG_SECONDS` late (and only then does the view count as complete up to it)."""

    def __init__(self, usage: UsageIndex, rng: random.Random, snapshot: ConfigSnapshot) -> None:
        self.usage = usage
        self.rng = rng
        self.snapshot = snapshot
        self.events: asyncio.Queue[tuple[int, str, dict[str, Any] | None, float]] = asyncio.Queue()
        self.task = asyncio.create_task(self._show())

    def send(self, version: int, uid: str, body: dict[str, Any] | None) -> None:
        """Send the event of a pod stored (`body`) or deleted (None) at `version`."""
        due = asyncio.get_running_loop().time() + self.rng.random() * LAG_SECONDS
        self.events.put_nowait((version, uid, body, due))

    async def _show(self) -> None:
        usage, snapshot = self.usage, self.snapshot
        while True:
            version, uid, body, due = await self.events.get()
            await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
            if body is None:
                usage.forget(uid, version=version)
            else:
                usage.observe(
                    body, snapshot.policy, snapshot.quotas, now=time.time(), version=version
                )
            usage.advance(version)


class Admits(Protocol):
    """A replica, as the cluster asks it to admit a pod."""

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None: ...


class Cluster:
    """The pods alive, the replicas' watches of them, and what was ever over a limit."""

    def __init__(
        self,
        rng: random.Random,
        store: ReservationStore,
        quotas: str = QUOTAS,
        limits: dict[str, Fraction] = LIMITS,
        delete_seconds: float = DELETE_SECONDS,
    ) -> None:
        self.rng = rng
        self.delete_seconds = delete_seconds
        self.store = store
        self.snapshot = config(quotas)
        self.limits = limits
        self.version = 1
        self.alive: dict[str, tuple[str, Fraction, dict[str, Any]]] = {}
        # The pods alive that are stored: the only ones a list or a delete meets.
        self.stored: set[str] = set()
        self.ever: set[str] = set()
        self.watches: dict[UsageIndex, Watch] = {}
        self.over: list[str] = []
        self.admitted = 0
        # Admissions judged from room set aside, without a write (printed: near the limits
        # they are few, 1 to 3 a run).
        self.aside = 0
        self.storing: set[asyncio.Task[None]] = set()

    def view(self) -> UsageIndex:
        """Start a replica's view of pods, its watch having listed every pod stored: a pod
        admitted but not stored yet is shown by its watch later, as by the others'. A list
        marks no pod as shown by a watch event (as `UsageIndex.replace_all`)."""
        usage = UsageIndex()
        snapshot = self.snapshot
        for uid in self.stored:
            usage.observe(self.alive[uid][2], snapshot.policy, snapshot.quotas, now=time.time())
        usage.advance(self.version)
        self.watches[usage] = Watch(usage, self.rng, snapshot)
        return usage

    def replica(self, **kwargs: Any) -> QuotaLedger:
        """Start a replica (`view`), its ledger built with `kwargs` too."""
        ledger = QuotaLedger(self.view(), self.store, pods_visible=True, **kwargs)
        book, counted = ledger.book, ledger.book.counted_aside

        def counting() -> None:
            self.aside += 1
            counted()

        book.counted_aside = counting  # type: ignore[method-assign]
        return ledger

    def stop(self, replica: QuotaLedger) -> None:
        self.watches.pop(replica.book.usage).task.cancel()

    async def create(self, replica: Admits, body: dict[str, Any], *, dry_run: bool) -> None:
        """Ask a replica to admit a pod; one admitted is stored a moment later."""
        planned = require_fixed_point(plan(body, self.snapshot.policy))
        outcome = await replica.admit(request(body, dry_run=dry_run), planned, self.snapshot)
        uid = body["metadata"]["uid"]
        if dry_run or outcome is None or not outcome.allowed or uid in self.ever:
            return
        self.ever.add(uid)
        assert planned.class_name is not None
        self.alive[uid] = (planned.class_name, planned.charge, body)
        self.admitted += 1
        self._check(uid)
        # Stored a moment later, whatever becomes of this replica.
        storing = asyncio.create_task(self._store(body))
        self.storing.add(storing)
        storing.add_done_callback(self.storing.discard)

    async def _store(self, body: dict[str, Any]) -> None:
        await asyncio.sleep(self.rng.random() * STORE_SECONDS)
        uid = body["metadata"]["uid"]
        self.stored.add(uid)
        self._event(uid, body)

    async def delete_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(self.rng.random() * self.delete_seconds)
            if self.stored:
                uid = self.rng.choice(sorted(self.stored))
                self.stored.discard(uid)
                del self.alive[uid]
                self._event(uid, None)

    def _event(self, uid: str, body: dict[str, Any] | None) -> None:
        """Store a change of a pod at the next resourceVersion; every watch shows it."""
        self.version += 1
        for watch in self.watches.values():
            watch.send(self.version, uid, body)

    async def settle(self) -> None:
        """Wait for every pod admitted to be stored; stop the watches."""
        try:
            await asyncio.gather(*self.storing)
        finally:
            for watch in self.watches.values():
                watch.task.cancel()
            await asyncio.gather(*(w.task for w in self.watches.values()), return_exceptions=True)

    def _check(self, uid: str) -> None:
        used: dict[str, Fraction] = {}
        for class_name, charge, _ in self.alive.values():
            used[class_name] = used.get(class_name, Fraction(0)) + charge
        used["*"] = sum(used.values(), Fraction(0))
        self.over += [
            f"{name} {used[name]} after {uid}" for name in used if used[name] > self.limits[name]
        ]


def send(
    cluster: Cluster,
    replicas: list[Any],
    creates: dict[asyncio.Task[None], int],
    sent: list[dict[str, Any]],
    *,
    dry_runs: float,
) -> None:
    """Send one create to a replica at random: a new pod, or now and then one sent before
    (a retried request); a share `dry_runs` of them dry runs. Its task is kept in `creates`,
    by the replica's index, until it ends."""
    rng = cluster.rng
    index = rng.randrange(len(replicas))
    if sent and rng.random() < 0.1:
        body = rng.choice(sent[-10:])
    else:
        body = stored_pod(rng.choice(ASKS))
        sent.append(body)
    task = asyncio.create_task(
        cluster.create(replicas[index], body, dry_run=rng.random() < dry_runs)
    )
    creates[task] = index
    task.add_done_callback(creates.pop)


async def keep(replica: QuotaLedger) -> None:
    await replica.keep_allowances(lambda: None)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_random_interleavings_never_admit_past_a_limit(seed: int) -> None:
    rng = random.Random(seed)
    flaking = [True]
    store = flaky(rng, flaking)
    cluster = Cluster(rng, store)
    replicas = [cluster.replica() for _ in range(3)]
    keepers = [asyncio.create_task(keep(replica)) for replica in replicas]
    deleter = asyncio.create_task(cluster.delete_now_and_then())
    creates: dict[asyncio.Task[None], int] = {}
    sent: list[dict[str, Any]] = []
    killed = False
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        await asyncio.sleep(rng.random() * 0.02)
        if not killed and time.monotonic() > end - SECONDS / 2:
            # Killed: its keeper, its batches and the requests it was judging go with it,
            # and a new replica (a new name) starts in its place.
            killed = True
            victim = replicas[0]
            keepers[0].cancel()
            for task in victim.judge._committers.values():
                task.cancel()
            for task, index in list(creates.items()):
                if index == 0:
                    task.cancel()
            cluster.stop(victim)
            replicas[0] = cluster.replica()
            keepers[0] = asyncio.create_task(keep(replicas[0]))
        send(cluster, replicas, creates, sent, dry_runs=0.1)
    flaking[0] = False
    await asyncio.gather(*creates, return_exceptions=True)
    await cluster.settle()
    for task in (*keepers, deleter):
        task.cancel()
    await asyncio.gather(*keepers, deleter, return_exceptions=True)
    print(f"\n{cluster.admitted} admitted, {cluster.aside} from room aside, {store.writes} writes")
    assert not cluster.over, cluster.over[:5]
    assert cluster.admitted > 10, "too few admissions to prove anything"
