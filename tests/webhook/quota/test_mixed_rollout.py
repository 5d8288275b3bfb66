"""A rolling upgrade from 0.1.0, in random interleavings: replicas of 0.1.0 and of this
version judge the same namespace side by side, over one ConfigMap record, while creates
stream in and replicas are replaced one by one, as `helm upgrade` replaces them. Whatever
happens, the pods admitted and alive never exceed a limit.

0.1.0's replica is modelled as its quota judged (its `record_of` and its admission judge):
it reads `reservations.json` as a mapping of pod uid to reservation, counts what its watch
shows and every reservation of the last 90 s whose pod it has not seen, judges by the same
rule, and writes the mapping back at the version it read, again after a lost race. It
knows nothing of the record's mark or of room set aside: this version's records must make
it fail, never count short. (The real 0.1.0, on a real apiserver and node, is the upgrade
test of the end-to-end suite.)
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from fractions import Fraction
from typing import Any

import orjson
import pytest

from policies import Plan
from policies.quota.judge import QuotaVerdict, judge
from tests.webhook.gpu_hours.apiserver import ConfigMaps
from tests.webhook.quota.test_allowances_random import LIMITS, QUOTAS, Cluster, keep, send
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.kube.objects import MANAGED_BY, USAGE_RECORD_LABEL
from webhook.quota.configmap_store import DATA_KEY, FORMAT_KEY, ConfigMapStore, record_name
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import Reservation
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

NAMESPACE = "gpuadm-system"
SECONDS = 4.0
# A reservation's lifetime, in the test's time: a pod is stored within 0.3 s of its
# admission and shown within 0.3 s more, as in a cluster one is stored within the
# apiserver's 60 s and a reservation lives 90 s. So the reservations of pods deleted before
# a replica started, which it counts until they expire, are not counted for long.
TTL = 1.0
# At most this long between two deletions: often, so that room frees often while the
# namespace is at its limits, and is fought over.
DELETE_SECONDS = 0.1


class Apiserver(ConfigMaps):
    """ConfigMaps as the apiserver keeps them, each call a few milliseconds long (so that
    replicas interleave between a read and a write), deletes with a precondition too."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng

    async def _pause(self) -> None:
        await asyncio.sleep(self.rng.random() * 0.004)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._pause()
        return await super().get_configmap(namespace, name)

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._pause()
        return await super().create_configmap(namespace, body)

    async def replace_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._pause()
        return await super().replace_configmap(namespace, body)

    async def delete_configmap(self, namespace: str, name: str, *, resource_version: str) -> None:
        await self._pause()
        found = self.objects.get(name)
        if found is None:
            raise KubeError(404, f'configmaps "{name}" not found')
        if found["metadata"]["resourceVersion"] != resource_version:
            raise KubeError(409, "the object has been modified")
        del self.objects[name]


