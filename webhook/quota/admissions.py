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

A pod created behind gpuadm's gate joins its namespace's line (`QueueLine.joining`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from policies import Plan
from policies.judge import QuotaVerdict, judge, never_fits
from policies.queue import is_gated, may_gate
from policies.quotas import Terms, budgets_on, limits_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.quota.book import NOT_IN_SYNC, NotInSync, RecordBusy, ReservationBook
from webhook.quota.line import QueueLine, held_in_line
from webhook.quota.namespaces import every_namespace_exists
from webhook.quota.reservations import RecordFull, Reservation
from webhook.reviews.request import AdmissionRequest

log = logging.getLogger("gpuadm.quota")

# While a namespace's record is full, each batch of its admissions finds it so: log it this
# often at most.
FULL_LOG_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class _Pending:
    """One admission waiting to be judged with the others of its namespace."""

    request: AdmissionRequest
    plan: Plan
    config: ConfigSnapshot
    # The namespace's limits and mode, looked up once for the admission.
    terms: Terms
    # Created behind gpuadm's gate: charged now if it is first in line and fits, else left
    # waiting in line, uncharged.
    gated: bool
    verdict: asyncio.Future[QuotaVerdict] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AdmissionJudge:
    """A `QuotaGate` that judges exactly and charges reservations to the book."""

    def __init__(
        self,
        book: ReservationBook,
        line: QueueLine,
        *,
        usage_ready: Callable[[], bool] = lambda: True,
        namespace_exists: Callable[[str], Awaitable[bool]] = every_namespace_exists,
    ) -> None:
        """Judge against `book`, gated pods against `line`. `usage_ready` says whether the
        usage index is in sync; `namespace_exists` whether a namespace is real, so that
        nothing is judged or kept for one that is not."""
        self.book = book
        self.line = line
        self.usage_ready = usage_ready
        self.namespace_exists = namespace_exists
        # Admissions not yet judged, and the task that judges them, per namespace.
        self._pending: defaultdict[str, list[_Pending]] = defaultdict(list)
        self._committers: dict[str, asyncio.Task[None]] = {}
        self._full_logged: dict[str, float] = {}

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
            return QuotaVerdict(False, NOT_IN_SYNC)
        try:
            exists = await self.namespace_exists(namespace)
        except KubeError as error:
            log.warning("cannot check that namespace %s exists: %s", namespace, error)
            return QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
        if not exists:
            return QuotaVerdict(False, f'namespace "{namespace}" does not exist')
        pending = _Pending(request, plan, config, terms, gated)
        self._pending[namespace].append(pending)
        if namespace not in self._committers:
            task = asyncio.create_task(self._commit(namespace), name=f"quota-{namespace}")
            self._committers[namespace] = task
        verdict = await pending.verdict
        if verdict.exceeded and mode == "queue" and may_gate(request.object):
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
        """In a queue namespace, give every pod a limit or a GPU-hour budget applies to
        gpuadm's gate at creation.

        The validating judgement then either charges it at once (the gate is removed by the
        leader within moments) or leaves it waiting in line, uncharged. So a burst of creates
        is never refused for lack of room, and waits in order. A pod that could never fit is
        refused (`allowed` False); None means no gate.
        """
        class_name = plan.class_name
        if class_name is None:
            return None
        terms = config.quotas.terms(namespace)
        if terms.mode != "queue":
            return None
        if not (limits_on(class_name, terms.limits) or budgets_on(class_name, terms.budgets)):
            return None
        never = _never_fits(namespace, plan, terms.limits)
        return never if never is not None else QuotaVerdict(True, queued=True)

    async def _commit(self, namespace: str) -> None:
        """Judge and store the namespace's pending admissions, a batch at a time, until none."""
        try:
            while batch := self._pending.pop(namespace, []):
                async with self.book.lock(namespace):
                    await self._commit_batch(namespace, batch)
        finally:
            del self._committers[namespace]

    async def _commit_batch(self, namespace: str, batch: list[_Pending]) -> None:
        try:
            verdicts = await self.book.compare_and_swap(
                namespace, lambda: self._judge_and_store(namespace, batch)
            )
            for pending, verdict in zip(batch, verdicts, strict=True):
                pending.verdict.set_result(verdict)
        except RecordBusy as busy:
            for pending in batch:
                pending.verdict.set_result(QuotaVerdict(False, f"{busy.detail}; retry the request"))
        except NotInSync as behind:  # its watch lags: judged late or not at all, never short
            log.warning("%s", behind.detail)
            for pending in batch:
                pending.verdict.set_result(QuotaVerdict(False, NOT_IN_SYNC))
        except KubeError as error:  # the apiserver is unreachable or refused: no fault of ours
            log.warning("cannot store the quota record of namespace %s: %s", namespace, error)
            unreachable = QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
            for pending in batch:
                if not pending.verdict.done():
                    pending.verdict.set_result(unreachable)
        except Exception as error:  # each waiting request fails as it would have alone
            for pending in batch:
                if not pending.verdict.done():
                    pending.verdict.set_exception(error)

    async def _judge_and_store(self, namespace: str, batch: list[_Pending]) -> list[QuotaVerdict]:
        """Judge each admission in order against the record and those before it; store once."""
        record = await self.book.read_copy(namespace)
        await self.book.catch_up(namespace, record)
        now = self.book.clock()
        reservations = self.book.unexpired(record, now)
        verdicts = []
        reserved = False
        joining = self.line.joining(
            namespace, reservations, gated=any(pending.gated for pending in batch)
        )
        # What the namespace holds, summed once a batch and kept up to date as it admits:
        # summing it again for each admission cost a pass over every reservation of the
        # last 90 s, each time.
        totals = self.book.in_use(namespace, reservations)
        for pending in batch:
            class_name = pending.plan.class_name
            assert class_name is not None
            key = _reservation_key(pending.request)
            # A pod judged again (a retried request) is not counted against itself.
            own = reservations.get(key)
            counted = own is not None and self.book.counts(key, own)
            in_use = _without(totals, own) if own is not None and counted else totals
            if pending.gated:
                verdict = joining.judge(
                    pending.request,
                    pending.plan,
                    key,
                    in_use,
                    pending.terms.limits,
                    pending.config.policy.quota_gate,
                )
            else:
                verdict = judge(
                    namespace=namespace,
                    class_name=class_name,
                    requested=pending.plan.charge,
                    in_use=in_use,
                    limits=pending.terms.limits,
                    mode=pending.terms.mode,
                )
            verdicts.append(verdict)
            if verdict.allowed and not verdict.queued and not pending.request.dry_run:
                made = Reservation(class_name, pending.plan.charge, now, pending.request.pod_name)
                reservations[key] = made
                joining.charged(key)
                reserved = True
                if self.book.counts(key, made):  # it replaces the one `in_use` left out
                    totals = {
                        **in_use,
                        class_name: in_use.get(class_name, Fraction(0)) + pending.plan.charge,
                    }
        if reserved:
            try:
                await self.book.write(namespace, reservations, record)
            except RecordFull as full:  # nothing was written; the oldest expire within 90 s
                self._log_full(namespace, full)
                return [
                    _when_full(pending, verdict, full)
                    for pending, verdict in zip(batch, verdicts, strict=True)
                ]
        return verdicts

    def _log_full(self, namespace: str, full: RecordFull) -> None:
        """Log a full record once a minute at most: every batch meets it until it empties."""
        now = self.book.clock()
        if now - self._full_logged.get(namespace, float("-inf")) >= FULL_LOG_SECONDS:
            self._full_logged[namespace] = now
            log.warning("%s", full.detail)


def _when_full(pending: _Pending, verdict: QuotaVerdict, full: RecordFull) -> QuotaVerdict:
    """Return the verdict of an admission whose batch could not be stored: unchanged if it
    reserved nothing (a dry run, a refusal, a pod left waiting in line); a pod created
    behind the gate waits in line instead, to be charged when the record has room; any
    other is refused. Verdicts judged after the lost reservations counted them: they err
    toward refusing."""
    if not verdict.allowed or verdict.queued or pending.request.dry_run:
        return verdict
    if pending.gated:
        message = f"{full.headline}: the pod waits in line until the record has room"
        return held_in_line(message, pending.config.policy.quota_gate, verdict.limit)
    return QuotaVerdict(False, full.detail, limit=verdict.limit)


def _without(totals: Mapping[str, Fraction], reservation: Reservation) -> dict[str, Fraction]:
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
