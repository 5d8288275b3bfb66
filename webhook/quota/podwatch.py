"""Keep the usage index true to the cluster: a full re-list, then a watch of GPU pods.

The watch selects pods by gpuadm's class label, so its cost grows with GPU pods, not with
every pod in the cluster. Pods created before gpuadm was installed carry no label; the full
re-list (at start, after a policy change, and every `resync_seconds`) finds them too, page
by page, keeping only one small entry per GPU pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import aclosing
from fractions import Fraction
from typing import Any, Protocol

from policies import Policy, QuotaConfig
from policies.quota.queue import Waiting
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi, WatchEvent
from webhook.observe.metrics import Metrics
from webhook.quota.holdings import Holding, pod_state
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.pods")

# A replica whose view of pods is older than this stops admitting pods under quota: its
# count could be missing pods the other replicas admitted. Below the reservation lifetime.
STALE_AFTER = 60.0


class PodFollower(Protocol):
    """What else follows every pod the watch lists and sees change (the GPU-hours' runs)."""

    def begin_list(self) -> None:
        """A full list begins."""

    def observe(
        self,
        pod: Mapping[str, Any],
        policy: Policy,
        quotas: QuotaConfig,
        *,
        charged: tuple[str, Fraction] | None = None,
    ) -> None:
        """A pod as it now is; `charged` is what the usage index charges it, if anything."""

    def end_list(self, *, now: float) -> None:
        """The full list is complete."""

    def deleted(self, uid: str, *, now: float) -> None:
        """A pod was deleted."""


class _Expired(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class PodWatcher:
    """Fills a `UsageIndex` from the apiserver and keeps it current."""

    def __init__(
        self,
        api: AsyncApi,
        usage: UsageIndex,
        config: ConfigHolder,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        resync_seconds: float = 600.0,
        watch_seconds: int = 30,
        followers: tuple[PodFollower, ...] = (),
    ) -> None:
        self.api = api
        self.usage = usage
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.followers = followers
        self.synced = False
        self.last_contact = 0.0
        self._relist = asyncio.Event()

    def ready(self) -> bool:
        """Tell whether the index reflects the cluster as of less than `STALE_AFTER` ago."""
        return self.synced and self.clock() - self.last_contact < STALE_AFTER

    def not_ready_reason(self) -> str | None:
        """Say why the index cannot be trusted, or None."""
        if self.ready():
            return None
        return "pod usage not in sync with the apiserver" if self.synced else "pods not listed yet"

    def request_relist(self) -> None:
        """Re-list after the current watch, e.g. because the policy changed charges."""
        self._relist.set()

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """List and watch until cancelled or an apiserver error (raised, for the supervisor
        to retry). `progress` is called after each list and each watch call that ended."""
        while True:
            await self._list_and_watch(progress)

    async def _list_and_watch(self, progress: Callable[[], None]) -> None:
        """List every pod, then watch GPU pods until the next full re-list is due."""
        try:
            version = await self._list_all()
            progress()
            resync_at = self.clock() + self.resync_seconds
            while self.clock() < resync_at and not self._relist.is_set():
                version = await self._watch(version)
                progress()
        except _Expired:
            log.info("pod watch expired; listing again")

    async def _list_all(self) -> str:
        while not self.config.loaded:  # noqa: ASYNC110 - the holder is plain, not async
            await asyncio.sleep(0.5)
        snapshot = self.config.current
        self._relist.clear()
        holdings, waiting, version = await self._fetch_holdings(snapshot)
        now = self.clock()
        self.usage.replace_all(
            holdings, now=now, waiting=waiting, version=resource_version(version) or 0
        )
        self.usage.forget_seen_before(now - 2 * self.resync_seconds)
        self.synced = True
        self.last_contact = now
        self.metrics.tracked_pods.set(len(self.usage))
        log.info("listed pods: %d hold GPUs, %d wait in line", len(holdings), len(waiting))
        return version

    async def _fetch_holdings(
        self, snapshot: ConfigSnapshot
    ) -> tuple[dict[str, Holding], dict[str, Waiting], str]:
        """List every pod page by page, keeping only what GPU pods hold and the GPU pods in
        line."""
        holdings: dict[str, Holding] = {}
        waiting: dict[str, Waiting] = {}
        version = ""
        policy, quotas = snapshot.policy, snapshot.quotas
        for follower in self.followers:
            follower.begin_list()
        async for page in self.api.list_pods():
            version = version or page.resource_version
            for pod in page.items:
                state = pod_state(pod, policy, quotas)
                if isinstance(state, Holding):
                    holdings[pod["metadata"]["uid"]] = state
                elif isinstance(state, Waiting):
                    waiting[pod["metadata"]["uid"]] = state
                self._tell_followers(pod, state, policy, quotas)
        for follower in self.followers:
            follower.end_list(now=self.clock())
        return holdings, waiting, version

    async def _watch(self, version: str) -> str:
        label = self.config.current.policy.class_annotation
        self.usage.watching(label)
        latest = version
        watch = self.api.watch_pods(
            label_selector=label, resource_version=version, timeout_seconds=self.watch_seconds
        )
        async with aclosing(watch) as events:
            async for event in events:
                latest = self._apply(event) or latest
        self.last_contact = self.clock()
        return latest

    def _tell_followers(
        self,
        pod: Mapping[str, Any],
        state: Holding | Waiting | None,
        policy: Policy,
        quotas: QuotaConfig,
    ) -> None:
        """Tell the followers of a pod as it now is, with what it holds, worked out once for
        the index and them. A pod in line has not started: it is nothing to them."""
        if self.followers and not isinstance(state, Waiting):
            charged = (state.class_name, state.charge) if isinstance(state, Holding) else None
            for follower in self.followers:
                follower.observe(pod, policy, quotas, charged=charged)

    def _apply(self, event: WatchEvent) -> str | None:
        kind = event.get("type")
        obj: dict[str, Any] = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
        self.last_contact = self.clock()
        metadata = obj.get("metadata") or {}
        version = metadata.get("resourceVersion")
        number = resource_version(version)
        now = self.clock()
        if kind == "DELETED":
            self.usage.forget(str(metadata.get("uid")), now=now, version=number)
            for follower in self.followers:
                follower.deleted(str(metadata.get("uid")), now=now)
        elif kind in ("ADDED", "MODIFIED"):
            snapshot = self.config.current
            state = self.usage.observe(
                obj, snapshot.policy, snapshot.quotas, now=now, version=number
            )
            self._tell_followers(obj, state, snapshot.policy, snapshot.quotas)
        if number is not None:  # a bookmark too: every event up to it was sent
            self.usage.advance(number)
        self.metrics.tracked_pods.set(len(self.usage))
        return str(version) if version else None


def resource_version(version: object) -> int | None:
    """Return a pod resourceVersion as the integer it compares as (KEP-5504), or None if it
    is not one: a view that cannot tell how far it reached then drops nothing and waits for
    nothing it cannot reach."""
    if not isinstance(version, str) or not version.isdigit() or version.startswith("0"):
        return None
    return int(version)
