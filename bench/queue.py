"""Queue mode at scale: long lines must not slow anyone down.

Three figures, each beside its anchor, the same measurement with an empty line:

- a gated admission's judgement in a namespace where 20,000 pods wait (the line's index
  answers; nothing sorts or visits the line);
- admissions in one namespace while another has 20,000 pods waiting and churning (one leaves,
  one joins, every 100 ms) and this replica leads: releasing and Event writing run on the
  same event loop as admissions;
- the release of a pod that fits, in one namespace, just after 2,000 pods joined the line of
  another (whose Events are all still to write);
- the release of a gang of 64 pods that fits, from its line to the last gate removed, beside
  the release of 64 pods of no gang (turns of 20: four record writes, where the gang takes
  one).

They are measured in process, driving the real `UsageIndex`, `QuotaLedger`, `Releaser` and
`EventWriter`, with a stand-in for the apiserver: pods and Events kept in dicts, every call
taking `CALL_SECONDS` on the event loop's clock (what a call to a real apiserver took here;
see docs/performance.md). Filling a real apiserver with 20,000 pods, and the pod watch with
them, would take minutes per run and measure the apiserver rather than gpuadm.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import time
from typing import Any

import jsonpatch

from policies import plan, require_fixed_point
from policies.quota.queue import add_gate
from tests.builders import POLICY_YAML, pod
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.events import EventWriter, PodEvents
from webhook.leader.release import Releaser
from webhook.observe.metrics import Metrics
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

QUOTAS = """
namespaces:
  team-long: {mode: queue, a100: 1}
  team-b: {mode: queue, a100: 4}
  team-e: {a100: 100000}
  team-g: {mode: queue, a100: 64}
