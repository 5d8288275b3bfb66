"""Reservations that leave the record once their pods are shown, and the
record's mark: a replica whose pod watch is behind the mark waits for it, or refuses with
"retry", and never judges without the pods whose reservations left.

Each replica runs its real pod watcher against a stand-in apiserver that numbers every pod
change with the next resourceVersion and lets each replica's watch through only as far as
the test says, so that watches lag as they do in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import jsonpatch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies import plan, require_fixed_point
from policies.policy import GATE_SUFFIX
from policies.quota.judge import QuotaVerdict
from policies.quota.queue import add_gate, remove_gate
from tests.builders import POLICY_YAML, pod
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.kube.objects import Page
from webhook.observe.metrics import Metrics
from webhook.quota.ledger import QuotaLedger
from webhook.quota.podwatch import PodWatcher
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.quota.watermark import NOT_IN_SYNC
from webhook.reviews.request import AdmissionRequest

QUOTAS = "namespaces:\n  team-a: {h100: 4, a100: 1}\n  team-q: {mode: queue, h100: 1}\n"
GATE = f"gpuadm.io/{GATE_SUFFIX}"
LIMIT = 4
# Long enough never to run out while the test lets the watch through; short enough for the
# replicas that must give up.
PATIENT = 5.0
IMPATIENT = 0.01


@functools.cache
def config() -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


def gpu_pod(limits: dict[str, str], namespace: str = "team-a") -> dict[str, Any]:
    """A pod as stored: gpuadm's patch applied (its class label among it), a uid, a name."""
    body = pod(limits)
    body = dict(jsonpatch.apply_patch(body, plan(body, config().policy).patch))
    body["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), name=uuid.uuid4().hex[:8])
    return body


def uid(body: dict[str, Any]) -> str:
    return str(body["metadata"]["uid"])


class Apiserver:
    """Pods and their changes, each numbered with the next resourceVersion; each replica's
    watch is let through up to a number of changes (`hold`, `let_through`)."""

    def __init__(self) -> None:
        self.version = 100
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.allowed: dict[int, int | None] = {}
        self._changed = asyncio.Condition()

    def create(self, body: dict[str, Any], *, watched: bool = True) -> int:
        """Store a pod; unless `watched`, no watch shows it (it lacks the watch's label)."""
        stored = self._next(body)
        self.pods[uid(stored)] = stored
        if watched:
            self._publish("ADDED", stored)
        return self.version

    def modify(self, body: dict[str, Any]) -> int:
        stored = self._next(body)
        self.pods[uid(stored)] = stored
        self._publish("MODIFIED", stored)
        return self.version

    def delete(self, pod_uid: str) -> int:
        stored = self._next(self.pods.pop(pod_uid))
        self._publish("DELETED", stored)
        return self.version

    def hold(self, replica: int) -> None:
        """Let the replica's watch through no further than it is now."""
        self.allowed[replica] = len(self.events)

    def let_through(self, replica: int, count: int | None = None) -> None:
        """Let `count` more changes through to the replica's watch (None: all, from now on)."""
        allowed = self.allowed.get(replica)
        self.allowed[replica] = None if count is None or allowed is None else allowed + count
        self._notify()

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        return stored

    def _publish(self, kind: str, stored: dict[str, Any]) -> None:
        self.events.append({"type": kind, "object": stored})
        self._notify()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        # The cluster changes between awaits of the test, so the watchers learn at the next.
        asyncio.get_running_loop().create_task(notify())

    async def watch(self, replica: int, after: int) -> AsyncGenerator[dict[str, Any]]:
        sent = sum(
            1 for e in self.events if int(e["object"]["metadata"]["resourceVersion"]) <= after
        )
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._more, replica, sent))
            while sent < self.visible(replica):
                yield self.events[sent]
                sent += 1

    def _more(self, replica: int, sent: int) -> bool:
        return sent < self.visible(replica)

    def visible(self, replica: int) -> int:
        """Return how many changes the replica's watch is let through."""
        allowed = self.allowed.get(replica)
        return len(self.events) if allowed is None else min(allowed, len(self.events))


