"""Admissions and room set aside (`webhook.quota.allowances`): a pod admitted from this
replica's room without a write, and the verdicts of a pod that would fit but for the room
other replicas hold aside: it waits for them to give it back, and is judged again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

from policies import Plan
from policies.quota.judge import QuotaVerdict, judge
from policies.quota.quotas import Terms
from webhook.quota.allowances import WAIT_SECONDS, ZERO
from webhook.quota.book import ReservationBook
from webhook.quota.reservations import Reservation
from webhook.reviews.request import AdmissionRequest


def admit_from_aside(
    book: ReservationBook, request: AdmissionRequest, plan: Plan, terms: Terms, key: str
) -> QuotaVerdict | None:
    """Admit a pod, its reservation keyed `key`, from the room this replica holds aside in
    its namespace, without a write; None if it holds too little (the pod is then judged
    with a write)."""
    allowances = book.allowances
    namespace = request.namespace
    remaining = allowances.remaining(namespace)
    class_name = plan.class_name
    assert class_name is not None
    again = key in allowances.pending(namespace)  # a retried request: not charged twice
    if not again and remaining.get(class_name, ZERO) < plan.charge:
        return None
    # What the namespace holds but this replica's own room aside: the pod must fit the
    # limits in force now too (a limit may have been lowered since the room was).
    in_use = book.in_use(namespace)
    for name, amount in remaining.items():
        in_use[name] = in_use.get(name, ZERO) - amount
    verdict = judge(
        namespace=namespace,
        class_name=class_name,
        requested=plan.charge,
        in_use=in_use,
        limits=terms.limits,
        mode="enforce",
    )
    if not verdict.allowed:
        return None
    made = Reservation(class_name, plan.charge, book.clock(), request.pod_name)
    if not allowances.grant(namespace, key, made, terms.limits):
        return None
    book.counted_aside()
    return verdict


@dataclass(frozen=True, slots=True)
class Waits(QuotaVerdict):
    """The refusal of an admission that would fit but for room other replicas hold aside:
    it waits for them to give it back, and is judged again."""


def waits(verdict: QuotaVerdict) -> Waits:
    """Return a refusal as one that waits for room other replicas hold aside."""
    return Waits(*_fields(verdict))


def _fields(verdict: QuotaVerdict) -> tuple[Any, ...]:
    return tuple(getattr(verdict, name.name) for name in fields(QuotaVerdict))


def held_aside(verdict: QuotaVerdict) -> QuotaVerdict:
    """Return the refusal of an admission that waited in vain for room other replicas hold
    aside, naming it."""
    return replace(
        QuotaVerdict(*_fields(verdict)),
        message=f"{verdict.message} (of which other gpuadm replicas hold room aside, not "
        f"given back within {WAIT_SECONDS:g} s; retry)",
    )


def would_wait(verdict: QuotaVerdict) -> QuotaVerdict:
    """Return the answer to a dry run that would fit but for room other replicas hold
    aside: admitted, as the create would most likely be once they give it back, with a
    warning that says so. A dry run waits for nothing and says nothing in the record."""
    return QuotaVerdict(
        True,
        warnings=(
            f"{verdict.message}, counting room other gpuadm replicas hold aside: a create "
            f"now would wait up to {WAIT_SECONDS:g} s for them to give it back, and be "
            "admitted if it then fits",
        ),
        in_use=verdict.in_use,
        limit=verdict.limit,
    )


def fits_without(
    request: AdmissionRequest,
    plan: Plan,
    terms: Terms,
    in_use: Mapping[str, Fraction],
    others: Mapping[str, Fraction],
) -> bool:
    """Tell whether a refused admission would fit if other replicas held no room aside."""
    class_name = plan.class_name
    assert class_name is not None
    freed = {name: used - others.get(name, ZERO) for name, used in in_use.items()}
    return judge(
        namespace=request.namespace,
        class_name=class_name,
        requested=plan.charge,
        in_use=freed,
        limits=terms.limits,
        mode=terms.mode,
    ).allowed
