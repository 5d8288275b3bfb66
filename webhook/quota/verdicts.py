"""What the admission judge answers beside the judgement itself: whether a pod is created
behind the gate, a pod that can never fit, a batch whose record is full, and the key a pod's
reservation is kept under."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from policies import Plan
from policies.quota.judge import QuotaVerdict, never_fits
from policies.quota.quotas import budgets_on, limits_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.line import held_in_line
from webhook.quota.reservations import RecordFull, Reservation
from webhook.reviews.request import AdmissionRequest


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
    never = never_fitting(namespace, plan, terms.limits)
    return never if never is not None else QuotaVerdict(True, queued=True)