"""
GATE = "gpuadm.io/quota"
# One apiserver call, as measured through a real apiserver on the development VM (a GET or
# a small write on a warm connection: 2 to 4 ms).
CALL_SECONDS = 0.002
LONG_LINE = 20_000
FRESH_LINE = 2_000
CHURN_SECONDS = 0.1
GANG = 64


def snapshot() -> ConfigSnapshot:
    """Return the config the measurements run under."""
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


class StandIn:
    """The apiserver's pods and Events, each call taking `CALL_SECONDS`."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.ungated_at: dict[str, float] = {}
        self.calls = 0
        # Set when the pod named `awaited` loses its gate.
        self.awaited = ""
        self.released = asyncio.Event()

    async def _call(self) -> None:
        self.calls += 1
        await asyncio.sleep(CALL_SECONDS)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._call()
        found = self.pods.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def patch_pod(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        await self._call()
        try:
            patched: dict[str, Any] = jsonpatch.apply_patch(self.pods[namespace, name], patch)
        except jsonpatch.JsonPatchException as error:
            raise KubeError(422, str(error)) from None
        self.pods[namespace, name] = patched
        self.ungated_at[name] = time.perf_counter()
        if name == self.awaited:
            self.released.set()
        return patched

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._call()
        return self.events.get((namespace, name))

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._call()
        self.events[namespace, body["metadata"]["name"]] = body
        return body

    async def replace_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.create_event(namespace, body)


class Pods:
    """Pods as the apiserver stores them after gpuadm's rewrite, one second apart."""

    def __init__(self, config: ConfigSnapshot) -> None:
        self.config = config
        self.serial = 0

    def make(self, namespace: str, amount: str = "1", *, gated: bool = True) -> dict[str, Any]:
        body = pod({"gpuadm.io/a100": amount})
        body = dict(jsonpatch.apply_patch(body, plan(body, self.config.policy).patch))
        if gated:
            body = dict(jsonpatch.apply_patch(body, [add_gate(body, GATE)]))
        return self._named(body, namespace)

    def copies(self, template: dict[str, Any], count: int) -> list[dict[str, Any]]:
        return [
            self._named(copy.deepcopy(template), template["metadata"]["namespace"])
            for _ in range(count)
        ]

    def _named(self, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        s = self.serial
        self.serial += 1
        body["metadata"].update(
            namespace=namespace,
            uid=f"uid-{s}",
            name=f"p{s:06d}",
            creationTimestamp=f"2026-01-01T{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}Z",
        )
        return body


def request(body: dict[str, Any], *, dry_run: bool = False) -> AdmissionRequest:
    """Return the validating request of a stored pod."""
    metadata = body["metadata"]
    return AdmissionRequest(
        uid=f"review-{metadata['uid']}",
        operation="CREATE",
        namespace=metadata["namespace"],
        name=metadata["name"],
        object=body,
        old_object=None,
        dry_run=dry_run,
        user="alice",
        groups=(),
    )


class Leader:
    """One replica that admits and leads: index, ledger, releaser and Event writer."""

    def __init__(self, config: ConfigSnapshot) -> None:
        self.config = config
        self.usage = UsageIndex()
        self.ledger = QuotaLedger(self.usage, MemoryStore(), pods_visible=True)
        self.api = StandIn()
        stand_in: Any = self.api
        api: AsyncApi = stand_in
        self.writer = EventWriter(
            PodEvents(api, "bench"),
            self.usage,
            lambda ns: self.ledger.line.placer(ns, config.quotas.limits_for(ns)),
        )
        self.releaser = Releaser(
            self.ledger.line,
            self.usage,
            ConfigHolder(config),
            api,
            self.writer,
            leading=lambda: True,
            ready=lambda: True,
            metrics=Metrics(),
        )
        self.usage.on_change(self.releaser.wake)
        self._tasks: list[asyncio.Task[None]] = []

    def observe(self, *bodies: dict[str, Any]) -> None:
        for body in bodies:
            self.api.pods[body["metadata"]["namespace"], body["metadata"]["name"]] = body
            self.usage.observe(body, self.config.policy, self.config.quotas, now=0)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.releaser.run()),
            asyncio.create_task(self.writer.run(lambda: None)),
        ]
        self.releaser.wake_all()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def gated_admission_ms(waiting: int, judgements: int) -> float:
    """Median time to judge a gated pod (a dry run) where `waiting` pods wait in its line."""
    config = snapshot()
    pods = Pods(config)
    leader = Leader(config)
    leader.observe(pods.make("team-long", gated=False))  # holds the whole limit
    leader.observe(*pods.copies(pods.make("team-long"), waiting))
    times = []
    for _ in range(judgements):
        body = pods.make("team-long", "0.5")
        result = require_fixed_point(plan(body, config.policy))
        started = time.perf_counter()
        verdict = await leader.ledger.admit(request(body, dry_run=True), result, config)
        times.append(time.perf_counter() - started)
        assert verdict is not None
        assert verdict.queued
    return statistics.median(times) * 1e3


async def admissions_beside_ms(waiting: int, seconds: float) -> dict[str, float]:
    """p50 and p99 of admissions in team-e while team-long has `waiting` pods churning."""
    config = snapshot()
    pods = Pods(config)
    leader = Leader(config)
    leader.observe(pods.make("team-long", gated=False))
    line = pods.copies(pods.make("team-long"), waiting)
    leader.observe(*line)
    leader.start()

    async def churn() -> None:
        while True:
            await asyncio.sleep(CHURN_SECONDS)
            if line:
                leader.usage.forget(line.pop(0)["metadata"]["uid"], now=0)
            joined = pods.make("team-long")
            line.append(joined)
            leader.observe(joined)

    churning = asyncio.create_task(churn()) if waiting else None
    await asyncio.sleep(1.0)  # the first turns and Events of the new leader
    latencies = []
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        body = pods.make("team-e", "0.001", gated=False)
        result = require_fixed_point(plan(body, config.policy))
        started = time.perf_counter()
        await leader.ledger.admit(request(body, dry_run=True), result, config)
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.002)
    if churning is not None:
        churning.cancel()
    await leader.stop()
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "admissions": len(latencies),
    }


