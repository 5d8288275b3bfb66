"""Room set aside, in random interleavings: three replicas (one without allowances), their
keepers, writes that fail before or after they land, full records, dry runs, retried
requests, pods shown and deleted, and a replica killed and started anew. Whatever happens,
the pods admitted and alive never exceed a limit."""

from __future__ import annotations

import asyncio
import random
import time
from fractions import Fraction
from typing import Any

import pytest

from policies import plan, require_fixed_point
from tests.webhook.quota.stores import FailingStore, Fate
from tests.webhook.quota.test_ledger import config, request, stored_pod
from webhook.quota.ledger import QuotaLedger
from webhook.quota.usage import UsageIndex

QUOTAS = """
namespaces:
  team-a: {h100: 10, a100: 4, "*": 12}
"""
LIMITS = {"h100": Fraction(10), "a100": Fraction(4), "*": Fraction(12)}
ASKS = ({"gpuadm.io/h100": "1"}, {"gpuadm.io/h100": "2"}, {"gpuadm.io/a100": "1"})
SECONDS = 4.0


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


class Cluster:
    """The pods alive, the replicas' views of them, and what was ever over a limit."""

    def __init__(self, rng: random.Random, store: FailingStore, *, drop_shown: bool) -> None:
        self.rng = rng
        self.store = store
        self.drop_shown = drop_shown
        self.snapshot = config(QUOTAS)
        self.version = 1
        self.alive: dict[str, tuple[str, Fraction, dict[str, Any]]] = {}
        self.ever: set[str] = set()
        self.views: list[UsageIndex] = []
        self.over: list[str] = []
        self.admitted = 0
        self.showing: set[asyncio.Task[None]] = set()

    def replica(self, *, allowances: bool) -> QuotaLedger:
        """Start a replica whose watch has listed every pod alive."""
        usage = UsageIndex()
        for _, _, body in self.alive.values():
            self._observe(usage, body)
        usage.advance(self.version)
        self.views.append(usage)
        return QuotaLedger(
            usage, self.store, pods_visible=True, allowances=allowances, drop_shown=self.drop_shown
        )

    def stop(self, replica: QuotaLedger) -> None:
        self.views.remove(replica.book.usage)

    async def create(self, replica: QuotaLedger, body: dict[str, Any], *, dry_run: bool) -> None:
        """Ask a replica to admit a pod; one admitted is stored and shown a moment later."""
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
        # Stored: every watch shows it a moment later, whatever becomes of this replica.
        showing = asyncio.create_task(self._show(body))
        self.showing.add(showing)
        showing.add_done_callback(self.showing.discard)

    async def _show(self, body: dict[str, Any]) -> None:
        await asyncio.sleep(self.rng.random() * 0.3)
        self.version += 1
        for usage in self.views:
            self._observe(usage, body)
            usage.advance(self.version)

    async def delete_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(self.rng.random() * 0.4)
            if self.alive:
                uid = self.rng.choice(sorted(self.alive))
                del self.alive[uid]
                self.version += 1
                for usage in self.views:
                    usage.forget(uid, version=self.version)
                    usage.advance(self.version)

    def _observe(self, usage: UsageIndex, body: dict[str, Any]) -> None:
        snapshot = self.snapshot
        usage.observe(body, snapshot.policy, snapshot.quotas, now=time.time(), version=self.version)

    def _check(self, uid: str) -> None:
        used: dict[str, Fraction] = {}
        for class_name, charge, _ in self.alive.values():
            used[class_name] = used.get(class_name, Fraction(0)) + charge
        used["*"] = sum(used.values(), Fraction(0))
        self.over += [
            f"{name} {used[name]} after {uid}" for name in used if used[name] > LIMITS[name]
        ]


async def keep(replica: QuotaLedger) -> None:
    await replica.keep_allowances(lambda: None)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("drop_shown", [False, True])
async def test_random_interleavings_never_admit_past_a_limit(seed: int, drop_shown: bool) -> None:
    rng = random.Random(seed)
    flaking = [True]
    store = flaky(rng, flaking)
    cluster = Cluster(rng, store, drop_shown=drop_shown)
    replicas = [cluster.replica(allowances=True) for _ in range(2)]
    replicas.append(cluster.replica(allowances=False))
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
            replicas[0] = cluster.replica(allowances=True)
            keepers[0] = asyncio.create_task(keep(replicas[0]))
        index = rng.randrange(3)
        if sent and rng.random() < 0.1:
            body = rng.choice(sent[-10:])  # a retried request
        else:
            body = stored_pod(rng.choice(ASKS))
            sent.append(body)
        task = asyncio.create_task(
            cluster.create(replicas[index], body, dry_run=rng.random() < 0.1)
        )
        creates[task] = index
        task.add_done_callback(creates.pop)
    flaking[0] = False
    await asyncio.gather(*creates, return_exceptions=True)
    await asyncio.gather(*cluster.showing)
    for task in (*keepers, deleter):
        task.cancel()
    await asyncio.gather(*keepers, deleter, return_exceptions=True)
    print(f"\n{cluster.admitted} admitted, {store.writes} writes")
    assert not cluster.over, cluster.over[:5]
    assert cluster.admitted > 10, "too few admissions to prove anything"