class ReplicaApi:
    """The two calls of a replica's pod watcher, answered by the stand-in apiserver."""

    def __init__(self, apiserver: Apiserver, replica: int) -> None:
        self.apiserver = apiserver
        self.replica = replica

    def list_pods(self) -> AsyncGenerator[Page]:
        async def pages() -> AsyncGenerator[Page]:
            yield Page(list(self.apiserver.pods.values()), str(self.apiserver.version), None)

        return pages()

    def watch_pods(
        self, *, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncGenerator[dict[str, Any]]:
        return self.apiserver.watch(self.replica, int(resource_version))


class Replica:
    """One gpuadm replica's quota: its pod watcher, its index and its ledger."""

    def __init__(
        self,
        apiserver: Apiserver,
        store: MemoryStore,
        index: int,
        *,
        catch_up: float,
        clock: Callable[[], float],
    ) -> None:
        self.index = index
        self.apiserver = apiserver
        self.usage = UsageIndex()
        self.relists = 0
        self.watcher = PodWatcher(
            ReplicaApi(apiserver, index),  # type: ignore[arg-type]
            self.usage,
            ConfigHolder(config()),
            Metrics(),
            clock=clock,
        )
        self.ledger = QuotaLedger(
            self.usage,
            store,
            pods_visible=True,
            clock=clock,
            catch_up_seconds=catch_up,
            relist=self._relist,
        )

    def _relist(self) -> None:
        self.relists += 1

    async def judged(self, body: dict[str, Any]) -> QuotaVerdict:
        snapshot = config()
        request = AdmissionRequest(
            uid=str(uuid.uuid4()),
            operation="CREATE",
            namespace="team-a",
            name=body["metadata"]["name"],
            object=body,
            old_object=None,
            dry_run=False,
            user="alice",
            groups=(),
        )
        outcome = await self.ledger.admit(
            request, require_fixed_point(plan(body, snapshot.policy)), snapshot
        )
        assert outcome is not None
        return outcome

    async def shown(self) -> None:
        """Return once the watch has applied every change it is let through."""
        visible = self.apiserver.visible(self.index)
        target = (
            int(self.apiserver.events[visible - 1]["object"]["metadata"]["resourceVersion"])
            if visible
            else 0
        )
        for _ in range(1000):
            if self.usage.version >= target:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"replica {self.index} never showed version {target}")


@contextlib.asynccontextmanager
async def replicas(
    catch_ups: list[float], clock: Callable[[], float] = lambda: 1000.0
) -> AsyncIterator[tuple[Apiserver, MemoryStore, list[Replica]]]:
    """Run one replica for each catch-up time, their watches following one apiserver."""
    apiserver, store = Apiserver(), MemoryStore()
    running = [
        Replica(apiserver, store, index, catch_up=seconds, clock=clock)
        for index, seconds in enumerate(catch_ups)
    ]
    tasks = [asyncio.create_task(replica.watcher.run()) for replica in running]
    try:
        for replica in running:
            await replica.shown()
        yield apiserver, store, running
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_reservation_leaves_the_record_at_the_first_write_after_its_pod_is_shown() -> None:
    async with replicas([PATIENT]) as (apiserver, store, (one,)):
        # Pods of 2 of the limit of 4: half of what is left never holds another, so no
        # room is set aside, and each admission writes.
        first = gpu_pod({"gpuadm.io/h100": "2"})
        assert (await one.judged(first)).allowed
        assert set((await store.read("team-a")).reservations) == {uid(first)}
        shown_at = apiserver.create(first)
        await one.shown()
        second = gpu_pod({"gpuadm.io/h100": "2"})
        assert (await one.judged(second)).allowed
        record = await store.read("team-a")
        assert set(record.reservations) == {uid(second)}
        assert (record.mark.version, record.mark.label) == (shown_at, one.usage.label)
        assert record.allowances == {}
        # Both count: one as a pod, the other by its reservation.
        assert one.ledger.book.in_use("team-a") == {"h100": 4}


async def test_a_churning_namespace_keeps_only_the_pods_in_flight_in_its_record() -> None:
    async with replicas([PATIENT]) as (apiserver, store, (one,)):
        alive: list[str] = []
        for _ in range(60):
            body = gpu_pod({"gpuadm.io/h100": "1"})
            assert (await one.judged(body)).allowed
            assert len((await store.read("team-a")).reservations) <= 1
            apiserver.create(body)
            alive.append(uid(body))
            if len(alive) > 3:
                apiserver.delete(alive.pop(0))
            await one.shown()


