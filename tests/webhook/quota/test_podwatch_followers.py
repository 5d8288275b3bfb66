"""What the pod watch tells those who follow the pods with it (the GPU-hours' runs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from fractions import Fraction
from typing import Any

import jsonpatch

from policies import plan
from policies.policy import Policy
from policies.quota.quotas import QuotaConfig
from tests.builders import POLICY_YAML, pod
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.kube.objects import Page
from webhook.observe.metrics import Metrics
from webhook.quota.podwatch import PodWatcher
from webhook.quota.usage import UsageIndex

QUOTAS = "namespaces:\n  team-a: {a100: 4}\n"


def config() -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


def running_pod(uid: str, limits: dict[str, str]) -> dict[str, Any]:
    """A GPU pod as stored (gpuadm's rewrite applied), running."""
    body = pod(limits)
    body = dict(jsonpatch.apply_patch(body, plan(body, config().policy).patch))
    body["metadata"].update(namespace="team-a", name=f"pod-{uid}", uid=uid, resourceVersion="7")
    body["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "main", "state": {"running": {"startedAt": "2026-11-27T01:00:00Z"}}}
        ],
    }
    return body


class Events:
    """The apiserver's side of one list (empty) and one watch that sends `events`."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.sent = asyncio.Event()

    def list_pods(self) -> AsyncGenerator[Page]:
        async def pages() -> AsyncGenerator[Page]:
            yield Page([], "5", None)

        return pages()

    def watch_pods(
        self, *, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncGenerator[dict[str, Any]]:
        async def stream() -> AsyncGenerator[dict[str, Any]]:
            for event in self.events:
                yield event
            self.sent.set()
            await asyncio.Event().wait()  # an open watch with nothing more to say
            yield {}

        return stream()


class Recorder:
    """A follower that writes down what it is told."""

    def __init__(self) -> None:
        self.observed: list[tuple[str, tuple[str, Fraction] | None]] = []

    def begin_list(self) -> None:
        pass

    def observe(
        self,
        pod: Mapping[str, Any],
        policy: Policy,
        quotas: QuotaConfig,
        *,
        charged: tuple[str, Fraction] | None = None,
    ) -> None:
        self.observed.append((pod["metadata"]["uid"], charged))

    def end_list(self, *, now: float) -> None:
        pass

    def deleted(self, uid: str, *, now: float) -> None:
        pass


async def test_a_watched_pod_is_charged_once_and_its_followers_told_the_charge() -> None:
    """Each status change of a running GPU pod reaches the index and the GPU-hours' runs:
    what it holds is worked out once, by the index, and handed on."""
    events = Events(
        [
            {"type": "ADDED", "object": running_pod("u1", {"gpuadm.io/a100": "0.5"})},
            {"type": "MODIFIED", "object": running_pod("u1", {"gpuadm.io/a100": "0.5"})},
        ]
    )
    usage, recorder = UsageIndex(), Recorder()
    watcher = PodWatcher(
        events,  # type: ignore[arg-type]
        usage,
        ConfigHolder(config()),
        Metrics(),
        followers=(recorder,),
    )
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(events.sent.wait(), 5)
        await asyncio.sleep(0)
    finally:
        task.cancel()
    assert usage.in_use("team-a") == {"a100": Fraction(1, 2)}
    assert recorder.observed == [("u1", ("a100", Fraction(1, 2)))] * 2
