"""The Events a waiting pod carries: what it waits for, how many pods are ahead of it, and
when it was released. `kubectl describe pod` shows them; `kubectl get events` lists them.

Each pod has one waiting Event, updated in place (its count grows) when what it says
changes, at most every `min_interval` seconds per pod, and every half hour so that it does
not expire while the pod waits. A long line costs one object per pod, not one per pass.

The Events are written off the release path, by `EventWriter`: a task of its own (leader
only, supervised like every loop) that releasing only wakes. Its work is bounded: what is
pending is a cursor per namespace whose line changed (not a list of pods), and the pods
released, at most `queue_max`; each pod's place is found when its Event is about to be
written, so updates coalesce; namespaces take turns, `batch` pods each; a namespace's line is
swept at most every `sweep_every` seconds; and writes go at most `rate` a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from policies.quantity import format_amount
from policies.quota.line import Key, key_of
from policies.quota.queue import Place, Waiting
from webhook.kube.errors import KubeError
from webhook.kube.objects import EVENT_MESSAGE_MAX
from webhook.kube.rest import AsyncApi
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.events")

WAITING = "GPUQuotaWaiting"
RELEASED = "GPUQuotaReleased"
# A Warning on each pod of a gang still not whole (or not sized) this long after the pod's
# creation: the gang may never become whole, and its pods say what it misses.
GANG_INCOMPLETE = "GPUQuotaGangIncomplete"
GANG_TIMEOUT_SECONDS = 120.0
MIN_INTERVAL_SECONDS = 5.0
# Events expire an hour after their last write by default (the apiserver's --event-ttl).
REFRESH_SECONDS = 1800.0
# The writer's bounds: Event writes a second, pods placed per namespace per turn, released
# pods waiting to be told, and how often what was said to pods gone from line is forgotten.
WRITES_PER_SECOND = 20.0
BATCH = 50
QUEUE_MAX = 1000
FORGET_SECONDS = 60.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(pod: Waiting, reason: str) -> str:
    """Name a pod's Event of one reason (a uid part tells pods of one name apart)."""
    kind = {WAITING: "waiting", GANG_INCOMPLETE: "gang"}.get(reason, "released")
    return f"{pod.name[:200]}.gpuadm-{kind}-{pod.uid[:8]}"


