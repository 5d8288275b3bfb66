"""The leader's pass over a line, against a stand-in for the apiserver's pods and Events."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

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
from webhook.leader.release import Releaser
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
        ledger,
        usage,
        ConfigHolder(config()),
        api,
        EventWriter(
            PodEvents(api, "gpuadm-0"),
            usage,
            lambda namespace: ledger.placer(namespace, config().quotas.limits_for(namespace)),
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
    released, _ = await earlier.release("team-q", config().quotas)
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
