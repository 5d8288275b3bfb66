"""The ConfigMap source: a text left unread for lack of time is offered again by the source
itself, since in a cluster no poll and perhaps no event ever comes to offer it.

The apiserver here is a stand-in that serves one list and watches that end at once, as a
watch renewed with nothing to say does; the e2e suite runs the source against a real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from tests.builders import POLICY_YAML, QUOTAS_YAML
from webhook.config.configmap_source import ConfigMapSource
from webhook.config.snapshot import QUOTAS_PART, RETRY_OVERRUN_SECONDS, ConfigHolder, PartText

EDITED = QUOTAS_YAML.replace("a100: 4", "a100: 6")


class QuietApiserver:
    """Two ConfigMaps, listed once; every watch of them ends with nothing to say."""

    def __init__(self) -> None:
        self.watches = 0
        self.renewed_twice = asyncio.Event()
        self.events: list[dict[str, Any]] = []

    async def list_configmaps(self, namespace: str, label_selector: str) -> SimpleNamespace:
        maps = [
            ("gpuadm-policy", "policy.yaml", POLICY_YAML),
            ("gpuadm-quotas", "quotas.yaml", EDITED),
        ]
        items = [
            {"metadata": {"name": name, "resourceVersion": "1"}, "data": {key: text}}
            for name, key, text in maps
        ]
        return SimpleNamespace(items=items, resource_version="1")

    async def watch_configmaps(self, namespace: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.watches >= 3:
            self.renewed_twice.set()
        await asyncio.sleep(0.01)
        return
        yield {}

    async def record_event(self, **event: Any) -> None:
        self.events.append(event)


async def test_a_text_left_unread_is_offered_again_without_an_edit_or_an_event() -> None:
    now = [0.0]
    holder = ConfigHolder(read_seconds=0, clock=lambda: now[0])
    holder.update(PartText(POLICY_YAML, "p"), PartText(QUOTAS_YAML, "q"))
    apiserver = QuietApiserver()
    source = ConfigMapSource(apiserver, "gpuadm-system", holder)  # type: ignore[arg-type]
    task = asyncio.create_task(source.run())
    try:
        # Listed, read too slowly, and renewed twice since: still waiting, and not read again.
        await asyncio.wait_for(apiserver.renewed_twice.wait(), 10)
        assert "not read within 0 s" in holder.problems()[QUOTAS_PART]
        assert holder.current.quotas.limits_for("team-a")["a100"] == 4
        now[0] += RETRY_OVERRUN_SECONDS
        holder.read_seconds = 30  # a calmer moment
        for _ in range(500):
            if holder.current.quotas.limits_for("team-a")["a100"] == 6:
                break
            await asyncio.sleep(0.01)
        assert holder.current.quotas.limits_for("team-a")["a100"] == 6
        assert QUOTAS_PART not in holder.problems()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