class PodEvents:
    """Writes the waiting and released Events of pods in line."""

    def __init__(
        self,
        api: AsyncApi,
        instance: str,
        *,
        min_interval: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        gang_timeout: float = GANG_TIMEOUT_SECONDS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Write through `api`, naming this replica as `instance`; warn of a gang still not
        whole `gang_timeout` seconds after a pod of it was created (by `wall_clock`)."""
        self.api = api
        self.instance = instance
        self.min_interval = min_interval
        self.clock = clock
        self.gang_timeout = gang_timeout
        self.wall_clock = wall_clock
        self._warned: set[str] = set()  # pods warned that their gang is not whole
        # uid -> (reason text without the position, the full message, when written)
        self._said: dict[str, tuple[str, str, float]] = {}

    async def waiting(self, places: Iterable[Place]) -> None:
        """Tell each waiting pod what it waits for, if that changed."""
        for place in places:
            await self.waiting_one(place)

    def due(self, place: Place) -> bool:
        """Tell whether the pod's Event is to be written: what it says changed (at most every
        `min_interval`), or it is about to expire."""
        return self._waiting_due(place) or self._warning_due(place)

    def _waiting_due(self, place: Place) -> bool:
        said = self._said.get(place.pod.uid)
        if said is None:
            return True
        age = self.clock() - said[2]
        return age >= self.min_interval and (said[1] != place.message() or age >= REFRESH_SECONDS)

    def _warning_due(self, place: Place) -> bool:
        return place.pod.uid not in self._warned and self._incomplete_too_long(place)

    async def waiting_one(self, place: Place) -> bool:
        """Tell a waiting pod what it waits for, if that is due; return whether it wrote."""
        # At most one write per pod every `min_interval` (the reason holds live numbers),
        # and an unchanged Event is written again before the apiserver lets it expire.
        if not self.due(place):
            return False
        message = place.message()
        if self._waiting_due(place) and await self._write(place.pod, WAITING, message):
            self._said[place.pod.uid] = (place.reason, message, self.clock())
        if self._warning_due(place):
            warning = f"gang still not whole after {self.gang_timeout:.0f} s: {place.reason}"
            if await self._write(place.pod, GANG_INCOMPLETE, warning, kind="Warning"):
                self._warned.add(place.pod.uid)
        return True

    def _incomplete_too_long(self, place: Place) -> bool:
        if not place.missing_members():
            return False
        try:
            created = datetime.fromisoformat(place.pod.created).timestamp()
        except ValueError:
            return False
        return self.wall_clock() - created >= self.gang_timeout

    def told(self, uid: str) -> bool:
        """Tell whether this pod was told that it waits."""
        return uid in self._said

    async def released(self, pod: Waiting) -> bool:
        """Tell a pod that was told it waits that it was released, and what it was charged;
        return whether it wrote.

        A pod charged when it was created (its gate removed at once) waited for no one, and
        is told nothing.
        """
        if pod.uid not in self._said:
            return False
        await self._write(
            pod,
            RELEASED,
            f"released from the line: charged {format_amount(pod.charge)} {pod.class_name} "
            f'GPU{"" if pod.charge == 1 else "s"} to the quota of namespace "{pod.namespace}", '
            "and the scheduling gate removed",
        )
        self._said.pop(pod.uid, None)
        return True

    def forget_all_but(self, waiting: Callable[[str], bool]) -> None:
        """Forget what was said to pods no longer in line."""
        self._said = {uid: said for uid, said in self._said.items() if waiting(uid)}
        self._warned = {uid for uid in self._warned if waiting(uid)}

    async def _write(
        self, pod: Waiting, reason: str, message: str, *, kind: str = "Normal"
    ) -> bool:
        name = event_name(pod, reason)
        try:
            found = await self.api.get_event(pod.namespace, name)
            if found is not None and (found.get("involvedObject") or {}).get("uid") == pod.uid:
                found.update(
                    message=message[:EVENT_MESSAGE_MAX],
                    count=int(found.get("count") or 1) + 1,
                    lastTimestamp=_now(),
                )
                await self.api.replace_event(pod.namespace, found)
                return True
            if found is not None:  # an older pod's of the same name: start afresh
                body = self._body(pod, reason, message, kind)
                body["metadata"] = found["metadata"]
                await self.api.replace_event(pod.namespace, body)
                return True
            await self.api.create_event(pod.namespace, self._body(pod, reason, message, kind))
            return True
        except KubeError as error:
            # An Event is information: losing one must not hold up releases.
            log.warning(
                "cannot record event %s on pod %s/%s: %s", reason, pod.namespace, pod.name, error
            )
            return False

    def _body(self, pod: Waiting, reason: str, message: str, kind: str) -> dict[str, Any]:
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name(pod, reason), "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:EVENT_MESSAGE_MAX],
            "type": kind,
            "source": {"component": "gpuadm"},
            "reportingComponent": "gpuadm.io/queue",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }


class EventWriter:
    """Writes the Events of the pods in line, off the release path, a bounded amount at a time.

    `placer(namespace)` returns what finds a waiting pod's place now (None: it waits no
    more). Run it as leader-only background work: `run(progress)`.
    """

    def __init__(
        self,
        events: PodEvents,
        usage: UsageIndex,
        placer: Callable[[str], Callable[[Waiting], Place | None]],
        *,
        ready: Callable[[], bool] = lambda: True,
        rate: float = WRITES_PER_SECOND,
        batch: int = BATCH,
        queue_max: int = QUEUE_MAX,
        sweep_every: float = MIN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.events = events
        self.usage = usage
        self.placer = placer
        self.ready = ready
        self.rate = rate
        self.batch = batch
        self.queue_max = queue_max
        self.sweep_every = sweep_every
        self.clock = clock
        self.sleep = sleep
        # namespace -> the last pod of its line seen by the sweep under way (None: none yet),
        # in turn order. Woken again during a sweep: swept again from the head after it.
        self._due: dict[str, Key | None] = {}
        self._again: set[str] = set()
        self._swept_at: dict[str, float] = {}
        self._released: dict[str, Waiting] = {}
        self._next_write = 0.0
        self._forgot_at = clock()
        self._wake = asyncio.Event()
        self.dropped = 0
        self._dropped_logged_at = float("-inf")
        self.writes = 0

    def wake(self, namespace: str) -> None:
        """What a namespace's line holds or decides changed: its pods may have news."""
        if namespace in self._due:
            if self._due[namespace] is not None:
                self._again.add(namespace)
        else:
            self._due[namespace] = None
        self._wake.set()

    def wake_all(self) -> None:
        """Sweep every line (this replica leads now, or the quotas changed)."""
        for namespace in self.usage.waiting_namespaces():
            self.wake(namespace)

    def released(self, pod: Waiting) -> None:
        """A pod left the line: tell it so, if it was told it waits (and there is room)."""
        if not self.events.told(pod.uid):
            return
        if len(self._released) >= self.queue_max and pod.uid not in self._released:
            self.dropped += 1
            now = self.clock()
            if now - self._dropped_logged_at >= FORGET_SECONDS:  # once a minute at most
                self._dropped_logged_at = now
                log.warning(
                    "too many Events pending: pod %s/%s is not told it was released "
                    "(%d not told so far)",
                    pod.namespace,
                    pod.name,
                    self.dropped,
                )
            return
        self._released[pod.uid] = pod
        self._wake.set()

    def pending(self) -> int:
        """Return how many namespaces and released pods wait for Events."""
        return len(self._due) + len(self._released)

    async def run(self, progress: Callable[[], None]) -> None:
        """Write Events as they come due, until cancelled."""
        while True:
            self._wake.clear()
            worked = self.ready() and await self.step()
            progress()
            if not worked:
                # Nothing due, or not yet: a line swept lately is swept again once allowed.
                # Not wait_for: on Python 3.11 it swallows a cancel that comes as the event is
                # set, and the task would outlive the leadership it was started for.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.sweep_every / 5):
                        await self._wake.wait()

    async def step(self) -> bool:
        """Do one bounded unit of work: tell one released pod, or place up to `batch` pods
        of the next namespace in turn and write their Events. Return whether there was any."""
        now = self.clock()
        if now - self._forgot_at >= FORGET_SECONDS:
            self._forgot_at = now
            self.events.forget_all_but(self.usage.is_waiting)
        if self._released:
            uid = next(iter(self._released))
            pod = self._released.pop(uid)
            await self._paced(partial(self.events.released, pod))
            return True
        namespace = next(
            (
                ns
                for ns, cursor in self._due.items()
                if cursor is not None
                or now - self._swept_at.get(ns, -self.sweep_every) >= self.sweep_every
            ),
            None,
        )
        if namespace is None:
            return False
        cursor = self._due.pop(namespace)
        if cursor is None:
            self._swept_at[namespace] = now
        pods = self.usage.line(namespace).after(cursor, self.batch)
        place = self.placer(namespace)
        for pod in pods:
            found = place(pod)
            if found is not None and self.events.due(found):
                await self._paced(partial(self.events.waiting_one, found))
        if len(pods) == self.batch:
            self._due[namespace] = key_of(pods[-1])  # its turn again, after the others
        elif namespace in self._again:
            self._again.discard(namespace)
            self._due[namespace] = None
        else:
            self._again.discard(namespace)
        return True

    async def _paced(self, write: Callable[[], Awaitable[bool]]) -> None:
        """Wait for the write's turn under `rate`, then make it."""
        wait = self._next_write - self.clock()
        if wait > 0:
            await self.sleep(wait)
        if await write():
            self.writes += 1
            self._next_write = max(self._next_write, self.clock()) + 1 / self.rate
