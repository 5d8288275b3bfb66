"""Release waiting pods: the leader's turns over each namespace's line (queue mode).

A namespace is due for a turn when the pod watch shows its holdings or line change (a pod
ended or was deleted, a pod joined the line), when the quotas change, when this replica
becomes the leader, and every `period` seconds (reservations expire without any event).
Due namespaces take turns, those woken first, in the order they were woken, then the rest;
a namespace woken again while due keeps its place. Each turn:

1. charges the pods that fit, in line order, through the namespace's record (`QueueLine.
   release`): a compare-and-swap write, like an admission's; at most `per_turn` pods, found
   through the line's index without visiting the line; a gang goes whole, in that one
   write, once it is whole and fits (its size read first, `webhook.quota.gang_sizes`), even
   past `per_turn` when it is the turn's first release; a class whose GPU-hour budget is
   spent keeps waiting (`held`), and its budget frees with time alone, so the periodic pass
   is what releases it;
2. removes each charged pod's gate, with a JSON patch that tests the pod's uid and the gate,
   so a pod deleted and made again under the same name is never released by mistake;
3. wakes the Event writer (`events.EventWriter`), which tells the pods still waiting what they
   wait for, and the released ones that they were released, in a task of its own.

A namespace with more to release than one turn allows goes to the back of the turns: so a
long line never delays another namespace's release by more than one bounded turn per
namespace with work, and no Event write ever sits on the release path.

If the replica dies between 1 and 2, the pod is in the record and still gated: the next
leader's turn finds it so and only removes the gate (and keeps its reservation fresh until
then). A charged pod deleted before its gate was removed gives its reservation back: at once
if the leader finds it gone, else when the watch shows the deletion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from policies.quota.queue import Waiting, remove_gate
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.events import EventWriter
from webhook.observe.metrics import Metrics
from webhook.quota.gang_sizes import GangSizes
from webhook.quota.line import QueueLine
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.release")

# A pass over every line this often, for reservations that expire and so free room.
PERIOD_SECONDS = 5.0
# A pod whose gate this replica removed is left out of the passes for this long, or until
# the watch shows it released: its reservation already charges it.
RELEASED_SKIP_SECONDS = 30.0
# The most pods one turn ungates in one namespace before the next namespace's turn.
PER_TURN = 20


class Releaser:
    """Releases the pods of every queue line, while this replica leads."""

    def __init__(
        self,
        line: QueueLine,
        usage: UsageIndex,
        config: ConfigHolder,
        api: AsyncApi,
        events: EventWriter,
        *,
        leading: Callable[[], bool],
        ready: Callable[[], bool],
        metrics: Metrics,
        period: float = PERIOD_SECONDS,
        per_turn: int = PER_TURN,
        clock: Callable[[], float] = time.monotonic,
        held: Callable[[str], Mapping[str, str]] = lambda _namespace: {},
        gang_sizes: GangSizes | None = None,
    ) -> None:
        self.line = line
        self.usage = usage
        self.config = config
        self.api = api
        self.events = events
        self.leading = leading
        self.ready = ready
        self.metrics = metrics
        self.period = period
        self.per_turn = per_turn
        self.clock = clock
        # Which classes of a namespace's line keep waiting for their GPU-hour budget.
        self.held = held
        # The sizes of the lines' gangs, read before each turn (by default, only what the
        # pods themselves carry).
        self.gang_sizes = gang_sizes or GangSizes(
            None, usage, strict=lambda ns: config.current.quotas.terms(ns).queueing == "strict"
        )
        # Namespaces due for a turn, in turn order (a dict as an ordered set).
        self._due: dict[str, None] = {}
        self._everything = True
        self._wake = asyncio.Event()
        self._released: dict[str, float] = {}  # uid -> when its gate was removed
        self.turns = 0  # turns taken, for tests and the benchmark

    def wake(self, namespace: str) -> None:
        """Give a namespace's line a turn soon (what it holds or waits for changed); in a
        cohort, every member's, since what one holds changes the room the others may use."""
        cohort = self.config.current.quotas.cohort_of(namespace) if self.config.loaded else None
        for member in cohort.members if cohort is not None else (namespace,):
            self._due.setdefault(member)
        self._wake.set()

    def wake_all(self) -> None:
        """Give every line a turn soon (the quotas changed, or this replica leads)."""
        self._everything = True
        self._wake.set()

    def due(self) -> list[str]:
        """Return the namespaces due for a turn, in turn order."""
        return list(self._due)

    async def run(self) -> None:
        """Take turns over the lines until cancelled."""
        self._everything = True  # a start, or a restart after a failure: look at every line
        last_pass = self.clock()
        while True:
            if not self._due:  # with turns still due, no waiting: only a yield, below
                try:
                    # Not wait_for, which on Python 3.11 can swallow the cancel that ends
                    # this replica's leadership if it comes as the event is set.
                    async with asyncio.timeout(self.period):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            # The periodic pass over every line, however often other namespaces wake it: a
            # line waiting only on time (a reservation that expires, a GPU-hour budget
            # that frees) has no event to wake it.
            if self.clock() - last_pass >= self.period:
                self._everything = True
            if self._everything:
                last_pass = self.clock()
            if not (self.leading() and self.ready() and self.config.loaded):
                self._due.clear()
                self._everything = True  # whatever changed meanwhile is seen on the next pass
                continue
            # A pass that fails raises to the supervisor, which logs it once, counts it and
            # starts this loop again after a backoff, with a pass over every line.
            await self.pass_once()
            await asyncio.sleep(0)  # let admissions in between rounds of turns

    async def pass_once(self) -> None:
        """Give each namespace due now one turn (every line on the period or when asked);
        a namespace with more to release is due again, behind the others."""
        now = self.clock()
        self._released = {
            uid: at
            for uid, at in self._released.items()
            if now - at < RELEASED_SKIP_SECONDS and self.usage.is_waiting(uid)
        }
        if self._everything:
            self._everything = False
            for namespace in self.usage.waiting_namespaces():
                self._due.setdefault(namespace)
            self.events.wake_all()
        for namespace in list(self._due):
            self._due.pop(namespace, None)
            if self.usage.has_line(namespace):
                await self._turn(namespace)

    async def _turn(self, namespace: str) -> None:
        self.turns += 1
        snapshot = self.config.current
        try:
            gangs = await self.gang_sizes.read(namespace)
            to_release, turn = await self.line.release(
                namespace,
                snapshot.quotas,
                skip=frozenset(self._released),
                most=self.per_turn,
                held=self.held(namespace),
                gangs=gangs,
            )
        except KubeError as error:
            log.warning("cannot charge the waiting pods of namespace %s: %s", namespace, error)
            self.wake(namespace)
            return
        gate = snapshot.policy.quota_gate
        for pod in to_release:
            await self._ungate(pod, gate)
        if turn.more:
            self.wake(namespace)
        self.events.wake(namespace)

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
                self.events.released(pod)
            self._released[pod.uid] = self.clock()
        except KubeError as error:
            if error.status == 404:
                await self._gone(pod)
                return
            # Still charged and gated: the next turn removes the gate.
            log.warning("cannot release pod %s/%s: %s", pod.namespace, pod.name, error)
            self.wake(pod.namespace)

    async def _gone(self, pod: Waiting) -> None:
        log.info("pod %s/%s left the line before its release", pod.namespace, pod.name)
        await self.line.unreserve(
            pod.namespace, pod.uid, self.config.current.quotas.record_key(pod.namespace)
        )
