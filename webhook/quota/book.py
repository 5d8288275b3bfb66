"""The reservation book: each namespace's record of reservations, read, stored with
compare-and-swap, and pruned; and what a namespace holds by it.

A namespace holds (a) the GPU pods the pod watch has shown, plus (b) the reservations of
pods admitted but not yet shown. Across replicas, the record is written with the version it
was read at: if another replica wrote in between, the write fails (`Conflict`) and the
attempt is redone on the new record (`compare_and_swap`). Within a replica, one namespace's
judgements, releases and prunes take its lock (`lock`), one after another.

A reservation stops counting once this replica's watch has shown the pod (it is then counted
as a pod, once), and it is pruned from the record only after `reservation_ttl`, longer than
any admission request can take. So a reservation outlives the window in which the pod may be
invisible to any replica whose watch is healthy. A pod that was never stored (a later webhook
refused it) holds its room until then, and no longer.

In a cluster, a reservation leaves the record sooner: at the first write after the
writer's watch has shown its pod, which raises the record's watermark (`Mark`) to the
resourceVersion of the event that showed it. Every replica judges with a record only once
its own view of pods has reached the record's mark (`catch_up`): the pods whose reservations
left are then counted as pods. So a write carries only the reservations of pods in flight,
whatever the namespace's churn, and no judgement misses one.

In a cluster, a record also sets room aside for replicas to admit from without a write
(`webhook.quota.allowances`): a namespace holds, besides its pods and reservations, all of
other replicas' allowances, and all of what remains of this replica's. The pods admitted
from this replica's allowance count as its reservations, and every write of the record
carries them as such.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, TypeVar

from policies.quota.cohorts import record_of
from webhook.kube.errors import KubeError
from webhook.quota.allowances import ZERO, Allowances, holder_name
from webhook.quota.reservations import (
    Allowance,
    Conflict,
    Record,
    RecordFull,
    Reservation,
    ReservationStore,
    UnreadableRecord,
)
from webhook.quota.usage import UsageIndex
from webhook.quota.watermark import CATCH_UP_SECONDS, Watermark

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

# The apiserver gives up on a request after 60 s by default; a pod admitted now is stored
# (and so visible to the watch) well within that, or never.
RESERVATION_TTL = 90.0
# Each lost race means another admission in the same namespace landed, so ten in a row take
# a burst far beyond what one namespace sees; then the request is refused with "retry"
# rather than held past the apiserver's webhook timeout.
MAX_ATTEMPTS = 10

log = logging.getLogger("gpuadm.quota")

T = TypeVar("T")


class RecordBusy(KubeError):
    """Every attempt to store a namespace's record lost its race to another replica."""

    def __init__(self, namespace: str) -> None:
        self.detail = f"the quota record of {record_of(namespace)} is busy"
        super().__init__(409, self.detail)


