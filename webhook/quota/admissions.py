"""The admission judge: each GPU pod judged against its namespace's quota, exactly, with
admissions that arrive together stored together.

Two rules keep it from over-admitting:

- Within a replica, one namespace's admissions are judged one after another, each against
  what the ones before it reserved, so two requests never both see the same free room.
- Across replicas, the reservation record is written with the version it was read at
  (`ReservationBook.compare_and_swap`): if another replica wrote in between, the judgement
  is redone on the new record. A pod is admitted only after its reservation is stored.

Admissions that arrive while a namespace's record is being written wait, and are then
judged together, in arrival order, and stored with one write: a group commit, as the
apiserver's own ResourceQuota admission batches the admissions waiting on one quota. A
burst of creates in one namespace costs a few writes, not one per pod.

A pod created behind gpuadm's gate joins its namespace's line (`QueueLine.joining`), where a
gang's pods wait for the leader to charge the gang whole; in enforce mode a gang's first pod
is judged for the whole gang (`webhook.quota.gang_room`).

In a cluster, a write for an admission in enforce mode also sets half of the room left
aside for this replica (`webhook.quota.allowances`), and the admissions after it that fit in
that room are judged without a write at all (`webhook.quota.aside`). One that does not fit
only because other replicas hold room aside waits for them to give it back, for
`WAIT_SECONDS` at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from fractions import Fraction

from policies import Plan
from policies.quota.judge import QuotaVerdict, judge, room_to_set_aside
from policies.quota.queue import is_gated, may_gate
from policies.quota.quotas import limits_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.quota.allowances import POLL_SECONDS, WAIT_SECONDS, ZERO
from webhook.quota.aside import (
    Waits,
    admit_from_aside,
    fits_without,
    held_aside,
    waits,
    would_wait,
)
from webhook.quota.book import ReservationBook
from webhook.quota.gang_room import GangSize, judge_member, member_of, sized_on_pods
from webhook.quota.line import Joining, QueueLine
from webhook.quota.namespaces import every_namespace_exists
from webhook.quota.pending import Pending
from webhook.quota.reservations import RecordFull, Reservation
from webhook.quota.rooms import Rooms, priority_of, record_key
from webhook.quota.verdicts import (
    FullRecords,
    batch_failed,
    gate_outside_queue,
    never_fitting,
    reservation_key,
    taken_meanwhile,
    when_full,
    without,
)
from webhook.quota.watermark import NOT_IN_SYNC
from webhook.reviews.request import AdmissionRequest

log = logging.getLogger("gpuadm.quota")


class AdmissionJudge:
    """A `QuotaGate` that judges exactly and charges reservations to the book."""

    def __init__(
        self,
        book: ReservationBook,
        line: QueueLine,
        *,
        usage_ready: Callable[[], bool] = lambda: True,
        namespace_exists: Callable[[str], Awaitable[bool]] = every_namespace_exists,
        gang_size: GangSize = sized_on_pods,
    ) -> None:
        """Judge against `book`, gated pods against `line`. `usage_ready` says whether the
        usage index is in sync; `namespace_exists` whether a namespace is real, so that
        nothing is judged or kept for one that is not; `gang_size` reads a gang's size."""
        self.book = book
        self.line = line
        self.usage_ready = usage_ready
        self.namespace_exists = namespace_exists
        self.gang_size = gang_size
        # Admissions not yet judged, and the task that judges them, per namespace.
        self._pending: defaultdict[str, list[Pending]] = defaultdict(list)
        self._committers: dict[str, asyncio.Task[None]] = {}
        self._full = FullRecords()

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Judge the pod; reserve its charge unless this is a dry run or nothing limits it."""
        namespace = request.namespace
        if plan.class_name is None:
            return None
        terms = config.quotas.terms(namespace)
        limits, mode = terms.limits, terms.mode
        gate = config.policy.quota_gate
        gated = is_gated(request.object, gate)
        if gated and mode != "queue":
            return gate_outside_queue(namespace, gate, mode)
        if not limits_on(plan.class_name, limits):
            return None
        widest = config.quotas.widest_limits_for(namespace)
        if gated and (never := never_fitting(namespace, plan, widest)) is not None:
            return never
        member = None
        if gated or mode == "enforce":  # in line, the leader charges a gang whole
            found = await member_of(request, self.gang_size, plan, widest, in_line=gated)
            if isinstance(found, QuotaVerdict):
                return found
            member = None if gated else found
        if not self.usage_ready():
            return QuotaVerdict(False, NOT_IN_SYNC)
        try:
            exists = await self.namespace_exists(namespace)
        except KubeError as error:
            log.warning("cannot check that namespace %s exists: %s", namespace, error)
            return QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
        if not exists:
            return QuotaVerdict(False, f'namespace "{namespace}" does not exist')
        key, cohort = record_key(config.quotas, namespace)
        # A cohort's record sets no room aside: each admission's judgement needs what
        # every member holds at once.
        if mode == "enforce" and not request.dry_run and member is None and cohort is None:
            granted = admit_from_aside(self.book, request, plan, terms, reservation_key(request))
            if granted is not None:
                return granted
        pending = Pending(request, plan, config, terms, gated, member, cohort)
        self._pending[key].append(pending)
        if key not in self._committers:
            task = asyncio.create_task(self._commit(key), name=f"quota-{key}")
            self._committers[key] = task
        verdict = await pending.verdict
        if verdict.exceeded and mode == "queue" and may_gate(request.object):
            return taken_meanwhile(verdict)
        return verdict

    async def _commit(self, namespace: str) -> None:
        """Judge and store the namespace's pending admissions, a batch at a time, until none."""
        try:
            while batch := self._pending.pop(namespace, []):
                async with self.book.lock(namespace):
                    waiting = await self._commit_batch(namespace, batch)
                if waiting:  # judged again, first, once the record may have changed
                    await asyncio.sleep(POLL_SECONDS)
                    self.book.forget_copy(namespace)
                    self._pending[namespace][:0] = waiting
        finally:
            del self._committers[namespace]

    async def _commit_batch(self, namespace: str, batch: list[Pending]) -> list[Pending]:
        """Judge and store a batch; return the admissions that wait for room other
        replicas hold aside (their verdicts are not given yet)."""
        waiting: list[Pending] = []
        try:
            verdicts = await self.book.compare_and_swap(
                namespace, lambda: self._judge_and_store(namespace, batch)
            )
            deadline = time.monotonic() - WAIT_SECONDS
            for pending, verdict in zip(batch, verdicts, strict=True):
                if isinstance(verdict, Waits) and pending.since > deadline:
                    waiting.append(pending)
                elif isinstance(verdict, Waits):
                    pending.verdict.set_result(held_aside(verdict))
                else:
                    pending.verdict.set_result(verdict)
        except Exception as error:  # each waiting request fails as it would have alone
            failed = batch_failed(namespace, error)
            for pending in batch:
                if pending.verdict.done():
                    continue
                if failed is None:
                    pending.verdict.set_exception(error)
                else:
                    pending.verdict.set_result(failed)
        return waiting

    async def _judge_and_store(self, key: str, batch: list[Pending]) -> list[QuotaVerdict]:
        """Judge each admission in order against the record and those before it; store once.

        This replica's room aside goes back to the namespace first, so that the batch may
        use it; with allowances, what is left after the batch is set aside anew. An
        admission that does not fit only because of other replicas' room aside is judged
        `Waits`."""
        book = self.book
        record = await book.read_copy(key)
        await book.watermark.catch_up(key, record)
        # Nothing awaits from here to the write (or to `restore`): no pod is admitted from
        # the room meanwhile.
        aside = book.allowances.release(key)
        now = book.clock()
        reservations = book.unexpired(key, record, now)
        others = book.allowances.others(record.allowances, now)
        verdicts = []
        reserved = False
        gated = any(pending.gated for pending in batch)
        joinings: dict[str, Joining] = {}
        # What each namespace of the record holds, summed once a batch and kept up to date
        # as it admits: summing it again for each admission cost a pass over every
        # reservation of the last 90 s, each time.
        rooms = Rooms(book, key, batch[-1].cohort, reservations, record.allowances)
        taking: dict[str, Fraction] = {}
        for pending in batch:
            class_name = pending.plan.class_name
            assert class_name is not None
            namespace = pending.request.namespace
            joining = joinings.get(namespace) or joinings.setdefault(
                namespace, self.line.joining(namespace, reservations, gated=gated)
            )
            totals = rooms.of(namespace)
            limits = rooms.limits(namespace, pending.terms.limits)
            uid = reservation_key(pending.request)
            grown = ZERO
            # A pod judged again (a retried request) is not counted against itself.
            own = reservations.get(uid)
            counted = own is not None and self.book.counts(uid, own)
            in_use = without(totals, own) if own is not None and counted else totals
            if pending.gated:
                verdict = joining.judge(
                    pending.request,
                    pending.plan,
                    uid,
                    in_use,
                    limits,
                    pending.config.policy.quota_gate,
                )
            elif (
                whole := judge_member(
                    book,
                    namespace,
                    pending.member,
                    pending.terms._replace(limits=limits),
                    pending.plan,
                    in_use,
                    reservations,
                    retried=own is not None,
                    dry_run=pending.request.dry_run,
                    record=key,
                )
            ) is not None:
                verdict, grown = whole  # a gang's first pod, or one its room was set aside for
            else:
                verdict = judge(
                    namespace=namespace,
                    class_name=class_name,
                    requested=pending.plan.charge,
                    in_use=in_use,
                    limits=limits,
                    mode=pending.terms.mode,
                )
                # Only a refusal waits (warn mode admits past the limit anyway), and not a
                # dry run, which charges nothing and would write that it waits: it is told
                # what a create would meet.
                dry_run = pending.request.dry_run
                held_back = (
                    not verdict.allowed
                    and others
                    and fits_without(pending.request, pending.plan, pending.terms, in_use, others)
                )
                if held_back and dry_run:  # what a create would meet: a wait, then room
                    verdict = would_wait(verdict)
                elif held_back:
                    verdict = waits(verdict)
                elif pending.terms.mode == "enforce" and not dry_run:
                    # The most one admission of the class asked for: room aside smaller
                    # than that would only keep such pods from the other replicas.
                    taking[class_name] = max(taking.get(class_name, ZERO), pending.plan.charge)
            verdict = rooms.told(verdict, namespace, class_name, pending.plan.charge, in_use)
            if pending.terms.mode == "enforce" and not pending.request.dry_run:
                reserved |= rooms.claim(
                    verdict,
                    namespace,
                    class_name,
                    pending.plan.charge,
                    priority_of(pending.request.object),
                    reservations,
                    now,
                )
            verdicts.append(verdict)
            if verdict.allowed and not verdict.queued and not pending.request.dry_run:
                made = Reservation(
                    class_name,
                    pending.plan.charge,
                    now,
                    pending.request.pod_name,
                    namespace=namespace if key != namespace else "",
                )
                reservations[uid] = made
                joining.charged(uid)
                reserved = True
                if self.book.counts(uid, made):  # it replaces the one `in_use` left out
                    totals = {
                        **in_use,
                        class_name: in_use.get(class_name, Fraction(0)) + pending.plan.charge,
                    }
            # The gang's room, set aside or taken from in the same write: after the pod's
            # own charge, which is counted from `in_use` (the total before this pod).
            if grown and not pending.request.dry_run:
                totals = {**totals, class_name: totals.get(class_name, ZERO) + grown}
                reserved = True
            rooms.set(namespace, totals)
        # A pod that waits for room others hold says so in the record, and then no replica
        # sets room aside until it is judged again: what they give back stays free for it.
        allowances = book.allowances
        waiting = any(isinstance(verdict, Waits) for verdict in verdicts)
        tell = allowances.wait(key, now + WAIT_SECONDS) if waiting else False
        if not waiting:
            allowances.waited(key)
        may_take = allowances.enabled and not waiting
        if may_take and allowances.others_wait(record.allowances, now):
            may_take = False
        terms = batch[-1].terms
        if terms.mode != "enforce" or rooms.cohort is not None:
            may_take = False
        take = room_to_set_aside(taking, rooms.of(key), terms.limits) if may_take else {}
        if reserved or take or tell:
            try:
                await book.write(key, reservations, record, take, terms.limits)
            except RecordFull as full:  # nothing was written; the oldest expire within 90 s
                self._full.log(key, full, self.book.clock())
                return [
                    when_full(
                        pending.request,
                        pending.gated,
                        pending.config.policy.quota_gate,
                        verdict,
                        full,
                    )
                    for pending, verdict in zip(batch, verdicts, strict=True)
                ]
        else:  # dry runs and refusals only: the room aside serves on
            book.allowances.restore(key, aside)
        return verdicts
