"""The leader's pass over a line, against a stand-in for the apiserver's pods and Events."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import jsonpatch
import pytest

from tests.webhook.quota.test_queue_ledger import (
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
from webhook.leader.release import PER_TURN, Releaser
from webhook.observe.metrics import Metrics
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex


class Cluster:
    """Pods and Events by (namespace, name); a JSON patch whose `test` fails is a 422."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.patched: list[str] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.pods.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def patch_pod(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        try:
            patched: dict[str, Any] = jsonpatch.apply_patch(self.pods[namespace, name], patch)
        except jsonpatch.JsonPatchException as error:
            raise KubeError(422, str(error)) from None
        self.pods[namespace, name] = patched
        self.patched.append(name)
        return patched

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.events.get((namespace, name))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.events[namespace, body["metadata"]["name"]] = body
        return body

    async def replace_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.create_event(namespace, body)


def releaser(ledger: QuotaLedger, usage: UsageIndex, cluster: Cluster) -> Releaser:
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    return Releaser(
        ledger.line,
        usage,
        ConfigHolder(config()),
        api,
        EventWriter(
            PodEvents(api, "gpuadm-0"),
            usage,
            lambda namespace: ledger.line.placer(namespace, config().quotas.limits_for(namespace)),
        ),
        leading=lambda: True,
        ready=lambda: True,
        metrics=Metrics(),
    )


async def test_a_terminating_pod_whose_gate_is_gone_keeps_its_charge_and_its_room() -> None:
    # An earlier leader charged `running` and removed its gate; the pod ran and is being
    # deleted now, its GPUs still in use. This leader's watch lags: it still shows it gated.
    usage = UsageIndex()
    store = MemoryStore()
    ledger = QuotaLedger(usage, store, pods_visible=True)
    running = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    observe(usage, running)
    earlier = QuotaLedger(usage, store, pods_visible=True)
    released, _ = await earlier.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(running)]
    terminating = ungated(running)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"
    # A pod created since, ahead of it in line, would take its room if it were given back.
    urgent = stored_pod({"gpuadm.io/a100": "1"}, gated=True, priority=1000)
    observe(usage, urgent)
    cluster = Cluster(terminating, urgent)
    leader = releaser(ledger, usage, cluster)

    await leader.pass_once()
    assert await stored_charges(store, "team-q") == {uid(running): 1}
    assert cluster.patched == []

    leader.wake_all()
    await leader.pass_once()
    assert await stored_charges(store, "team-q") == {uid(running): 1}
    assert cluster.patched == []


# --- fairness: a long line never holds up another namespace ----------------------------------

FAIR_QUOTAS = """
namespaces:
  team-long: {mode: queue, a100: 100000}
  team-full: {mode: queue, a100: 1}
  team-b: {mode: queue, a100: 1}
  team-c: {mode: queue, a100: 1}
"""


