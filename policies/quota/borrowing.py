"""What a cohort member's pod is told: that it borrows, or why it does not fit its cohort.

A member is judged as any namespace is (`policies.quota.judge`), against its limits of the
moment (`Cohort.limits_now`); this says what those limits came from.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from policies.quantity import format_amount
from policies.quota.cohorts import ZERO, Cohort, Usage
from policies.quota.judge import QuotaVerdict

BORROWED = "gpuadm.io/borrowed"
"""The label (value "true") and annotation (what it borrows) of a pod that holds more than
its namespace's nominal quota."""


def borrowing_note(cohort: Cohort, namespace: str, class_name: str, amount: Fraction) -> str:
    """Return the annotation of a pod that borrows `amount` of a class from its cohort."""
    return f"{format_amount(amount)} {class_name} from cohort {cohort.name}"


def told(
    verdict: QuotaVerdict,
    cohort: Cohort,
    namespace: str,
    class_name: str,
    charge: Fraction,
    usage: Usage,
) -> QuotaVerdict:
    """Return `verdict` of a member's pod of `charge`, judged with `usage` as it was before
    the pod, telling what it borrows, or what of the cohort it did not fit."""
    member = cohort.members[namespace]
    if not member.shares(class_name):
        return verdict
    nominal = member.nominal[class_name]
    used = usage.get(namespace, {}).get(class_name, ZERO)
    shown = format_amount
    if verdict.allowed and not verdict.queued and not verdict.would_deny:
        borrowed = cohort.borrowed(namespace, class_name, used + charge)
        if not borrowed:
            return verdict
        warning = (
            f'namespace "{namespace}": this pod borrows {shown(min(borrowed, charge))} '
            f"{class_name} from cohort {cohort.name} ({shown(used + charge)} in use, nominal "
            f"quota {shown(nominal)}): it may be evicted when a lender needs its quota back"
        )
        return replace(verdict, warnings=(*verdict.warnings, warning))
    if class_name not in verdict.exceeded or verdict.message is None:
        return verdict
    idle = cohort.reach(namespace, class_name, usage) - used
    if used + charge <= nominal:
        need = cohort.needs_back(namespace, class_name, charge, usage)
        why = (
            f"within its nominal quota of {shown(nominal)}, but borrowers in cohort "
            f"{cohort.name} hold {shown(need)} of the room it lends"
        )
        if member.reclaim == "never":
            why += " (reclaim: never: it comes back as their pods end)"
        else:
            why += (
                f" (reclaim: {member.reclaim}: gpuadm evicts borrowed pods of lower "
                "priority to return it; retry)"
                if member.reclaim == "lowerPriority"
                else " (reclaim: any: gpuadm evicts borrowed pods to return it; retry)"
            )
    else:
        ceiling = member.ceiling(class_name)
        may = "no bound of its own" if ceiling is None else f"up to {shown(ceiling)}"
        why = (
            f"nominal quota {shown(nominal)}, borrowing {may}; cohort {cohort.name} has "
            f"{shown(max(ZERO, idle))} idle for it"
        )
    return replace(verdict, message=f"{verdict.message} ({why})")
