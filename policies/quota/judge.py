"""Quota judgement: may a namespace take this much more of a class, given what it holds?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from policies.quantity import format_amount
from policies.quota.quotas import ALL_CLASSES, Mode

# Above this share of a limit, an admitted pod carries a warning that the quota is nearly used.
NEARLY_FULL = Fraction(9, 10)


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    """The outcome of a quota check, with what a denial or an audit record must show."""

    allowed: bool
    message: str | None = None
    warnings: tuple[str, ...] = ()
    in_use: Fraction = Fraction(0)
    limit: Fraction | None = None
    would_deny: bool = False
    # Held behind gpuadm's scheduling gate (queue mode): allowed, charged only when released.
    queued: bool = False
    # The limits the request did not fit ("*" for the cap across classes).
    exceeded: tuple[str, ...] = ()


def judge(
    *,
    namespace: str,
    class_name: str,
    requested: Fraction,
    in_use: Mapping[str, Fraction],
    limits: Mapping[str, Fraction],
    mode: Mode = "enforce",
) -> QuotaVerdict:
    """Judge a request of `requested` GPUs of `class_name` against the namespace's limits.

    `in_use` maps each class to the GPUs the namespace already holds (pods and reservations).
    A class without a limit is unlimited, as in a native ResourceQuota; a limit of 0 forbids.
    `*` caps the sum over all classes. In `warn` mode an excess is admitted with a warning,
    and `would_deny` records what `enforce` would have done. `queue` judges as `enforce`
    does; the caller holds a pod that does not fit instead of refusing it.
    """
    class_used = in_use.get(class_name, Fraction(0))
    checks = []
    if class_name in limits:
        checks.append((class_name, class_name, class_used, limits[class_name]))
    if ALL_CLASSES in limits:
        total = sum(in_use.values(), Fraction(0))
        checks.append((ALL_CLASSES, _ALL_LABEL, total, limits[ALL_CLASSES]))
    warnings = []
    for key, label, used, limit in checks:
        if used + requested > limit:
            message = (
                f'namespace "{namespace}": {label} quota exceeded: requested '
                f"{format_amount(requested)}, in use {format_amount(used)} of "
                f"{format_amount(limit)}"
            )
            if mode != "warn":
                return QuotaVerdict(False, message, (), used, limit, exceeded=(key,))
            return QuotaVerdict(
                True,
                message,
                (f"{message} (quota mode is warn: admitted, but enforce would deny)",),
                used,
                limit,
                would_deny=True,
                exceeded=(key,),
            )
        if limit and (used + requested) / limit > NEARLY_FULL:
            percent = int((used + requested) * 100 / limit)
            warnings.append(
                f'namespace "{namespace}": {label} quota is {percent}% used after this pod '
                f"({format_amount(used + requested)} of {format_amount(limit)})"
            )
    limit_of_class = limits.get(class_name)
    return QuotaVerdict(True, None, tuple(warnings), class_used, limit_of_class)


_ALL_LABEL = f'all classes ("{ALL_CLASSES}")'


def room_to_set_aside(
    largest: Mapping[str, Fraction],
    in_use: Mapping[str, Fraction],
    limits: Mapping[str, Fraction],
) -> dict[str, Fraction]:
    """Return the room a replica may set aside to admit from without a write, after it
    admitted pods into `in_use`: for each class of `largest` (the largest pod of it asked
    for), half of what is free of the class and of the cap over all classes, if that half
    holds such a pod. Each class's half comes out of the cap before the next class's. A
    class no limit counts has nothing to set aside."""
    cap = limits.get(ALL_CLASSES)
    free_all = None if cap is None else cap - sum(in_use.values(), Fraction(0))
    room = {}
    for class_name, pod in largest.items():
        free = [] if free_all is None else [free_all]
        if class_name in limits:
            free.append(limits[class_name] - in_use.get(class_name, Fraction(0)))
        if not free or pod <= 0:
            continue
        half = min(free) / 2
        if half >= pod:
            room[class_name] = half
            if free_all is not None:
                free_all -= half
    return room


def never_fits(
    *, namespace: str, class_name: str, requested: Fraction, limits: Mapping[str, Fraction]
) -> str | None:
    """Say why a request can never fit its namespace's limits, however much is freed; or None.

    In queue mode such a pod is refused at once rather than left waiting for ever.
    """
    for key, label in ((class_name, class_name), (ALL_CLASSES, _ALL_LABEL)):
        limit = limits.get(key)
        if limit is not None and requested > limit:
            return (
                f'namespace "{namespace}": {label} quota exceeded: requested '
                f"{format_amount(requested)}, more than the whole limit of "
                f"{format_amount(limit)}, so the pod could never run"
            )
    return None


def joined(verdict: QuotaVerdict | None, budget: QuotaVerdict | None) -> QuotaVerdict | None:
    """Join an admitted pod's quota verdict and its GPU-hour budget's (None: nothing
    judged): the warnings of both, and what `enforce` would have done to either (warn
    mode)."""
    if budget is None:
        return verdict
    if verdict is None:
        return budget
    return replace(
        verdict,
        message=verdict.message or budget.message,
        warnings=(*verdict.warnings, *budget.warnings),
        would_deny=verdict.would_deny or budget.would_deny,
        exceeded=(*verdict.exceeded, *budget.exceeded),
    )


def judge_gang(
    *,
    namespace: str,
    gang: str,
    size: int,
    requested: Fraction,
    in_use: Mapping[str, Fraction],
    limits: Mapping[str, Fraction],
    class_name: str,
) -> QuotaVerdict:
    """Judge the first pod of a gang of `size` pods of `requested` each (enforce mode): it
    is admitted only if the whole gang fits at once, so that no part of a gang holds GPUs it
    cannot use. `gang` names the gang in the message."""
    whole = requested * size
    verdict = judge(
        namespace=namespace,
        class_name=class_name,
        requested=whole,
        in_use=in_use,
        limits=limits,
    )
    if verdict.allowed:
        return verdict
    key = verdict.exceeded[0]
    label = key if key != ALL_CLASSES else _ALL_LABEL
    return replace(
        verdict,
        message=(
            f'namespace "{namespace}": {label} quota exceeded: the {gang} needs '
            f"{format_amount(whole)} at once ({size} pods of {format_amount(requested)}), in "
            f"use {format_amount(verdict.in_use)} of {format_amount(verdict.limit or 0)}: its "
            "first pod is refused, so that no part of the gang holds GPUs it cannot use; "
            "retry when there is room for all of it"
        ),
    )