class ReservationBook:
    """Every namespace's reservations: the shared records, and this replica's copy of them."""

    def __init__(
        self,
        usage: UsageIndex,
        store: ReservationStore,
        *,
        pods_visible: bool,
        clock: Callable[[], float] = time.time,
        reservation_ttl: float = RESERVATION_TTL,
        metrics: Metrics | None = None,
        catch_up_seconds: float = CATCH_UP_SECONDS,
        relist: Callable[[], None] = lambda: None,
        holder: str = "",
    ) -> None:
        """Keep records in `store`.

        With `pods_visible` (in a cluster), reservations of pods the watch has shown leave
        the record at the next write, and room is set aside for this replica, named after
        `holder`, to admit from without a write (`webhook.quota.allowances`). A judgement
        waits `catch_up_seconds` at most for the view to reach a record's mark; `relist`
        asks the pod watch for a full list, the one way to reach a mark made by a watch of
        another label. Without (standalone), reservations never expire, none is ever shown
        as a pod, and nothing is set aside."""
        self.usage = usage
        self.pods_visible = pods_visible
        self.watermark = Watermark(
            usage, pods_visible=pods_visible, clock=clock, within=catch_up_seconds, relist=relist
        )
        self.clock = clock
        self.reservation_ttl = reservation_ttl
        self._store = store
        self._metrics = metrics
        self.allowances = Allowances(
            holder_name(holder),
            enabled=pods_visible,
            clock=clock,
            reservation_ttl=reservation_ttl,
        )
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The record of each namespace as this replica last read or wrote it.
        self._copies: dict[str, Record] = {}

    def lock(self, namespace: str) -> asyncio.Lock:
        """Return the lock that orders this replica's work on a namespace's record."""
        return self._locks[namespace]

    async def read(self, namespace: str) -> Record:
        """Read a namespace's record from the store, as any replica last wrote it."""
        return await self._store.read(namespace)

    async def read_copy(self, namespace: str) -> Record:
        """Return this replica's copy of a namespace's record, read from the store if it has
        none. A copy overtaken by another replica fails to store, and is read again."""
        return self._copies.get(namespace) or await self._store.read(namespace)

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        read: Record,
        take: Mapping[str, Fraction] | None = None,
        limits: Mapping[str, Fraction] | None = None,
    ) -> None:
        """Write `reservations` over the record `read` (raising `Conflict` if it moved on),
        leaving out those whose pods the watch has shown, and keep a copy.

        The write also carries the pods admitted from this replica's allowance, as
        reservations, and the allowance as it stands, with `take` more room set aside
        under the namespace's `limits` (`Allowances.composed`)."""
        allowances = self.allowances
        pending = allowances.pending(namespace)
        flushed = list(pending)
        if pending:
            reservations = {**pending, **reservations}
        allowance_map, written = allowances.composed(namespace, read, self.clock(), take, limits)
        kept, mark = self.watermark.dropping(reservations, read.mark)
        try:
            new_version = await self._store.write(
                namespace, kept, read.version, mark, allowances=allowance_map
            )
        except (Conflict, RecordFull):
            raise  # refused: nothing was stored
        except KubeError:
            allowances.unsure(namespace, written)  # it may have been stored all the same
            raise
        self._copies[namespace] = Record(kept, new_version, mark, allowance_map)
        allowances.stored(namespace, flushed, written)

    async def compare_and_swap(self, namespace: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` (read the record, decide, write at the version read) until its
        write is not overtaken by another replica's; raise `RecordBusy` after
        `MAX_ATTEMPTS` lost races."""
        for _ in range(MAX_ATTEMPTS):
            try:
                return await attempt()
            except Conflict:
                if self._metrics is not None:
                    self._metrics.record_conflicts.inc()
                self._copies.pop(namespace, None)
        raise RecordBusy(namespace)

    async def give_back(self, namespace: str) -> None:
        """Give this replica's room aside in a namespace back, in one write that also
        carries the pods admitted from it as reservations (`webhook.quota.allowances`)."""

        async def attempt() -> None:
            record = await self.read_copy(namespace)
            self.allowances.release(namespace)
            await self.write(namespace, self.unexpired(namespace, record, self.clock()), record)

        async with self.lock(namespace):
            await self.compare_and_swap(namespace, attempt)

    def counted_aside(self) -> None:
        """Count an admission judged from this replica's room aside, without a write."""
        if self._metrics is not None:
            self._metrics.admitted_aside.inc()

    def forget_copy(self, namespace: str) -> None:
        """Drop this replica's copy of a namespace's record: the next judgement reads it."""
        self._copies.pop(namespace, None)

    async def refresh(self, namespace: str) -> None:
        """Read a namespace's record again, so reports see other replicas' reservations."""
        record = await self._store.read(namespace)
        if record.version is None:
            self._copies.pop(namespace, None)
        else:
            self._copies[namespace] = record

    def unexpired(self, namespace: str, record: Record, now: float) -> dict[str, Reservation]:
        """Return the reservations of a namespace's record that have not expired by `now`,
        and the pods admitted from this replica's allowance that it does not hold yet."""
        if not self.pods_visible:
            return dict(record.reservations)
        kept = {
            uid: reservation
            for uid, reservation in record.reservations.items()
            if now - reservation.at < self.reservation_ttl
        }
        pending = self.allowances.pending(namespace)
        return {**pending, **kept} if pending else kept

    def copied(self, namespace: str) -> dict[str, Reservation]:
        """Return the unexpired reservations of this replica's copy of a namespace's record
        (`unexpired`)."""
        record = self._copies.get(namespace)
        if record is None:
            pending = self.allowances.pending(namespace)
            return dict(pending) if self.pods_visible else {}
        return self.unexpired(namespace, record, self.clock())

    def reserved(self, namespace: str) -> dict[str, Reservation]:
        """Return the copied reservations of a namespace that still count (see `counts`)."""
        unexpired = self.copied(namespace)
        return {uid: r for uid, r in unexpired.items() if self.counts(uid, r)}

    def counts(self, uid: str, reservation: Reservation) -> bool:
        """Tell whether an unexpired reservation counts in what its namespace holds: not
        once the watch has shown its pod (it then counts as a pod), nor once this view shows
        that a pod known to be stored has gone (`UsageIndex.left`)."""
        if not self.pods_visible:
            return True
        usage = self.usage
        return not usage.seen(uid) and not (
            reservation.stored and usage.left(uid, reservation.stored, reservation.stored_by)
        )

    def in_use(
        self,
        namespace: str,
        reservations: Mapping[str, Reservation] | None = None,
        allowances: Mapping[str, Allowance] | None = None,
        *,
        set_aside: bool = True,
        of: str | None = None,
    ) -> dict[str, Fraction]:
        """Return what a namespace holds: its pods, and `reservations` not yet shown as
        pods, and (with `set_aside`) the room of `allowances` of other replicas and what
        remains of this replica's. By default, the reservations and allowances of this
        replica's copy of the record.

        `namespace` names the record; in a cohort's (`cohort.<name>`), `of` names the member
        whose holdings are counted, and only the reservations that charge it."""
        key = namespace
        namespace = of if of is not None else key
        if reservations is None:
            reservations = self.copied(key)
        if allowances is None:
            copy = self._copies.get(key)
            allowances = copy.allowances if copy is not None else {}
        if key != namespace:
            reservations = {uid: r for uid, r in reservations.items() if r.charges(key, namespace)}
        usage = self.usage
        totals = dict(usage.in_use(namespace))
        if set_aside:
            held = self.allowances
            for room in (held.others(allowances, self.clock()), held.remaining(key)):
                for class_name, amount in room.items():
                    if amount:
                        totals[class_name] = totals.get(class_name, ZERO) + amount
        # Reservations of pods the watch has shown are counted as pods instead (most of
        # them: left out in one pass), and those of pods known gone not at all (`counts`).
        pending = usage.unseen(reservations) if self.pods_visible else reservations
        for uid in pending:
            reservation = reservations[uid]
            if not self.counts(uid, reservation):
                continue
            totals[reservation.class_name] = (
                totals.get(reservation.class_name, Fraction(0)) + reservation.charge
            )
        return totals

    def copied_namespaces(self) -> list[str]:
        """Return the namespaces this replica holds a copy of the record of."""
        return list(self._copies)

    async def recorded_namespaces(self) -> list[str]:
        """Return the namespaces that have a record, written by any replica."""
        return await self._store.namespaces()

    async def prune_all(self) -> None:
        """Prune the record of every namespace that has one, written by any replica. One
        this version cannot read (a later version's) is left as it is, and said so; the
        others are pruned all the same."""
        for namespace in await self._store.namespaces():
            try:
                await self.prune(namespace)
            except UnreadableRecord as unreadable:
                log.error("%s; it is left as it is", unreadable.detail)

    async def prune(self, namespace: str) -> None:
        """Drop expired reservations from a namespace's record, and those whose pods the
        watch has shown; delete a record left empty.

        So records exist only while they hold reservations, and a namespace that holds none
        (or never held a pod, as with a forged review) leaves nothing behind. A record
        emptied by reservations that left as their pods were shown stays, with its mark,
        until `reservation_ttl` has passed since the last did: a record made anew would
        have no mark, and a replica whose watch lags would judge without those pods.
        """
        async with self._locks[namespace]:
            try:
                record = await self._store.read(namespace)
                now = self.clock()
                unexpired = self.unexpired(namespace, record, now)
                kept, mark = self.watermark.dropping(unexpired, record.mark)
                marked = mark.version and now - mark.at < self.reservation_ttl
                set_aside = self.allowances.others(record.allowances, now) or (
                    self.allowances.holds(namespace, now)
                )
                if not kept and not marked and not set_aside and record.version is not None:
                    await self._store.delete(namespace, record.version)
                elif len(kept) != len(record.reservations):
                    await self.write(namespace, unexpired, record)
            except Conflict:
                self._copies.pop(namespace, None)
                return
        if not kept and not marked and not set_aside:
            # Its lock stays: it may have waiters, and locks exist only for real namespaces.
            self._copies.pop(namespace, None)
