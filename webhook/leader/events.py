"""The Events a waiting pod carries: what it waits for, how many pods are ahead of it, and
when it was released. `kubectl describe pod` shows them; `kubectl get events` lists them.

Each pod has one waiting Event, updated in place (its count grows) when what it says
changes, at most every `min_interval` seconds per pod, and every half hour so that it does
not expire while the pod waits. A long line costs one object per pod, not one per pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from policies.quantity import format_amount
from policies.queue import Place, Waiting
from webhook.kube.client import EVENT_MESSAGE_MAX
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi

log = logging.getLogger("gpuadm.events")

WAITING = "GPUQuotaWaiting"
RELEASED = "GPUQuotaReleased"
MIN_INTERVAL_SECONDS = 5.0
# Events expire an hour after their last write by default (the apiserver's --event-ttl).
REFRESH_SECONDS = 1800.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(pod: Waiting, reason: str) -> str:
    """Name a pod's Event of one reason (a uid part tells pods of one name apart)."""
    kind = "waiting" if reason == WAITING else "released"
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
    ) -> None:
        """Write through `api`, naming this replica as `instance`."""
        self.api = api
        self.instance = instance
        self.min_interval = min_interval
        self.clock = clock
        # uid -> (reason text without the position, the full message, when written)
        self._said: dict[str, tuple[str, str, float]] = {}

    async def waiting(self, places: Iterable[Place]) -> None:
        """Tell each waiting pod what it waits for, if that changed."""
        now = self.clock()
        for place in places:
            said = self._said.get(place.pod.uid)
            message = place.message()
            # At most one write per pod every `min_interval` (the reason holds live numbers),
            # and an unchanged Event is written again before the apiserver lets it expire.
            if said is not None and (
                now - said[2] < self.min_interval
                or (said[1] == message and now - said[2] < REFRESH_SECONDS)
            ):
                continue
            if await self._write(place.pod, WAITING, message):
                self._said[place.pod.uid] = (place.reason, message, now)

    async def released(self, pod: Waiting) -> None:
        """Tell a pod that was told it waits that it was released, and what it was charged.

        A pod charged when it was created (its gate removed at once) waited for no one, and
        is told nothing.
        """
        if pod.uid not in self._said:
            return
        await self._write(
            pod,
            RELEASED,
            f"released from the line: charged {format_amount(pod.charge)} {pod.class_name} "
            f'GPU{"" if pod.charge == 1 else "s"} to the quota of namespace "{pod.namespace}", '
            "and the scheduling gate removed",
        )
        self._said.pop(pod.uid, None)

    def forget_all_but(self, uids: set[str]) -> None:
        """Forget what was said to pods no longer in line."""
        self._said = {uid: said for uid, said in self._said.items() if uid in uids}

    async def _write(self, pod: Waiting, reason: str, message: str) -> bool:
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
                body = self._body(pod, reason, message)
                body["metadata"] = found["metadata"]
                await self.api.replace_event(pod.namespace, body)
                return True
            await self.api.create_event(pod.namespace, self._body(pod, reason, message))
            return True
        except KubeError as error:
            # An Event is information: losing one must not hold up releases.
            log.warning(
                "cannot record event %s on pod %s/%s: %s", reason, pod.namespace, pod.name, error
            )
            return False

    def _body(self, pod: Waiting, reason: str, message: str) -> dict[str, Any]:
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
            "type": "Normal",
            "source": {"component": "gpuadm"},
            "reportingComponent": "gpuadm.io/queue",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
