"""What the admission judge answers beside the judgement itself: whether a pod is created
behind the gate, a pod that can never fit, a batch whose record is full, and the key a pod's
reservation is kept under."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from fractions import Fraction

from policies import Plan
from policies.quota.cohorts import record_of
from policies.quota.judge import QuotaVerdict, never_fits
from policies.quota.quotas import budgets_on, limits_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.quota.book import RecordBusy
from webhook.quota.line import held_in_line
from webhook.quota.reservations import RecordFull, Reservation, UnreadableRecord
from webhook.quota.watermark import NOT_IN_SYNC, NotInSync
from webhook.reviews.request import AdmissionRequest

log = logging.getLogger("gpuadm.quota")


def when_full(
    request: AdmissionRequest,
    gated: bool,
    gate: str,
    verdict: QuotaVerdict,
    full: RecordFull,
) -> QuotaVerdict:
    """Return the verdict of an admission whose batch could not be stored: unchanged if it
    reserved nothing (a dry run, a refusal, a pod left waiting in line); a pod created
    behind the `gate` (`gated`) waits in line instead, to be charged when the record has
    room; any other is refused. Verdicts judged after the lost reservations counted them:
    they err toward refusing."""
    if not verdict.allowed or verdict.queued or request.dry_run:
        return verdict
    if gated:
        message = f"{full.headline}: the pod waits in line until the record has room"
        return held_in_line(message, gate, verdict.limit)
    return QuotaVerdict(False, full.detail, limit=verdict.limit)


def without(totals: Mapping[str, Fraction], reservation: Reservation) -> dict[str, Fraction]:
    """Return what a namespace holds without one reservation counted in it."""
    return {
        **totals,
        reservation.class_name: totals[reservation.class_name] - reservation.charge,
    }


def never_fitting(
    namespace: str, plan: Plan, limits: Mapping[str, Fraction]
) -> QuotaVerdict | None:
    """Return the refusal of a pod that can never fit its namespace's limits; or None."""
    assert plan.class_name is not None
    never = never_fits(
        namespace=namespace, class_name=plan.class_name, requested=plan.charge, limits=limits
    )
    return None if never is None else QuotaVerdict(False, never, limit=limits.get(plan.class_name))


def reservation_key(request: AdmissionRequest) -> str:
    """Key a reservation by the pod's uid, which the apiserver sets before validation."""
    uid = (request.object.get("metadata") or {}).get("uid")
    return str(uid) if uid else f"request-{request.uid}"


def gate_verdict(namespace: str, plan: Plan, config: ConfigSnapshot) -> QuotaVerdict | None:
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
    never = never_fitting(namespace, plan, config.quotas.widest_limits_for(namespace))
    return never if never is not None else QuotaVerdict(True, queued=True)


def gate_outside_queue(namespace: str, gate: str, mode: str) -> QuotaVerdict:
    """Refuse a pod created with gpuadm's gate outside a queue namespace: waiting in line is
    for queue namespaces, and a pod that brought the gate itself elsewhere would be admitted
    uncharged and released later, past `enforce`."""
    return QuotaVerdict(
        False,
        f"the scheduling gate {gate} is gpuadm's: it holds pods in line only in "
        f'namespaces whose GPU quota mode is queue, and namespace "{namespace}" is in '
        f"{mode} mode: create the pod without it",
    )


def taken_meanwhile(verdict: QuotaVerdict) -> QuotaVerdict:
    """Refuse a pod of a queue namespace whose room went to another pod while it was being
    created: the gate that would have held it can only be given at creation. (A pod bound to
    a node at creation can have no gate: it is told what enforce mode says.)"""
    return QuotaVerdict(
        False,
        f"{verdict.message}; it was taken by another pod while this one was being "
        "created: create the pod again, and it waits in line",
        in_use=verdict.in_use,
        limit=verdict.limit,
        exceeded=verdict.exceeded,
    )


# While a namespace's record is full, each batch of its admissions finds it so: log it this
# often at most.
FULL_LOG_SECONDS = 60.0


class FullRecords:
    """Logs a full record once a minute at most: every batch meets it until it empties."""

    def __init__(self) -> None:
        self._logged: dict[str, float] = {}

    def log(self, namespace: str, full: RecordFull, now: float) -> None:
        """Log that a namespace's record is full, unless it was logged lately."""
        if now - self._logged.get(namespace, float("-inf")) >= FULL_LOG_SECONDS:
            self._logged[namespace] = now
            log.warning("%s", full.detail)


def batch_failed(key: str, error: Exception) -> QuotaVerdict | None:
    """Return the verdict of every admission of a batch whose record could not be stored
    for `error`, and log it; None for an error no admission is refused for by name (it is
    raised to each request, as it would have been alone)."""
    if isinstance(error, RecordBusy):
        return QuotaVerdict(False, f"{error.detail}; retry the request")
    if isinstance(error, UnreadableRecord):  # a later version's, or not gpuadm's: hands off
        log.error("%s", error.detail)
        return QuotaVerdict(False, f"{error.detail}; retry")
    if isinstance(error, NotInSync):  # its watch lags: judged late or not at all, never short
        log.warning("%s", error.detail)
        return QuotaVerdict(False, NOT_IN_SYNC)
    if isinstance(error, KubeError):  # the apiserver is unreachable or refused: not ours
        log.warning("cannot store the quota record of %s: %s", record_of(key), error)
        return QuotaVerdict(False, f"gpuadm cannot reach the apiserver ({error}); retry")
    return None
