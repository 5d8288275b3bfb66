"""Which replica leads: a coordination.k8s.io Lease, held by renewing it.

The leader releases waiting pods and publishes the GPUQuota objects; every replica admits.
Exactness never rests on the Lease (the usage records do that): two replicas that both think
they lead for a moment release nothing twice, they only do the same work twice.

As in client-go's leader election, a replica does not compare its clock with the time
written in the Lease: it takes a Lease over once the Lease has not changed for its duration,
as measured on its own clock. The leader stops acting as one when it has not renewed for
`renew_deadline`, shorter than the duration, so it has stopped before anyone takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.lease")

LEASE_NAME = "gpuadm-leader"
LEASE_SECONDS = 15.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Takes and renews the Lease; tells whether this replica leads now."""

    def __init__(
        self,
        api: AsyncApi,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        duration: float = LEASE_SECONDS,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Hold the Lease `namespace/name` as `identity`, for `duration` seconds at a time."""
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.duration = duration
        self.renew_deadline = duration * 2 / 3
        self.retry_seconds = duration / 5
        self.metrics = metrics
        self.clock = clock
        self._renewed_at: float | None = None
        self._observed: tuple[Any, Any] | None = None
        self._observed_at = 0.0
        self._listeners: list[Callable[[], None]] = []
        self._losers: list[Callable[[], None]] = []

    def on_lead(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time this replica becomes the leader."""
        self._listeners.append(listener)

    def on_lose(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time this replica stops being the leader."""
        self._losers.append(listener)

    def leading(self) -> bool:
        """Tell whether this replica holds the Lease now (renewed within the deadline)."""
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline
        )

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """Try to take or renew the Lease until cancelled; give it up when cancelled.

        `progress` is called after each attempt that reached the apiserver.
        """
        was_leading = False
        try:
            while True:
                try:
                    await self.try_once()
                    progress()
                except KubeError as error:
                    log.warning("cannot read or write the Lease %s: %s", self.name, error)
                except Exception:  # e.g. a Lease edited by hand into nonsense: keep trying
                    log.exception("cannot take or renew the Lease %s", self.name)
                was_leading = self._tell(was_leading)
                await asyncio.sleep(self.retry_seconds)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._give_up())
            self._tell(was_leading)

    def _tell(self, was_leading: bool) -> bool:
        """Export whether this replica leads, and tell the listeners of a change."""
        leading = self.leading()
        self._export()
        if leading and not was_leading:
            log.info("leading: this replica releases waiting pods now")
            for listener in self._listeners:
                listener()
        elif was_leading and not leading:
            log.warning("no longer leading")
            for listener in self._losers:
                listener()
        return leading

    async def try_once(self) -> None:
        """Take the Lease if it is free or expired, renew it if it is ours."""
        started = self.clock()
        lease = await self.api.get_lease(self.namespace, self.name)
        if lease is None:
            body = self._lease_body(None, transitions=0, acquired=_now_micro())
            try:
                await self.api.create_lease(self.namespace, body)
            except KubeError as error:
                if error.status == 409:
                    return
                raise
            self._renewed_at = started
            return
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        observed = (holder, spec.get("renewTime"))
        if observed != self._observed:
            self._observed = observed
            self._observed_at = started
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        if holder and holder != self.identity and started - self._observed_at < duration:
            self._renewed_at = None
            return  # another replica leads and has renewed within its duration
        ours = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        acquired = spec.get("acquireTime") if ours else _now_micro()
        body = self._lease_body(lease, transitions=transitions, acquired=acquired)
        try:
            await self.api.replace_lease(self.namespace, body)
        except KubeError as error:
            if error.status == 409:
                self._renewed_at = None
                return  # someone else wrote it first
            raise
        self._renewed_at = started

    async def _give_up(self) -> None:
        """Hand the Lease back on a clean stop, so another replica leads at once."""
        if not self.leading():
            return
        self._renewed_at = None
        lease = await self.api.get_lease(self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease["spec"] = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
        await self.api.replace_lease(self.namespace, lease)
        log.info("gave up the Lease %s", self.name)

    def _lease_body(
        self, lease: dict[str, Any] | None, *, transitions: int, acquired: Any
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            metadata = {**lease["metadata"]}
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": acquired,
                "renewTime": _now_micro(),
                "leaseTransitions": transitions,
            },
        }

    def _export(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_leader.set(1 if self.leading() else 0)