async def release_beside_ms(waiting: int) -> dict[str, float]:
    """Time from a fitting pod of team-b joining its line to its gate removed, just after
    `waiting` pods joined team-long's line (none fits there; none has its Event yet)."""
    config = snapshot()
    pods = Pods(config)
    leader = Leader(config)
    leader.observe(pods.make("team-long", gated=False))
    leader.start()
    await asyncio.sleep(0.05)
    leader.observe(*pods.copies(pods.make("team-long"), waiting))
    await asyncio.sleep(0.05)  # the leader is busy with the new line
    fitting = pods.make("team-b")
    name = fitting["metadata"]["name"]
    leader.api.awaited = name
    started = time.perf_counter()
    leader.observe(fitting)
    async with asyncio.timeout(60):
        await leader.api.released.wait()
    took = leader.api.ungated_at[name] - started
    calls = leader.api.calls
    await leader.stop()
    return {"ms": took * 1e3, "apiserver_calls": calls}


async def release_all_ms(count: int, *, gang: bool) -> float:
    """Time from `count` fitting pods in team-g's line (a gang of them, or pods of no gang)
    to the last of their gates removed, by a leader that starts with them in line."""
    config = snapshot()
    pods = Pods(config)
    leader = Leader(config)
    template = pods.make("team-g")
    if gang:
        template["metadata"]["annotations"].update(
            {"gpuadm.io/gang": "bench", "gpuadm.io/gang-size": str(count)}
        )
    line = pods.copies(template, count)
    leader.observe(*line)
    names = {body["metadata"]["name"] for body in line}
    # The last in line is ungated last: a turn removes gates in line order.
    leader.api.awaited = line[-1]["metadata"]["name"]
    started = time.perf_counter()
    leader.start()
    async with asyncio.timeout(60):
        await leader.api.released.wait()
    assert names <= leader.api.ungated_at.keys()
    took = max(leader.api.ungated_at[name] for name in names) - started
    await leader.stop()
    return took * 1e3


def queue_figures(rounds: int, seconds: float) -> dict[str, Any]:
    """Measure each figure and its anchor in turn, `rounds` times; keep the medians."""

    async def measure() -> dict[str, Any]:
        found: dict[str, list[Any]] = {
            k: []
            for k in (
                "gated-0",
                "gated-long",
                "beside-0",
                "beside-long",
                "release-0",
                "release-fresh",
                "release-pods",
                "release-gang",
            )
        }
        for _ in range(rounds):
            found["gated-0"].append(await gated_admission_ms(0, 50))
            found["gated-long"].append(await gated_admission_ms(LONG_LINE, 50))
            found["beside-0"].append(await admissions_beside_ms(0, seconds))
            found["beside-long"].append(await admissions_beside_ms(LONG_LINE, seconds))
            found["release-0"].append(await release_beside_ms(0))
            found["release-fresh"].append(await release_beside_ms(FRESH_LINE))
            found["release-pods"].append(await release_all_ms(GANG, gang=False))
            found["release-gang"].append(await release_all_ms(GANG, gang=True))
        return found

    found = asyncio.run(measure())

    def median_of(key: str, field: str | None = None) -> float:
        values = found[key] if field is None else [each[field] for each in found[key]]
        return float(statistics.median(values))

    return {
        "call_seconds": CALL_SECONDS,
        "long_line": LONG_LINE,
        "fresh_line": FRESH_LINE,
        "gated_admission_ms": {"0": median_of("gated-0"), "long": median_of("gated-long")},
        "beside_p50_ms": {
            "0": median_of("beside-0", "p50_ms"),
            "long": median_of("beside-long", "p50_ms"),
        },
        "beside_p99_ms": {
            "0": median_of("beside-0", "p99_ms"),
            "long": median_of("beside-long", "p99_ms"),
        },
        "release_ms": {
            "0": median_of("release-0", "ms"),
            "fresh": median_of("release-fresh", "ms"),
        },
        "gang_size": GANG,
        "release_all_ms": {"pods": median_of("release-pods"), "gang": median_of("release-gang")},
        "raw": found,
    }
