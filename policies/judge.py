"""Quota judgement: may a namespace take this much more of a class, given what it holds?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from policies.quantity import format_amount
from policies.quotas import ALL_CLASSES

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


def judge(
    *,
    namespace: str,
    class_name: str,
    requested: Fraction,
    in_use: Mapping[str, Fraction],
    limits: Mapping[str, Fraction],
    mode: Literal["enforce", "warn"] = "enforce",
) -> QuotaVerdict:
    """Judge a request of `requested` GPUs of `class_name` against the namespace's limits.

    `in_use` maps each class to the GPUs the namespace already holds (pods and reservations).
    A class without a limit is unlimited, as in a native ResourceQuota; a limit of 0 forbids.
    `*` caps the sum over all classes. In `warn` mode an excess is admitted with a warning,
    and `would_deny` records what `enforce` would have done.
    """
    class_used = in_use.get(class_name, Fraction(0))
    checks = []
    if class_name in limits:
        checks.append((class_name, class_used, limits[class_name]))
    if ALL_CLASSES in limits:
        total = sum(in_use.values(), Fraction(0))
        checks.append((f'all classes ("{ALL_CLASSES}")', total, limits[ALL_CLASSES]))
    warnings = []
    for label, used, limit in checks:
        if used + requested > limit:
            message = (
                f'namespace "{namespace}": {label} quota exceeded: requested '
                f"{format_amount(requested)}, in use {format_amount(used)} of "
                f"{format_amount(limit)}"
            )
            if mode == "enforce":
                return QuotaVerdict(False, message, (), used, limit)
            return QuotaVerdict(
                True,
                message,
                (f"{message} (quota mode is warn: admitted, but enforce would deny)",),
                used,
                limit,
                would_deny=True,
            )
        if limit and (used + requested) / limit > NEARLY_FULL:
            percent = int((used + requested) * 100 / limit)
            warnings.append(
                f'namespace "{namespace}": {label} quota is {percent}% used after this pod '
                f"({format_amount(used + requested)} of {format_amount(limit)})"
            )
    limit_of_class = limits.get(class_name)
    return QuotaVerdict(True, None, tuple(warnings), class_used, limit_of_class)