class CountingCluster(Cluster):
    """The stand-in, counting every call, in order."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        super().__init__(*pods)
        self.calls: list[str] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {namespace}/{name}")
        return await super().get_pod(namespace, name)

    async def patch_pod(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls.append(f"patch {namespace}/{name}")
        return await super().patch_pod(namespace, name, patch)

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"event {namespace}")
        return await super().get_event(namespace, name)


def many(namespace: str, count: int, limits: dict[str, str]) -> list[dict[str, Any]]:
    """`count` gated pods of a namespace, in line in the order made."""
    template = stored_pod(limits, namespace, gated=True)
    made = []
    for i in range(count):
        body = copy.deepcopy(template)
        body["metadata"].update(
            uid=f"{namespace}-{i}",
            name=f"{namespace}-{i:05d}",
            creationTimestamp=f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
        )
        made.append(body)
    return made


def fair_leader(
    usage: UsageIndex, ledger: QuotaLedger, cluster: Cluster, **options: Any
) -> tuple[Releaser, EventWriter]:
    snapshot = config(FAIR_QUOTAS)
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    writer = EventWriter(
        PodEvents(api, "gpuadm-0"),
        usage,
        lambda namespace: ledger.line.placer(namespace, snapshot.quotas.limits_for(namespace)),
        **options,
    )
    leader = Releaser(
        ledger.line,
        usage,
        ConfigHolder(snapshot),
        api,
        writer,
        leading=lambda: True,
        ready=lambda: True,
        metrics=Metrics(),
    )
    usage.on_change(leader.wake)
    return leader, writer


def observe_all(usage: UsageIndex, pods: list[dict[str, Any]]) -> None:
    snapshot = config(FAIR_QUOTAS)
    for body in pods:
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)


async def test_a_line_of_2000_that_fit_gets_one_bounded_turn_before_another_namespace() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    long_line = many("team-long", 2000, {"gpuadm.io/a100": "1"})
    (other,) = many("team-b", 1, {"gpuadm.io/a100": "1"})
    cluster = CountingCluster(*long_line, other)
    leader, _ = fair_leader(usage, ledger, cluster)
    observe_all(usage, long_line)  # woken first
    observe_all(usage, [other])
    leader._everything = False  # only the namespaces woken by the watch

    await leader.pass_once()

    # team-long had one turn of PER_TURN releases (a get and a patch each), then team-b.
    assert cluster.calls.index("patch team-b/team-b-00000") == 2 * PER_TURN + 1
    assert len(cluster.patched) == PER_TURN + 1
    assert leader.due() == ["team-long"]  # more to release: its next turn comes after
    assert leader.turns == 2


async def test_a_fresh_line_of_2000_writes_no_event_before_another_namespace_is_released() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    holder = stored_pod({"gpuadm.io/a100": "1"}, "team-full")
    observe_all(usage, [holder])
    long_line = many("team-full", 2000, {"gpuadm.io/a100": "1"})  # none fits
    (other,) = many("team-b", 1, {"gpuadm.io/a100": "1"})
    cluster = CountingCluster(*long_line, other)
    leader, writer = fair_leader(usage, ledger, cluster)
    observe_all(usage, long_line)
    observe_all(usage, [other])

    await leader.pass_once()  # every line: the replica just became the leader

    # The whole pass: team-b's pod fetched and ungated, not one Event written on the way.
    assert cluster.calls == ["get team-b/team-b-00000", "patch team-b/team-b-00000"]
    assert cluster.events == {}
    # The Events come from the writer, a bounded batch of pods at a time.
    assert await writer.step()
    assert len(cluster.events) == writer.batch
    assert (
        cluster.events["team-full", "team-full-00001.gpuadm-waiting-team-ful"]["message"]
        == 'waiting for GPU quota: namespace "team-full": a100 quota is held for the pods ahead '
        "(in use 1 of 1); 1 pod ahead of it in line"
    )


async def test_namespaces_with_more_to_release_take_turns_woken_ones_first() -> None:
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    long_line = many("team-long", 3 * PER_TURN + 5, {"gpuadm.io/a100": "1"})
    b_pods = many("team-b", 1, {"gpuadm.io/a100": "1"})
    c_pods = many("team-c", 1, {"gpuadm.io/a100": "1"})
    cluster = CountingCluster(*long_line, *b_pods, *c_pods)
    leader, _ = fair_leader(usage, ledger, cluster)
    observe_all(usage, long_line)
    leader._everything = False
    await leader.pass_once()
    assert len(cluster.patched) == PER_TURN
    # team-b and team-c are woken while team-long still has work: it waits its turn behind
    # them only if it is due again after them; it was due first, so it keeps its place.
    observe_all(usage, c_pods)
    observe_all(usage, b_pods)
    assert leader.due() == ["team-long", "team-c", "team-b"]
    await leader.pass_once()
    order = [name.split("-0")[0] for name in cluster.patched[PER_TURN:]]
    assert order == ["team-long"] * PER_TURN + ["team-c", "team-b"]
    assert leader.due() == ["team-long"]
    await leader.pass_once()
    await leader.pass_once()
    assert len(cluster.patched) == 3 * PER_TURN + 5 + 2
    assert leader.due() == []


async def test_a_failing_pass_reaches_the_supervisor_and_a_restart_looks_at_every_line() -> None:
    # A pass that fails is not swallowed (logged with a traceback on every pass, uncounted):
    # it ends the loop, so the supervisor logs it once, counts it and restarts it.
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    leader = releaser(ledger, usage, Cluster())
    passes: list[bool] = []

    async def failing_pass() -> None:
        passes.append(leader._everything)
        leader._everything = False  # as a real pass does first
        raise RuntimeError("the apiserver answered nonsense")

    leader.pass_once = failing_pass  # type: ignore[method-assign]
    leader.wake("team-q")
    with pytest.raises(RuntimeError, match="nonsense"):
        await asyncio.wait_for(leader.run(), timeout=10)
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(leader.run(), timeout=10)
    assert passes == [True, True]


async def test_every_line_gets_its_periodic_pass_however_often_others_wake_the_releaser() -> None:
    # A line that waits on time alone (a GPU-hour budget that frees, a reservation that
    # expires) has no event to wake it: the pass over every line must come every period even
    # while another namespace's pods change all the time.
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    leader = releaser(ledger, usage, Cluster())
    leader.period = 0.2
    everything: list[bool] = []

    async def recording_pass() -> None:
        everything.append(leader._everything)
        leader._everything = False
        leader._due.clear()

    leader.pass_once = recording_pass  # type: ignore[method-assign]

    async def busy() -> None:
        while True:
            leader.wake("busy")
            await asyncio.sleep(0.02)

    waking = asyncio.create_task(busy())
    running = asyncio.create_task(leader.run())
    await asyncio.sleep(1.1)
    running.cancel()
    waking.cancel()
    await asyncio.gather(running, waking, return_exceptions=True)
    # The first pass at start, then one every 0.2 s among the busy namespace's turns.
    assert everything.count(True) >= 4, everything.count(True)
