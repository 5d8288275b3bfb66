"""The Event writer: off the release path, bounded, coalescing, rate limited, fair."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from tests.webhook.leader.test_release import (
    FAIR_QUOTAS,
    CountingCluster,
    fair_leader,
    many,
    observe_all,
)
from tests.webhook.quota.test_queue_ledger import config, stored_pod
from webhook.kube.rest import AsyncApi
from webhook.leader.events import EventWriter, PodEvents
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex


class Clock:
    """A clock that moves only when the writer sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def writer_for(
    usage: UsageIndex, cluster: CountingCluster, clock: Clock, **options: Any
) -> EventWriter:
    snapshot = config(FAIR_QUOTAS)
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True, clock=clock)
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    return EventWriter(
        PodEvents(api, "gpuadm-0", clock=clock),
        usage,
        lambda namespace: ledger.line.placer(namespace, snapshot.quotas.limits_for(namespace)),
        clock=clock,
        sleep=clock.sleep,
        **options,
    )


def full_lines(usage: UsageIndex, *namespaces: str, count: int) -> list[dict[str, Any]]:
    """Lines of pods that wait: each namespace holds its whole limit already."""
    pods = []
    for namespace in namespaces:
        observe_all(usage, [stored_pod({"gpuadm.io/a100": "1"}, namespace)])
        line = many(namespace, count, {"gpuadm.io/a100": "1"})
        observe_all(usage, line)
        pods += line
    return pods


async def test_wakes_coalesce_and_namespaces_take_turns_a_batch_each() -> None:
    usage = UsageIndex()
    clock = Clock()
    cluster = CountingCluster()
    writer = writer_for(usage, cluster, clock, batch=10, rate=1000.0)
    full_lines(usage, "team-b", "team-c", count=25)
    for _ in range(100):
        writer.wake("team-b")
        writer.wake("team-c")
    assert writer.pending() == 2
    told: list[str] = []
    while await writer.step():
        told.append(cluster.calls[-1].split()[1])
        if len(told) > 20:
            break
    # 25 pods each, 10 a turn: b, c, b, c, b, c, and done.
    assert told == ["team-b", "team-c"] * 3
    assert len(cluster.events) == 50
    assert writer.pending() == 0


async def test_writes_are_paced_and_each_pod_is_told_again_only_when_its_news_is_due() -> None:
    usage = UsageIndex()
    clock = Clock()
    cluster = CountingCluster()
    writer = writer_for(usage, cluster, clock, batch=100, rate=20.0)
    pods = full_lines(usage, "team-b", count=30)
    writer.wake("team-b")
    while await writer.step():
        pass
    assert writer.writes == 30
    # 20 writes a second: the 29 after the first waited their turn.
    assert sum(clock.sleeps) >= 29 / 20 - 1e-9
    # Woken again at once: nothing changed, and the sweep waits out its interval.
    writer.wake("team-b")
    assert not await writer.step()
    # One pod leaves the line: every pod behind it moves up, and is told so after the
    # interval, in one sweep, coalesced whatever woke the namespace meanwhile.
    usage.forget(pods[0]["metadata"]["uid"])
    for _ in range(10):
        writer.wake("team-b")
    clock.now += 10
    while await writer.step():
        pass
    assert writer.writes == 30 + 29
    event = cluster.events["team-b", "team-b-00029.gpuadm-waiting-team-b-2"]
    assert event["message"].endswith("; 28 pods ahead of it in line")


async def test_released_pods_are_told_once_and_the_pending_ones_are_bounded() -> None:
    usage = UsageIndex()
    clock = Clock()
    cluster = CountingCluster()
    writer = writer_for(usage, cluster, clock, batch=100, rate=1000.0, queue_max=3)
    full_lines(usage, "team-b", count=5)
    writer.wake("team-b")
    while await writer.step():
        pass
    told = list(usage.line("team-b").ordered())
    never_told = many("team-c", 1, {"gpuadm.io/a100": "1"})
    observe_all(usage, never_told)
    writer.released(usage.line("team-c").ordered().__next__())  # waited for no Event: none
    for pod in told:
        writer.released(pod)
        writer.released(pod)  # coalesced
    assert writer.pending() == 3
    assert writer.dropped == 4  # the last two, twice each
    while await writer.step():
        pass
    released = [k for k in cluster.events if ".gpuadm-released-" in k[1]]
    assert [name.split(".")[0] for _, name in released] == [p.name for p in told[:3]]


async def test_leader_loops_end_when_cancelled_as_they_are_woken() -> None:
    # On losing the Lease their tasks are cancelled; a wake in the same moment must not
    # keep them running for a replica that no longer leads.
    usage = UsageIndex()
    cluster = CountingCluster()
    writer = writer_for(usage, cluster, Clock())
    leader, _ = fair_leader(usage, QuotaLedger(usage, MemoryStore(), pods_visible=True), cluster)

    def ignore() -> None:
        pass

    runs: list[tuple[Callable[[], Coroutine[Any, Any, None]], asyncio.Event]] = [
        (partial(writer.run, ignore), writer._wake),
        (leader.run, leader._wake),
    ]
    for yields in range(5):  # the cancel lands before, as and after the wait ends
        for run, woken in runs:
            task = asyncio.create_task(run())
            for _ in range(3):
                await asyncio.sleep(0)  # idle, waiting to be woken
            woken.set()
            for _ in range(yields):
                await asyncio.sleep(0)
            task.cancel()
            async with asyncio.timeout(0.5):  # well within either loop's own wait
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert task.cancelled()
