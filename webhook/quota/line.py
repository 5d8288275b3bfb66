"""The queue line on the record: gated pods judged as they join, released in turns, and
their room given back when they leave before their release.

Queue mode (policies/quota/queue.py) uses the reservation book's records. A pod created behind
gpuadm's gate is admitted without a charge, unless a pass over its line would release it at
once; releasing it writes its reservation like any admission, before the gate is removed. A
pod in line whose reservation is already in the record was released by a replica that did
not get to remove its gate: it is charged, and only its gate is left to remove. So a release
interrupted at any point is finished later, and charged once.

Every answer comes from the line's index (`policies.quota.line`, `UsageIndex.line`) and the
record: a turn visits the record and the pods it releases, never the whole line.

`QueueLine` is what the leader's work sees of quota: it never reaches the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from policies import Plan
from policies.quota.cohorts import Cohort
from policies.quota.judge import QuotaVerdict
from policies.quota.line import Line
from policies.quota.queue import Gangs, Place, Waiting, waiting_pod
from policies.quota.quotas import QuotaConfig
from webhook.quota.book import RecordBusy, ReservationBook
from webhook.quota.claims import CLAIM_PREFIX, Claim, claims_in
from webhook.quota.reservations import Conflict, RecordFull, Reservation, storable
from webhook.quota.rooms import cohort_usage
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

log = logging.getLogger("gpuadm.quota")


@dataclass(frozen=True, slots=True)
class Turn:
    """What one turn over a namespace's line decided."""

    # The pods charged by this turn, in line order.
    released: tuple[Waiting, ...]
    # The turn stopped at its bound: more pods may be released on the next one.
    more: bool = False


def held_in_line(message: str, gate: str, limit: Fraction | None) -> QuotaVerdict:
    """Admit a pod uncharged, to wait in line behind `gate`, and say why."""
    return QuotaVerdict(
        True,
        message,
        (f"{message}; the scheduling gate {gate} holds it",),
        limit=limit,
        queued=True,
    )


class Joining:
    """The gated pods of one batch of admissions joining a namespace's line, in order.

    The line's index answers without visiting the line (`policies.quota.line`): the pods of the
    line the record charges already are left out (counted in what the namespace holds by
    their reservations), and the gated pods judged earlier in the batch join it, behind
    those of their order.
    """

    def __init__(
        self, namespace: str, line: Line, reservations: Mapping[str, Reservation], gated: bool
    ) -> None:
        self.namespace = namespace
        self._line = line
        # Found once per batch from the record, never from the line.
        self._charged = line.present(reservations) if gated else set()
        self._behind: list[Waiting] = []  # gated pods of this batch left waiting, in order

    def judge(
        self,
        request: AdmissionRequest,
        plan: Plan,
        key: str,
        in_use: Mapping[str, Fraction],
        limits: Mapping[str, Fraction],
        gate: str,
    ) -> QuotaVerdict:
        """Judge a pod created behind the gate as if it joined the end of its line: charged
        now if a pass over the line would release it, else left waiting, uncharged."""
        assert plan.class_name is not None
        joining = replace(waiting_pod(request.object, plan.class_name, plan.charge), uid=key)
        place = self._line.place(
            self.namespace, joining, in_use, limits, excluded=self._charged, extras=self._behind
        )
        limit = limits.get(plan.class_name)
        if place is None:
            return QuotaVerdict(True, limit=limit)
        if not request.dry_run:  # a dry run takes no place in line
            self._behind.append(joining)
        return held_in_line(place.message(), gate, limit)

    def charged(self, key: str) -> None:
        """Note that the pod `key` was charged in this batch: if it is in the line, the line
        leaves it out from now on."""
        if key in self._line:
            self._charged.add(key)


