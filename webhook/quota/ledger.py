"""The quota ledger: judges each GPU pod against its namespace's quota, exactly.

What a namespace holds is (a) the GPU pods the pod watch has shown, plus (b) the
reservations of pods admitted but not yet shown. Two rules keep this from over-admitting:

- Within a replica, one namespace's admissions are judged one after another, each against
  what the ones before it reserved, so two requests never both see the same free room.
- Across replicas, the reservation record is written with the version it was read at. If
  another replica wrote in between, the write fails, and the judgement is redone on the new
  record. A pod is admitted only after its reservation is stored.

Admissions that arrive while a namespace's record is being written wait, and are then
judged together, in arrival order, and stored with one write: a group commit, as the
apiserver's own ResourceQuota admission batches the admissions waiting on one quota. A
burst of creates in one namespace costs a few writes, not one per pod.

A reservation stops counting once this replica's watch has shown the pod (it is then counted
as a pod, once), and it is pruned from the record only after `reservation_ttl`, longer than
any admission request can take. So a reservation outlives the window in which the pod may be
invisible to any replica whose watch is healthy. A pod that was never stored (a later webhook
refused it) holds its room until then, and no longer.

Queue mode (policies/queue.py) uses the same record. A pod created behind gpuadm's gate is
admitted without a charge; releasing it writes its reservation like any admission, before
the gate is removed. A pod in line whose reservation is already in the record was released
by a replica that did not get to remove its gate: it is charged, and only its gate is left
to remove. So a release interrupted at any point is finished later, and charged once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TypeVar

from policies import Plan
from policies.judge import QuotaVerdict, judge, never_fits
from policies.queue import Place, Waiting, gate_name, is_gated, may_gate, waiting_pod
from policies.quotas import QuotaConfig, limits_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.observe.metrics import Metrics, QuotaReading
from webhook.quota.namespaces import every_namespace_exists
from webhook.quota.reservations import (
    Conflict,
    Record,
    RecordFull,
    Reservation,
    ReservationStore,
)
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

log = logging.getLogger("gpuadm.quota")

# The apiserver gives up on a request after 60 s by default; a pod admitted now is stored
# (and so visible to the watch) well within that, or never.
RESERVATION_TTL = 90.0
# Each lost race means another admission in the same namespace landed, so ten in a row take
# a burst far beyond what one namespace sees; then the request is refused with "retry"
# rather than held past the apiserver's webhook timeout.
MAX_ATTEMPTS = 10
# While a namespace's record is full, each batch of its admissions finds it so: log it this
# often at most.
FULL_LOG_SECONDS = 60.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Ask:
    """One admission waiting to be judged with the others of its namespace."""

    request: AdmissionRequest
    plan: Plan
    config: ConfigSnapshot
    limits: Mapping[str, Fraction]
    # Created behind gpuadm's gate: charged now if it is first in line and fits, else left
    # waiting in line, uncharged.
    gated: bool
    verdict: asyncio.Future[QuotaVerdict] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(frozen=True, slots=True)
class Turn:
    """What one turn over a namespace's line decided."""

    # The pods charged by this turn, in line order.
    released: tuple[Waiting, ...]
    # The turn stopped at its bound: more pods may be released on the next one.
    more: bool = False


class RecordBusy(KubeError):
    """Every attempt to store a namespace's record lost its race to another replica."""

    def __init__(self, namespace: str) -> None:
        self.detail = f'the quota record of namespace "{namespace}" is busy'
        super().__init__(409, self.detail)


