"""The size of each gang waiting in line, read from what sizes it, for the leader's turns.

A gang's size comes from its owner, never from its pods' say (policies/workloads/gangs.py):
a Job's spec (`job_gang_size`), a PodGroup's `minMember`. Kueue's and gpuadm's forms carry
the size on every pod, and are read there; pods of one gang that disagree on it leave the
gang unsized, and waiting. What is read is kept for `TTL_SECONDS` (a size rarely changes,
and a line of thousands should not cost thousands of reads a turn); a turn reads at most
`READS_PER_TURN` gangs, the others on the next turns. A read that fails keeps the size
read last; with none, the gang waits and its pods are told why. Nothing here guesses: a
gang whose size is not known is never released as if it were whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from policies.quota.queue import Gangs, Waiting
from policies.workloads import Gang, GangError, job_gang_size, min_member
from webhook.kube.errors import KubeError
from webhook.kube.rest import POD_GROUP_APIS, AsyncApi
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.quota")

# How long a size read stays good, in seconds.
TTL_SECONDS = 5.0
# The most gangs one turn reads from the apiserver.
READS_PER_TURN = 50
# The most sizes kept at once, over every namespace: the oldest go first.
MOST_KEPT = 10_000
# The forms whose size every pod of the gang carries.
SIZED_ON_PODS = ("kueue", "gpuadm")


class GangSizes:
    """Sizes of the gangs in the lines, read through the apiserver and kept a short while."""

    def __init__(
        self,
        api: AsyncApi | None,
        usage: UsageIndex,
        *,
        strict: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        ttl: float = TTL_SECONDS,
        reads_per_turn: int = READS_PER_TURN,
        most_kept: int = MOST_KEPT,
    ) -> None:
        """Read with `api` (None: no apiserver, only what pods carry) the gangs of `usage`'s
        lines; `strict(namespace)` says whether a
        namespace's line lets nothing pass a gang not yet whole."""
        self.api = api
        self.usage = usage
        self.strict = strict
        self.clock = clock
        self.ttl = ttl
        self.reads_per_turn = reads_per_turn
        self.most_kept = most_kept
        # (namespace, gang) -> (when read, its size or why it has none)
        self._kept: dict[tuple[str, str], tuple[float, int | str]] = {}

    async def read(self, namespace: str) -> Gangs:
        """Read the sizes of the namespace's gangs not read lately, then say what is known."""
        reads = 0
        now = self.clock()
        for gang in self.usage.line(namespace).gang_keys():
            source, _, name = gang.partition("/")
            if source in SIZED_ON_PODS:
                continue
            kept = self._kept.get((namespace, gang))
            if kept is not None and now - kept[0] < self.ttl:
                continue
            if reads == self.reads_per_turn:
                break
            reads += 1
            found = await self._read_one(namespace, source, name, kept)
            self._keep((namespace, gang), (now, found))
        return self.known(namespace)

    async def size_of(self, namespace: str, gang: Gang) -> int | str:
        """Return a gang's size, or why it cannot be known: from its pods' say for the forms
        that carry it, else read (or kept from a read of the last `ttl` seconds)."""
        if gang.size is not None or gang.source in SIZED_ON_PODS:
            return gang.size if gang.size is not None else f"its {gang.describe()} has no size"
        key = (namespace, gang.key)
        kept = self._kept.get(key)
        if kept is not None and self.clock() - kept[0] < self.ttl:
            return kept[1]
        found = await self._read_one(namespace, gang.source, gang.name, kept)
        self._keep(key, (self.clock(), found))
        return found

    def known(self, namespace: str) -> Gangs:
        """Say what is known of the namespace's gangs, without a read (what the leader's
        Events tell the waiting pods)."""
        sizes: dict[str, int] = {}
        unknown: dict[str, str] = {}
        for gang, pods in self.usage.line(namespace).gangs().items():
            found = self._size(namespace, gang, pods)
            if isinstance(found, int):
                sizes[gang] = found
            elif found is not None:
                unknown[gang] = found
        return Gangs(sizes, self.usage.gang_running(namespace), self.strict(namespace), unknown)

    def _size(self, namespace: str, gang: str, pods: Sequence[Waiting]) -> int | str | None:
        source = gang.partition("/")[0]
        if source in SIZED_ON_PODS:
            said = sorted({pod.gang_size for pod in pods if pod.gang_size is not None})
            if len(said) == 1:
                return said[0]
            if not said:
                return None
            return f"its pods disagree on its size ({', '.join(map(str, said))}): it waits"
        kept = self._kept.get((namespace, gang))
        return None if kept is None else kept[1]

    async def _read_one(
        self, namespace: str, source: str, name: str, kept: tuple[float, int | str] | None
    ) -> int | str:
        what = f"Job {name}" if source == "job" else f"PodGroup {name} ({source})"
        if self.api is None:
            return f"gpuadm, serving without an apiserver, cannot read its {what}"
        try:
            if source == "job":
                job = await self.api.get_job(namespace, name)
                if job is None:
                    return f"its {what} does not exist"
                return job_gang_size(job)
            if source not in POD_GROUP_APIS:
                return f"it is of a form gpuadm cannot size ({source})"
            group = await self.api.get_pod_group(source, namespace, name)
            if group is None:
                return f"its {what} does not exist (yet)"
            return min_member(group)
        except GangError as error:
            return f"its {what} cannot be read: {error}"
        except KubeError as error:
            log.warning("cannot read the %s of namespace %s: %s", what, namespace, error)
            if kept is not None and isinstance(kept[1], int):
                return kept[1]  # the size read last stands until one is read again
            return f"gpuadm cannot read its {what} ({error}); it tries again"

    def _keep(self, key: tuple[str, str], value: tuple[float, int | str]) -> None:
        self._kept.pop(key, None)
        self._kept[key] = value
        while len(self._kept) > self.most_kept:
            del self._kept[next(iter(self._kept))]