class QueueLine:
    """Each queue namespace's line, judged and released against the reservation book."""

    def __init__(self, book: ReservationBook, usage: UsageIndex) -> None:
        self._book = book
        self._usage = usage

    def joining(
        self, namespace: str, reservations: Mapping[str, Reservation], *, gated: bool
    ) -> Joining:
        """Begin a batch of admissions to a namespace, judged against `reservations`
        (`gated`: some of them join its line)."""
        return Joining(namespace, self._usage.line(namespace), reservations, gated)

    async def release(
        self,
        namespace: str,
        quotas: QuotaConfig,
        *,
        skip: frozenset[str] = frozenset(),
        most: int | None = None,
        held: Mapping[str, str] | None = None,
        gangs: Gangs | None = None,
    ) -> tuple[list[Waiting], Turn]:
        """Charge the pods of a namespace's line that fit now, in order; return every pod
        whose gate is to be removed (those charged before whose gate is still on, then those
        charged now) and what the turn decided. `skip` holds pods already released whose
        gate removal this replica's watch has not shown yet. `most` bounds the pods returned:
        the turn then charges the first of those a whole pass would, and says there are
        more (`Turn.more`). `held`: classes that keep waiting whatever their limits (a
        GPU-hour budget spent), with why. `gangs`: what is known of the line's gangs; a
        gang's pods are charged together, in the one write of the turn."""
        limits = quotas.limits_for(namespace)
        cohort = quotas.cohort_of(namespace)
        key = cohort.key if cohort is not None else namespace
        async with self._book.lock(key):
            return await self._book.compare_and_swap(
                key,
                lambda: self._try_release(namespace, limits, skip, most, held or {}, gangs, cohort),
            )

    async def _try_release(
        self,
        namespace: str,
        limits: Mapping[str, Fraction],
        skip: frozenset[str],
        most: int | None,
        held: Mapping[str, str],
        gangs: Gangs | None,
        cohort: Cohort | None = None,
    ) -> tuple[list[Waiting], Turn]:
        """One attempt of `release`; raises `Conflict` if another replica wrote first.

        In a `cohort`, the record is the cohort's, and the line is walked against the
        namespace's limits of the moment (`Cohort.limits_now`)."""
        key = cohort.key if cohort is not None else namespace
        # Read afresh, not from this replica's copy: other replicas charge gated pods at
        # admission, and a pass that releases nothing writes nothing, so it would never
        # learn of them from a failed write.
        record = await self._book.read(key)
        await self._book.watermark.catch_up(key, record)
        now = self._book.clock()
        reservations = self._book.unexpired(key, record, now)
        if cohort is not None:
            limits = cohort.limits_now(
                namespace, limits, cohort_usage(self._book, cohort, reservations)
            )
        line = self._usage.line(namespace)
        # Only the record is visited, and the pods of the line it charges: never the line.
        in_line = line.present(reservations)
        charged_all = sorted(
            (pod for uid in in_line if (pod := line.get(uid)) is not None), key=Waiting.order
        )
        charged = [w for w in charged_all if w.uid not in skip]
        more = most is not None and len(charged) > most
        if most is not None:
            charged = charged[:most]
        budget = None if most is None else most - len(charged)
        released: tuple[Waiting, ...] = ()
        if budget == 0:
            more = True
        else:
            walked = line.walk(
                namespace,
                self._book.in_use(key, reservations, record.allowances, of=namespace),
                limits,
                excluded=in_line | line.present(skip),
                most=budget,
                held=held,
                gangs=gangs,
            )
            released = walked.released
            more = more or not walked.complete
        # A charged pod still shown gated (its gate about to go, or gone and not yet shown)
        # keeps its reservation fresh, so that it never expires uncounted; and one charged
        # as it was admitted, still in flight then, is marked stored now. So is each pod
        # released: it waits in this view of the line, so it is stored by the view's
        # version, and a replica that starts after it is deleted (a new leader) knows it
        # gone rather than count it until its reservation expires.
        ttl = self._book.reservation_ttl
        # 0: no view yet, or a version a record could not carry.
        stored, label = storable(self._usage.version), self._usage.label
        stale = [w for w in charged_all if now - reservations[w.uid].at > ttl / 3]
        unmarked = [w for w in charged_all if stored and not reservations[w.uid].stored]
        turn = Turn(released, more)
        if not released and not stale and not unmarked:
            return charged, turn
        for pod in (*released, *stale, *unmarked):
            reservations[pod.uid] = Reservation(
                pod.class_name,
                pod.charge,
                now,
                pod.name,
                stored,
                label,
                namespace if key != namespace else "",
            )
        if released or stale:
            await self._book.write(key, reservations, record)
            return charged + list(released), turn
        # Only marks to write: they free room sooner after a failover, nothing more. A race
        # lost or a full record must not hold back the gates, which go all the same; the
        # reservations stay unmarked and expire as they always did.
        try:
            await self._book.write(key, reservations, record)
        except (Conflict, RecordFull) as failed:
            log.debug("namespace %s: pods charged at creation left unmarked: %r", namespace, failed)
        return charged, turn

    async def unreserve(self, namespace: str, uid: str, key: str | None = None) -> None:
        """Drop the reservation of a released pod that was deleted before its gate was
        removed, so its room frees now rather than when the reservation expires. `key`
        names the record, if not the namespace's own (a cohort's)."""
        key = key or namespace

        async def attempt() -> None:
            record = await self._book.read(key)
            if uid in record.reservations:
                rest = {k: r for k, r in record.reservations.items() if k != uid}
                await self._book.write(key, rest, record)

        async with self._book.lock(key):
            try:
                await self._book.compare_and_swap(key, attempt)
            except RecordBusy as busy:  # its reservation expires with the others instead
                log.warning("cannot give back the room of pod %s: %s", uid, busy.detail)

    def placer(
        self,
        namespace: str,
        limits: Mapping[str, Fraction],
        held: Mapping[str, str] | None = None,
        gangs: Gangs | None = None,
        cohort: Cohort | None = None,
    ) -> Callable[[Waiting], Place | None]:
        """Return what tells a waiting pod of the namespace its place now (None: it is
        charged, or a pass would release it), against this replica's view and record;
        `held` and `gangs` as `release` takes them; in a `cohort`, against its record and
        the namespace's limits of the moment."""
        key = cohort.key if cohort is not None else namespace
        reservations = self._book.copied(key)
        line = self._usage.line(namespace)
        excluded = line.present(reservations)
        in_use = self._book.in_use(key, reservations, of=namespace)
        if cohort is not None:
            limits = cohort.limits_now(
                namespace, limits, cohort_usage(self._book, cohort, reservations)
            )

        def place(pod: Waiting) -> Place | None:
            if pod.uid in reservations:
                return None  # charged: its gate is about to go
            return line.place(
                namespace, pod, in_use, limits, excluded=excluded, held=held, gangs=gangs
            )

        return place

    async def reserved(self, namespace: str, key: str | None = None) -> dict[str, Reservation]:
        """Read a namespace's record again (so this replica's reports and metrics see other
        replicas' reservations) and return its reservations that still count; `key` names
        the record, if not the namespace's own (a cohort's)."""
        key = key or namespace
        await self._book.refresh(key)
        return {
            uid: r
            for uid, r in self._book.reserved(key).items()
            if r.charges(key, namespace) and not uid.startswith(CLAIM_PREFIX)
        }

    async def cohort_usage(self, cohort: Cohort) -> dict[str, dict[str, Fraction]]:
        """Read a cohort's record again and return what each of its members holds."""
        await self._book.refresh(cohort.key)
        return cohort_usage(self._book, cohort)

    def charged(self, key: str) -> set[str]:
        """Return the keys of the reservations in this replica's copy of a record: pods
        charged, a waiting one among them released, its gate about to go."""
        return set(self._book.copied(key))

    def cohort_claims(self, cohort: Cohort) -> list[Claim]:
        """Return the claims of a cohort's record as last read (`cohort_usage` reads it):
        lenders' pods refused in enforce mode, asking for their quota back."""
        return claims_in(self._book.copied(cohort.key))

    async def recorded_namespaces(self) -> list[str]:
        """Return the namespaces that have a record, written by any replica."""
        return await self._book.recorded_namespaces()