class Replica010:
    """A replica of 0.1.0, as its quota judged (see the module's docstring)."""

    def __init__(self, api: Apiserver, usage: UsageIndex) -> None:
        self.api = api
        self.usage = usage
        self.lock = asyncio.Lock()  # a namespace's admissions, one after another
        self.admitted = 0
        self.unreadable = 0

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        assert plan.class_name is not None
        terms = config.quotas.terms(request.namespace)
        uid = str(request.object["metadata"]["uid"])
        async with self.lock:
            for _ in range(10):
                found = await self.api.get_configmap(NAMESPACE, record_name(request.namespace))
                data = (found or {}).get("data") or {}
                try:  # 0.1.0's `record_of`
                    raw = orjson.loads(data.get(DATA_KEY) or "{}")
                    reservations = {u: Reservation.from_json(e) for u, e in raw.items()}
                except Exception:  # 0.1.0: "gpuadm failed to judge this request; retry"
                    self.unreadable += 1
                    return QuotaVerdict(False, "gpuadm failed to judge this request; retry")
                now = time.time()
                kept = {u: r for u, r in reservations.items() if now - r.at < TTL}
                in_use = dict(self.usage.in_use(request.namespace))
                for unseen in self.usage.unseen(kept):
                    reservation = kept[unseen]
                    in_use[reservation.class_name] = (
                        in_use.get(reservation.class_name, Fraction(0)) + reservation.charge
                    )
                own = kept.get(uid)  # a retried request is not counted against itself
                if own is not None and not self.usage.seen(uid):
                    in_use[own.class_name] -= own.charge
                verdict = judge(
                    namespace=request.namespace,
                    class_name=plan.class_name,
                    requested=plan.charge,
                    in_use=in_use,
                    limits=terms.limits,
                    mode=terms.mode,
                )
                if not verdict.allowed:
                    return verdict
                kept[uid] = Reservation(plan.class_name, plan.charge, now, request.pod_name)
                metadata: dict[str, Any] = {
                    "name": record_name(request.namespace),
                    "namespace": NAMESPACE,
                    "labels": {**MANAGED_BY, USAGE_RECORD_LABEL: request.namespace},
                }
                if found is not None:
                    metadata["resourceVersion"] = found["metadata"]["resourceVersion"]
                text = orjson.dumps({u: r.to_json() for u, r in kept.items()}).decode()
                body = {"metadata": metadata, "data": {DATA_KEY: text}}
                try:
                    if found is None:
                        await self.api.create_configmap(NAMESPACE, copy.deepcopy(body))
                    else:
                        await self.api.replace_configmap(NAMESPACE, copy.deepcopy(body))
                except KubeError as error:
                    if error.status == 409:
                        continue
                    raise
                self.admitted += 1
                return verdict
            return QuotaVerdict(False, "the quota record is busy; retry the request")


@pytest.mark.parametrize("seed", range(1, 7))
async def test_a_rolling_upgrade_from_0_1_0_never_admits_past_a_limit(seed: int) -> None:
    rng = random.Random(seed)
    api = Apiserver(rng)
    store = ConfigMapStore(api, NAMESPACE)
    cluster = Cluster(rng, store, QUOTAS, LIMITS, delete_seconds=DELETE_SECONDS)
    old = [Replica010(api, cluster.view()) for _ in range(3)]
    replicas: list[Replica010 | QuotaLedger] = list(old)
    keepers: list[asyncio.Task[None]] = []
    deleter = asyncio.create_task(cluster.delete_now_and_then())
    creates: dict[asyncio.Task[None], int] = {}
    sent: list[dict[str, Any]] = []
    start = time.monotonic()
    # 0.1.0 alone at first; then one replica is replaced, and later the two others, the
    # oldest first, each with its requests in flight cut short, as a rolling update
    # replaces them: a long while with both versions serving.
    replace_at = [start + 0.5, start + SECONDS - 1.0, start + SECONDS - 0.5]
    formats_seen: set[str] = set()
    while time.monotonic() < start + SECONDS:
        await asyncio.sleep(rng.random() * 0.02)
        if replace_at and time.monotonic() > replace_at[0]:
            index = 3 - len(replace_at)
            replace_at.pop(0)
            for task, at in list(creates.items()):
                if at == index:
                    task.cancel()
            new = cluster.replica(reservation_ttl=TTL)
            replicas[index] = new
            keepers.append(asyncio.create_task(keep(new)))
        send(cluster, replicas, creates, sent, dry_runs=0.0)
        found = api.objects.get(record_name("team-a"))
        if found is not None:
            formats_seen.add((found.get("data") or {}).get(FORMAT_KEY, "0.1.0"))
    await asyncio.gather(*creates, return_exceptions=True)
    await cluster.settle()
    for task in (*keepers, deleter):
        task.cancel()
    await asyncio.gather(*keepers, deleter, return_exceptions=True)
    by_old = sum(replica.admitted for replica in old)
    refused = sum(replica.unreadable for replica in old)
    print(f"\n{cluster.admitted} admitted, {by_old} by 0.1.0, {refused} refused unread by it")
    assert not cluster.over, cluster.over[:5]
    # The upgrade really was mixed: 0.1.0 admitted, met this version's record and refused,
    # and this version took 0.1.0's record over.
    assert by_old > 0
    assert cluster.admitted > by_old
    assert refused > 0
    assert formats_seen == {"0.1.0", "2"}