class QuotaLedger:
    """A `QuotaGate` that charges reservations to a shared record and judges exactly."""

    def __init__(
        self,
        usage: UsageIndex,
        store: ReservationStore,
        *,
        pods_visible: bool,
        usage_ready: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        reservation_ttl: float = RESERVATION_TTL,
        metrics: Metrics | None = None,
        namespace_exists: Callable[[str], Awaitable[bool]] = every_namespace_exists,
    ) -> None:
        """Build a ledger; with `pods_visible` False (standalone) reservations never expire.

        `usage_ready` says whether the usage index is in sync; `namespace_exists` whether a
        namespace is real, so that nothing is judged or kept for one that is not.
        """
        self.usage = usage
        self.store = store
        self.pods_visible = pods_visible
        self.usage_ready = usage_ready
        self.clock = clock
        self.reservation_ttl = reservation_ttl
        self.metrics = metrics
        self.namespace_exists = namespace_exists
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._records: dict[str, Record] = {}
        # Admissions not yet judged, and the task that judges them, per namespace.
        self._waiting: defaultdict[str, list[_Ask]] = defaultdict(list)
        self._committers: dict[str, asyncio.Task[None]] = {}
        self._full_logged: dict[str, float] = {}

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Judge the pod; reserve its charge unless this is a dry run or nothing limits it."""
        namespace = request.namespace
        limits = config.quotas.limits_for(namespace)
        if plan.class_name is None:
            return None
        gate = gate_name(config.policy)
        gated = is_gated(request.object, gate)
        mode = config.quotas.mode_for(namespace)
        if gated and mode != "queue":
            # Waiting in line is for queue namespaces: a pod that brought the gate itself
            # elsewhere would be admitted uncharged and released later, past `enforce`.
            return QuotaVerdict(
                False,
                f"the scheduling gate {gate} is gpuadm's: it holds pods in line only in "
                f'namespaces whose GPU quota mode is queue, and namespace "{namespace}" is in '
                f"{mode} mode: create the pod without it",
            )
        if not limits_on(plan.class_name, limits):
            return None
        if gated and (never := _never_fits(namespace, plan, limits)) is not None:
            return never
        if not self.usage_ready():
            return QuotaVerdict(
                False, "gpuadm's view of GPU usage is not in sync with the cluster yet; retry"
            )
        try:
            exists = await self.namespace_exists(namespace)
        except KubeError as error:
            log.warning("cannot check that namespace %s exists: %s", namespace, error)
            return QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
        if not exists:
            return QuotaVerdict(False, f'namespace "{namespace}" does not exist')
        ask = _Ask(request, plan, config, limits, gated)
        self._waiting[namespace].append(ask)
        if namespace not in self._committers:
            task = asyncio.create_task(self._commit(namespace), name=f"quota-{namespace}")
            self._committers[namespace] = task
        verdict = await ask.verdict
        if (
            verdict.exceeded
            and config.quotas.mode_for(namespace) == "queue"
            and may_gate(request.object)
        ):
            # The room this pod was created for went to another pod meanwhile: the gate that
            # would have held it can only be given at creation. (A pod bound to a node at
            # creation can have no gate: it is told what enforce mode says.)
            return QuotaVerdict(
                False,
                f"{verdict.message}; it was taken by another pod while this one was being "
                "created: create the pod again, and it waits in line",
                in_use=verdict.in_use,
                limit=verdict.limit,
                exceeded=verdict.exceeded,
            )
        return verdict

    def should_gate(
        self, namespace: str, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """In a queue namespace, give every pod a limit applies to gpuadm's gate at creation.

        The validating judgement then either charges it at once (the gate is removed by the
        leader within moments) or leaves it waiting in line, uncharged. So a burst of creates
        is never refused for lack of room, and waits in order. A pod that could never fit is
        refused (`allowed` False); None means no gate.
        """
        quotas = config.quotas
        limits = quotas.limits_for(namespace)
        class_name = plan.class_name
        if quotas.mode_for(namespace) != "queue" or class_name is None:
            return None
        if not limits_on(class_name, limits):
            return None
        never = _never_fits(namespace, plan, limits)
        return never if never is not None else QuotaVerdict(True, queued=True)

    async def release(
        self,
        namespace: str,
        quotas: QuotaConfig,
        *,
        skip: frozenset[str] = frozenset(),
        most: int | None = None,
    ) -> tuple[list[Waiting], Turn]:
        """Charge the pods of a namespace's line that fit now, in order; return every pod
        whose gate is to be removed (those charged before whose gate is still on, then those
        charged now) and what the turn decided. `skip` holds pods already released whose
        gate removal this replica's watch has not shown yet. `most` bounds the pods returned:
        the turn then charges the first of those a whole pass would, and says there are
        more (`Turn.more`)."""
        limits = quotas.limits_for(namespace)
        async with self._locks[namespace]:
            return await self._swap(
                namespace, lambda: self._release_once(namespace, limits, skip, most)
            )

    async def _release_once(
        self,
        namespace: str,
        limits: Mapping[str, Fraction],
        skip: frozenset[str],
        most: int | None,
    ) -> tuple[list[Waiting], Turn]:
        """One attempt of `release`; raises `Conflict` if another replica wrote first."""
        # Read afresh, not from this replica's cache: other replicas charge gated pods at
        # admission, and a pass that releases nothing writes nothing, so it would never
        # learn of them from a failed write.
        record = await self.store.read(namespace)
        now = self.clock()
        kept = self._unexpired(record, now)
        line = self.usage.line(namespace)
        # Only the record is visited, and the pods of the line it charges: never the line.
        in_line = line.present(kept)
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
                self._in_use(namespace, kept),
                limits,
                excluded=in_line | line.present(skip),
                most=budget,
            )
            released = walked.released
            more = more or not walked.complete
        # A charged pod still shown gated (its gate about to go, or gone and not yet shown)
        # keeps its reservation fresh, so that it never expires uncounted.
        stale = [w for w in charged_all if now - kept[w.uid].at > self.reservation_ttl / 3]
        turn = Turn(released, more)
        if not released and not stale:
            return charged, turn
        for pod in (*released, *stale):
            kept[pod.uid] = Reservation(pod.class_name, pod.charge, now, pod.name)
        await self._store(namespace, kept, record.version)
        return charged + list(released), turn

    def placer(
        self, namespace: str, limits: Mapping[str, Fraction]
    ) -> Callable[[Waiting], Place | None]:
        """Return what tells a waiting pod of the namespace its place now (None: it is
        charged, or a pass would release it), against this replica's view and record."""
        record = self._records.get(namespace)
        kept = self._unexpired(record, self.clock()) if record else {}
        line = self.usage.line(namespace)
        excluded = line.present(kept)
        in_use = self._in_use(namespace, kept)

        def place(pod: Waiting) -> Place | None:
            if pod.uid in kept:
                return None  # charged: its gate is about to go
            return line.place(namespace, pod, in_use, limits, excluded=excluded)

        return place

    def places(self, namespace: str, quotas: QuotaConfig) -> list[Place]:
        """Return the place of every pod of a namespace's line, in line order (O(line))."""
        place = self.placer(namespace, quotas.limits_for(namespace))
        return [p for pod in self.usage.line(namespace).ordered() if (p := place(pod))]

    async def unreserve(self, namespace: str, uid: str) -> None:
        """Drop the reservation of a released pod that was deleted before its gate was
        removed, so its room frees now rather than when the reservation expires."""

        async def attempt() -> None:
            record = await self.store.read(namespace)
            if uid in record.reservations:
                kept = {k: r for k, r in record.reservations.items() if k != uid}
                await self._store(namespace, kept, record.version)

        async with self._locks[namespace]:
            try:
                await self._swap(namespace, attempt)
            except RecordBusy as busy:  # its reservation expires with the others instead
                log.warning("cannot give back the room of pod %s: %s", uid, busy.detail)

    async def _commit(self, namespace: str) -> None:
        """Judge and store the namespace's waiting admissions, a batch at a time, until none."""
        try:
            while batch := self._waiting.pop(namespace, []):
                async with self._locks[namespace]:
                    await self._commit_batch(namespace, batch)
        finally:
            del self._committers[namespace]

    async def _commit_batch(self, namespace: str, batch: list[_Ask]) -> None:
        try:
            verdicts = await self._swap(namespace, lambda: self._judge_and_store(namespace, batch))
            for ask, verdict in zip(batch, verdicts, strict=True):
                ask.verdict.set_result(verdict)
        except RecordBusy as busy:
            for ask in batch:
                ask.verdict.set_result(QuotaVerdict(False, f"{busy.detail}; retry the request"))
        except KubeError as error:  # the apiserver is unreachable or refused: no fault of ours
            log.warning("cannot store the quota record of namespace %s: %s", namespace, error)
            unreachable = QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
            for ask in batch:
                if not ask.verdict.done():
                    ask.verdict.set_result(unreachable)
        except Exception as error:  # each waiting request fails as it would have alone
            for ask in batch:
                if not ask.verdict.done():
                    ask.verdict.set_exception(error)

    async def _judge_and_store(self, namespace: str, batch: list[_Ask]) -> list[QuotaVerdict]:
        """Judge each admission in order against the record and those before it; store once."""
        record = self._records.get(namespace) or await self.store.read(namespace)
        now = self.clock()
        kept = self._unexpired(record, now)
        verdicts = []
        reserved = False
        behind: list[Waiting] = []  # gated pods of this batch left waiting, in order
        # The pods of the line the record charges already, left out of it: found once per
        # batch from the record, never from the line.
        line = self.usage.line(namespace)
        charged_in_line = line.present(kept) if any(ask.gated for ask in batch) else set()
        # What the namespace holds, summed once a batch and kept up to date as it admits:
        # summing it again for each admission cost a pass over every reservation of the
        # last 90 s, each time.
        totals = self._in_use(namespace, kept)
        for ask in batch:
            class_name = ask.plan.class_name
            assert class_name is not None
            key = _reservation_key(ask.request)
            # A pod judged again (a retried request) is not counted against itself.
            counted = not self._counted_as_pod(key)
            own = kept.get(key)
            in_use = totals if own is None or not counted else _less(totals, own)
            if ask.gated:
                verdict = self._judge_gated(namespace, ask, key, charged_in_line, in_use, behind)
            else:
                verdict = judge(
                    namespace=namespace,
                    class_name=class_name,
                    requested=ask.plan.charge,
                    in_use=in_use,
                    limits=ask.limits,
                    mode=ask.config.quotas.mode_for(namespace),
                )
            verdicts.append(verdict)
            if verdict.allowed and not verdict.queued and not ask.request.dry_run:
                kept[key] = Reservation(class_name, ask.plan.charge, now, ask.request.pod_name)
                if key in line:
                    charged_in_line.add(key)
                reserved = True
                if counted:  # its new reservation replaces the one `in_use` left out
                    totals = {
                        **in_use,
                        class_name: in_use.get(class_name, Fraction(0)) + ask.plan.charge,
                    }
        if reserved:
            try:
                await self._store(namespace, kept, record.version)
            except RecordFull as full:  # nothing was written; the oldest expire within 90 s
                self._log_full(namespace, full)
                return [
                    _unreserved(ask, verdict, full)
                    for ask, verdict in zip(batch, verdicts, strict=True)
                ]
        return verdicts

    def _log_full(self, namespace: str, full: RecordFull) -> None:
        """Log a full record once a minute at most: every batch meets it until it empties."""
        now = self.clock()
        if now - self._full_logged.get(namespace, float("-inf")) >= FULL_LOG_SECONDS:
            self._full_logged[namespace] = now
            log.warning("%s", full.detail)

    async def _swap(self, namespace: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` (read the record, decide, store at the version read) until its
        write is not overtaken by another replica's; raise `RecordBusy` after
        `MAX_ATTEMPTS` lost races."""
        for _ in range(MAX_ATTEMPTS):
            try:
                return await attempt()
            except Conflict:
                if self.metrics is not None:
                    self.metrics.record_conflicts.inc()
                self._records.pop(namespace, None)
        raise RecordBusy(namespace)

    async def _store(
        self, namespace: str, kept: dict[str, Reservation], version: str | None
    ) -> None:
        """Write the record at `version` (raising `Conflict` if it moved on) and keep it."""
        new_version = await self.store.write(namespace, kept, version)
        self._records[namespace] = Record(kept, new_version)

    def _judge_gated(
        self,
        namespace: str,
        ask: _Ask,
        key: str,
        charged_in_line: set[str],
        in_use: Mapping[str, Fraction],
        behind: list[Waiting],
    ) -> QuotaVerdict:
        """Judge a pod created behind the gate as if it joined the end of its line: charged
        now if a pass over the line would release it, else left waiting, uncharged.

        The line's index answers without visiting the line (`policies.line`): the pods of
        the line charged already are left out (counted in `in_use` by their reservations),
        and the gated pods judged earlier in this batch join it, behind those of their
        order."""
        assert ask.plan.class_name is not None
        me = replace(waiting_pod(ask.request.object, ask.plan.class_name, ask.plan.charge), uid=key)
        place = self.usage.line(namespace).place(
            namespace, me, in_use, ask.limits, excluded=charged_in_line, extras=behind
        )
        if place is None:
            return QuotaVerdict(True, limit=ask.limits.get(ask.plan.class_name))
        if not ask.request.dry_run:  # a dry run takes no place in line
            behind.append(me)
        message = place.message()
        return QuotaVerdict(
            True,
            message,
            (f"{message}; the scheduling gate {gate_name(ask.config.policy)} holds it",),
            limit=ask.limits.get(ask.plan.class_name),
            queued=True,
        )

    def in_use(self, namespace: str) -> dict[str, Fraction]:
        """Return what a namespace holds now, pods and cached reservations together."""
        return self._in_use(namespace, self.reserved(namespace))

    def reserved(self, namespace: str) -> dict[str, Reservation]:
        """Return the cached reservations of a namespace that still count (not yet shown as
        pods by the watch, and unexpired)."""
        record = self._records.get(namespace)
        kept = self._unexpired(record, self.clock()) if record else {}
        if not self.pods_visible:
            return kept
        return {uid: r for uid, r in kept.items() if not self.usage.seen(uid)}

    async def refresh(self, namespace: str) -> None:
        """Read a namespace's record again, so reports see other replicas' reservations."""
        record = await self.store.read(namespace)
        if record.version is None:
            self._records.pop(namespace, None)
        else:
            self._records[namespace] = record

    def _unexpired(self, record: Record, now: float) -> dict[str, Reservation]:
        if not self.pods_visible:
            return dict(record.reservations)
        return {
            uid: reservation
            for uid, reservation in record.reservations.items()
            if now - reservation.at < self.reservation_ttl
        }

    def _counted_as_pod(self, uid: str) -> bool:
        """Tell whether the watch has shown this pod, which then counts as a pod, not by its
        reservation."""
        return self.pods_visible and self.usage.seen(uid)

    def _in_use(
        self, namespace: str, reservations: Mapping[str, Reservation]
    ) -> dict[str, Fraction]:
        totals = dict(self.usage.in_use(namespace))
        # Reservations of pods the watch has shown are counted as pods instead.
        pending = self.usage.unseen(reservations) if self.pods_visible else reservations
        for uid in pending:
            reservation = reservations[uid]
            totals[reservation.class_name] = (
                totals.get(reservation.class_name, Fraction(0)) + reservation.charge
            )
        return totals

    def readings(self, quotas: QuotaConfig) -> list[QuotaReading]:
        """Return what each namespace holding GPUs has in use of each class, and its limit.

        Only namespaces that hold pods or reservations appear, so the metric series of a
        namespace go away with its usage.
        """
        namespaces = set(self.usage.namespaces()) | set(self._records)
        readings = []
        for namespace in sorted(namespaces):
            limits = quotas.limits_for(namespace)
            for class_name, used in sorted(self.in_use(namespace).items()):
                limit = limits.get(class_name)
                readings.append(
                    QuotaReading(
                        namespace,
                        class_name,
                        float(used),
                        None if limit is None else float(limit),
                    )
                )
        return readings

    async def prune_all(self) -> None:
        """Prune the record of every namespace that has one, written by any replica."""
        for namespace in await self.store.namespaces():
            await self.prune(namespace)

    async def prune(self, namespace: str) -> None:
        """Drop expired reservations from a namespace's record; delete a record left empty.

        So records exist only while they hold reservations, and a namespace that holds none
        (or never held a pod, as with a forged review) leaves nothing behind.
        """
        async with self._locks[namespace]:
            try:
                record = await self.store.read(namespace)
                kept = self._unexpired(record, self.clock())
                if not kept and record.version is not None:
                    await self.store.delete(namespace, record.version)
                elif len(kept) != len(record.reservations):
                    await self._store(namespace, kept, record.version)
            except Conflict:
                self._records.pop(namespace, None)
                return
        if not kept:
            # Its lock stays: it may have waiters, and locks exist only for real namespaces.
            self._records.pop(namespace, None)


def _unreserved(ask: _Ask, verdict: QuotaVerdict, full: RecordFull) -> QuotaVerdict:
    """Return the verdict of an admission whose batch could not be stored: unchanged if it
    reserved nothing (a dry run, a refusal, a pod left waiting in line); a pod created
    behind the gate waits in line instead, to be charged when the record has room; any
    other is refused. Verdicts judged after the lost reservations counted them: they err
    toward refusing."""
    if not verdict.allowed or verdict.queued or ask.request.dry_run:
        return verdict
    if ask.gated:
        gate = gate_name(ask.config.policy)
        message = f"{full.headline}: the pod waits in line until the record has room"
        return QuotaVerdict(
            True,
            message,
            (f"{message}; the scheduling gate {gate} holds it",),
            limit=verdict.limit,
            queued=True,
        )
    return QuotaVerdict(False, full.detail, limit=verdict.limit)


def _less(totals: Mapping[str, Fraction], reservation: Reservation) -> dict[str, Fraction]:
    """Return what a namespace holds without one reservation counted in it."""
    return {
        **totals,
        reservation.class_name: totals[reservation.class_name] - reservation.charge,
    }


def _never_fits(namespace: str, plan: Plan, limits: Mapping[str, Fraction]) -> QuotaVerdict | None:
    assert plan.class_name is not None
    never = never_fits(
        namespace=namespace, class_name=plan.class_name, requested=plan.charge, limits=limits
    )
    return None if never is None else QuotaVerdict(False, never, limit=limits.get(plan.class_name))


def _reservation_key(request: AdmissionRequest) -> str:
    """Key a reservation by the pod's uid, which the apiserver sets before validation."""
    uid = (request.object.get("metadata") or {}).get("uid")
    return str(uid) if uid else f"request-{request.uid}"
