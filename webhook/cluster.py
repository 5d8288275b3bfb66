"""Wire gpuadm to a cluster: config from ConfigMaps, usage from the pod watch, shared records."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from webhook.config import ConfigHolder
from webhook.configmaps import ConfigMapSource
from webhook.keys import READINESS
from webhook.kube import Kube
from webhook.ledger import QuotaLedger
from webhook.metrics import Metrics
from webhook.podwatch import PodWatcher
from webhook.records import ConfigMapStore
from webhook.usage import UsageIndex

log = logging.getLogger("gpuadm.cluster")
PRUNE_SECONDS = 30.0


class ClusterState:
    """The live sources of a replica in a cluster, and the ledger they feed."""

    def __init__(self, kube: Kube, namespace: str, holder: ConfigHolder, metrics: Metrics) -> None:
        self.usage = UsageIndex()
        self.pods = PodWatcher(kube, self.usage, holder, metrics)
        self.config = ConfigMapSource(
            kube, namespace, holder, metrics, on_policy_change=self.pods.request_relist
        )
        self.ledger = QuotaLedger(
            self.usage,
            ConfigMapStore(kube, namespace),
            pods_visible=True,
            usage_ready=self.pods.ready,
            metrics=metrics,
        )

    def attach(self, app: web.Application) -> None:
        """Run the sources for the life of the app, and make readiness wait for them."""
        app[READINESS] += [self.config.not_ready_reason, self.pods.not_ready_reason]
        app.cleanup_ctx.append(self._run)

    async def _run(self, app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(self.config.run(), name="configmaps"),
            asyncio.create_task(self.pods.run(), name="pods"),
            asyncio.create_task(self._prune_forever(), name="prune"),
        ]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _prune_forever(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_SECONDS)
            for namespace in self.ledger.namespaces():
                try:
                    await self.ledger.prune(namespace)
                except Exception:
                    log.exception("pruning the quota record of %s failed", namespace)