async def test_a_replica_behind_the_mark_never_judges_without_the_pods_that_left() -> None:
    # The writer has seen everything; the two others see nothing new until let through.
    async with replicas([PATIENT, IMPATIENT, PATIENT]) as (apiserver, store, replicas_):
        writer, impatient, patient = replicas_
        apiserver.hold(impatient.index)
        apiserver.hold(patient.index)
        full = gpu_pod({"gpuadm.io/h100": str(LIMIT)})
        assert (await writer.judged(full)).allowed
        apiserver.create(full)
        await writer.shown()
        # Another class, so that it fits: the writer's write takes the full pod's
        # reservation out, with the mark of the change that showed it.
        assert (await writer.judged(gpu_pod({"gpuadm.io/a100": "1"}))).allowed
        record = await store.read("team-a")
        assert uid(full) not in record.reservations
        assert record.mark.version == apiserver.version
        # Neither lagging replica has seen the pod, nor has its reservation any more: one
        # gives up waiting and asks for a retry; it never admits.
        verdict = await impatient.judged(gpu_pod({"gpuadm.io/h100": "1"}))
        assert (verdict.allowed, verdict.message) == (False, NOT_IN_SYNC)
        # The other is let through while it waits, and counts the pod.
        waiting = asyncio.create_task(patient.judged(gpu_pod({"gpuadm.io/h100": "1"})))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        apiserver.let_through(patient.index)
        verdict = await waiting
        assert not verdict.allowed
        assert "h100 quota exceeded: requested 1, in use 4 of 4" in (verdict.message or "")
        # And once the impatient one is let through, it judges again, and counts it too.
        apiserver.let_through(impatient.index)
        await impatient.shown()
        verdict = await impatient.judged(gpu_pod({"gpuadm.io/h100": "1"}))
        assert "h100 quota exceeded" in (verdict.message or "")


async def test_only_pods_a_watch_shows_holding_gpus_leave_the_record() -> None:
    async with replicas([PATIENT]) as (apiserver, store, (one,)):
        # A pod no watch shows (stored without the label): only a full list would find it.
        unlabelled = gpu_pod({"gpuadm.io/h100": "1"})
        assert (await one.judged(unlabelled)).allowed
        apiserver.create(unlabelled, watched=False)
        await one.shown()
        assert (await one.judged(gpu_pod({"gpuadm.io/h100": "1"}))).allowed
        record = await store.read("team-a")
        assert uid(unlabelled) in record.reservations
        assert record.mark.version == 0


async def test_a_pod_shown_behind_gpuadms_gate_holds_nothing_and_is_not_shown_holding() -> None:
    async with replicas([PATIENT]) as (apiserver, _, (one,)):
        body = gpu_pod({"gpuadm.io/h100": "1"}, namespace="team-q")
        gated = jsonpatch.apply_patch(body, [add_gate(body, GATE)])
        apiserver.create(gated)
        await one.shown()
        # Its reservation, made when it is charged, must stay until it is shown ungated.
        assert one.usage.shown_in(uid(body)) is None
        apiserver.modify(jsonpatch.apply_patch(gated, remove_gate(gated, GATE)))
        await one.shown()
        assert one.usage.shown_in(uid(body)) == apiserver.version


async def test_an_emptied_record_keeps_its_mark_until_the_reservations_lifetime_is_over() -> None:
    now = [1000.0]
    async with replicas([PATIENT, IMPATIENT], clock=lambda: now[0]) as (apiserver, store, reps):
        writer, lagging = reps
        apiserver.hold(lagging.index)
        full = gpu_pod({"gpuadm.io/h100": str(LIMIT)})
        assert (await writer.judged(full)).allowed
        apiserver.create(full)
        await writer.shown()
        now[0] += 10
        await writer.ledger.book.prune_all()
        record = await store.read("team-a")
        assert (record.reservations, record.mark.version) == ({}, apiserver.version)
        # The record stays, so a replica whose watch lags cannot judge without the pod.
        verdict = await lagging.judged(gpu_pod({"gpuadm.io/h100": "1"}))
        assert (verdict.allowed, verdict.message) == (False, NOT_IN_SYNC)
        now[0] += 89  # 89 s after the reservation left
        await writer.ledger.book.prune_all()
        assert await store.namespaces() == ["team-a"]
        now[0] += 2
        await writer.ledger.book.prune_all()
        assert await store.namespaces() == []


