"""Release waiting pods: the leader's pass over each namespace's line (queue mode).

A pass runs when the pod watch shows a namespace's holdings or line change (a pod ended or
was deleted, a pod joined the line), when the quotas change, when this replica becomes the
leader, and every `period` seconds (reservations expire without any event). Each pass:

1. charges the pods that fit, in line order, through the ledger's record (`QuotaLedger.
   release`): a compare-and-swap write, like an admission's;
2. removes each charged pod's gate, with a JSON patch that tests the pod's uid and the gate,
   so a pod deleted and made again under the same name is never released by mistake;
3. tells each pod still waiting what it waits for and how many pods are ahead (an Event).

If the replica dies between 1 and 2, the pod is in the record and still gated: the next
leader's pass finds it so and only removes the gate (and keeps its reservation fresh until
then). A charged pod deleted before its gate was removed gives its reservation back: at once
if the leader finds it gone, else when the watch shows the deletion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from policies.queue import Waiting, gate_name, remove_gate
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.events import PodEvents
from webhook.observe.metrics import Metrics
from webhook.quota.ledger import QuotaLedger
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.release")

# A pass over every line this often, for reservations that expire and so free room.
PERIOD_SECONDS = 5.0
# A pod whose gate this replica removed is left out of the passes for this long, or until
# the watch shows it released: its reservation already charges it.
RELEASED_SKIP_SECONDS = 30.0


class Releaser:
    """Releases the pods of every queue line, while this replica leads."""

    def __init__(
        self,
        ledger: QuotaLedger,
        usage: UsageIndex,
        config: ConfigHolder,
        api: AsyncApi,
        events: PodEvents,
        *,
        leading: Callable[[], bool],
        ready: Callable[[], bool],
        metrics: Metrics,
        period: float = PERIOD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.usage = usage
        self.config = config
        self.api = api
        self.events = events
        self.leading = leading
        self.ready = ready
        self.metrics = metrics
        self.period = period
        self.clock = clock
        self._due: set[str] = set()
        self._everything = True
        self._wake = asyncio.Event()
        self._released: dict[str, float] = {}  # uid -> when its gate was removed

    def wake(self, namespace: str) -> None:
        """Make a pass over a namespace's line soon (what it holds or waits for changed)."""
        self._due.add(namespace)
        self._wake.set()

    def wake_all(self) -> None:
        """Make a pass over every line soon (the quotas changed, or this replica leads)."""
        self._everything = True
        self._wake.set()

    async def run(self) -> None:
        """Pass over the lines until cancelled."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.period)
            except TimeoutError:
                self._everything = True  # the periodic pass over every line
            self._wake.clear()
            if not (self.leading() and self.ready() and self.config.loaded):
                self._everything = True  # whatever changed meanwhile is seen on the next pass
                continue
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not end releasing for good
                log.exception("releasing waiting pods failed; retrying")
                self._everything = True

    async def pass_once(self) -> None:
        """Pass over the lines that are due (all of them on the period or when asked)."""
        now = self.clock()
        in_line = self._in_line()
        self._released = {
            uid: at
            for uid, at in self._released.items()
            if now - at < RELEASED_SKIP_SECONDS and uid in in_line
        }
        lines = set(self.usage.waiting_namespaces())
        due = lines if self._everything else self._due & lines
        self._due.clear()
        self._everything = False
        for namespace in sorted(due):
            await self._pass(namespace)
        self.events.forget_all_but(in_line)

    def _in_line(self) -> set[str]:
        return {w.uid for ns in self.usage.waiting_namespaces() for w in self.usage.waiting(ns)}

    async def _pass(self, namespace: str) -> None:
        snapshot = self.config.current
        try:
            to_release, outcome = await self.ledger.release(
                namespace, snapshot.quotas, skip=frozenset(self._released)
            )
        except KubeError as error:
            log.warning("cannot charge the waiting pods of namespace %s: %s", namespace, error)
            self._due.add(namespace)
            return
        gate = gate_name(snapshot.policy)
        for pod in to_release:
            await self._ungate(pod, gate)
        await self.events.waiting(outcome.waiting)

    async def _ungate(self, pod: Waiting, gate: str) -> None:
        """Remove the gate of a charged pod; give its room back if the pod is gone."""
        try:
            found = await self.api.get_pod(pod.namespace, pod.name)
            if found is None or (found.get("metadata") or {}).get("uid") != pod.uid:
                await self._gone(pod)
                return
            patch = remove_gate(found, gate)
            if patch and (found.get("metadata") or {}).get("deletionTimestamp"):
                await self._gone(pod)  # deleted while it waited: it never ran
                return
            if patch:  # none: another leader removed it already
                await self.api.patch_pod(
                    pod.namespace,
                    pod.name,
                    [{"op": "test", "path": "/metadata/uid", "value": pod.uid}, *patch],
                )
                self.metrics.queue_releases.inc()
                log.info(
                    "released pod %s/%s (%s of %s)",
                    pod.namespace,
                    pod.name,
                    pod.charge,
                    pod.class_name,
                )
                await self.events.released(pod)
            self._released[pod.uid] = self.clock()
        except KubeError as error:
            if error.status == 404:
                await self._gone(pod)
                return
            # Still charged and gated: the next pass removes the gate.
            log.warning("cannot release pod %s/%s: %s", pod.namespace, pod.name, error)
            self._due.add(pod.namespace)

    async def _gone(self, pod: Waiting) -> None:
        log.info("pod %s/%s left the line before its release", pod.namespace, pod.name)
        await self.ledger.unreserve(pod.namespace, pod.uid)