async def test_a_mark_made_by_a_watch_of_another_label_is_reached_by_a_full_list_only() -> None:
    async with replicas([PATIENT, IMPATIENT]) as (apiserver, store, (writer, other)):
        full = gpu_pod({"gpuadm.io/h100": str(LIMIT)})
        assert (await writer.judged(full)).allowed
        apiserver.create(full)
        await writer.shown()
        await other.shown()
        assert (await writer.judged(gpu_pod({"gpuadm.io/a100": "1"}))).allowed
        # The other replica has seen the pod, but watches another label now (a policy that
        # renamed it): its watch could miss the pods the mark stands for.
        other.usage.watching("example.com/renamed")
        verdict = await other.judged(gpu_pod({"gpuadm.io/h100": "1"}))
        assert (verdict.allowed, verdict.message) == (False, NOT_IN_SYNC)
        assert other.relists == 1
        # And it drops nothing under a mark of another label.
        assert (await store.read("team-a")).mark.label == writer.usage.label
        # A full list at or after the mark is a view that holds every pod.
        holdings, waiting, version = await other.watcher._fetch_holdings(config())
        other.usage.replace_all(holdings, now=0, waiting=waiting, version=int(version))
        verdict = await other.judged(gpu_pod({"gpuadm.io/h100": "1"}))
        assert "h100 quota exceeded" in (verdict.message or "")


# Steps of the random interleavings: create on a replica (the pod stored or, as when a
# later webhook refuses it, never), let a replica's watch through some changes, delete a
# stored pod, prune, let time pass (every watch caught up first).
CREATE = st.tuples(st.just("create"), st.integers(0, 2), st.integers(1, 3), st.booleans())
DELIVER = st.tuples(st.just("deliver"), st.integers(0, 2), st.integers(1, 4))
STEPS = st.lists(
    st.one_of(
        # Creates and deliveries more often than the rest: a race needs a few of each.
        CREATE,
        CREATE,
        CREATE,
        DELIVER,
        DELIVER,
        st.tuples(st.just("delete"), st.integers(0, 20)),
        st.tuples(st.just("prune"), st.integers(0, 2)),
        st.tuples(st.just("tick"), st.sampled_from([1.0, 30.0, 95.0])),
    ),
    min_size=3,
    max_size=15,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
# The race the mark is for, as the search found it without the wait for the mark: the first
# replica sees a pod and prunes its reservation; the second, which has not seen the pod,
# judges next.
@example([("deliver", 0, 1), ("create", 0, 3, True), ("prune", 0), ("create", 1, 2, True)])
# The same with an admission's write instead of the prune.
@example(
    [("deliver", 0, 2), ("create", 0, 3, True), ("create", 0, 1, False), ("create", 2, 2, True)]
)
def test_replicas_whose_watches_lag_never_admit_past_the_limit(
    steps: list[tuple[Any, ...]],
) -> None:
    asyncio.run(_interleaved(steps))


async def _interleaved(steps: list[tuple[Any, ...]]) -> None:
    now = [1000.0]
    async with replicas([IMPATIENT] * 3, clock=lambda: now[0]) as (apiserver, store, reps):
        for replica in reps:
            apiserver.hold(replica.index)
        charges: dict[str, int] = {}
        for step in steps:
            if step[0] == "create":
                _, index, size, stored = step
                body = gpu_pod({"gpuadm.io/h100": str(size)})
                shown = {u for u in apiserver.pods if reps[index].usage.shown_in(u) is not None}
                writes = store.writes
                verdict = await reps[index].judged(body)
                # One admitted from the replica's room aside writes nothing; one that wrote
                # left out every reservation of a pod its writer had shown.
                if verdict.allowed and store.writes > writes:
                    kept = shown & set((await store.read("team-a")).reservations)
                    assert not kept, "a write kept reservations of pods its writer had shown"
                    if stored:
                        apiserver.create(body)
                        charges[uid(body)] = size
            elif step[0] == "deliver":
                _, index, count = step
                apiserver.let_through(index, count)
                await reps[index].shown()
            elif step[0] == "delete" and charges:
                gone = list(charges)[step[1] % len(charges)]
                apiserver.delete(gone)
                del charges[gone]
            elif step[0] == "prune":
                await reps[step[1]].ledger.book.prune_all()
            elif step[0] == "tick":
                # A watch that has shown nothing for 60 s fails closed (not modelled here):
                # the watches that lag, lag by less than a reservation lives.
                for replica in reps:
                    apiserver.let_through(replica.index, len(apiserver.events))
                    await replica.shown()
                now[0] += step[1]
            assert sum(charges.values()) <= LIMIT, f"over the limit after {step}: {charges}"
            # Between steps, each watch has shown all it is let through, no more: how far
            # each lags is the steps', not the event loop's.
            for replica in reps:
                await replica.shown()
