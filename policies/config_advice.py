"""What a valid quota config may not do as its author meant, read beside the policy: a limit
no pod of its class fits under, and a GPU-hour budget its namespace's limits never let it
spend. Each is a warning with the key it is about, for `gpuadm check-config`."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from fractions import Fraction

from policies.classes.asks import MemoryShare, Share
from policies.classes.class_base import ClassBase
from policies.errors import Denial
from policies.policy import Policy
from policies.quantity import format_amount
from policies.quota.budget import Budget, amount_in, duration
from policies.quota.quotas import ALL_CLASSES, BUDGET_KEY, QuotaConfig

Path = tuple[str, ...]
# The asks that find a class's smallest charge: the stacks round a share down to their
# units, never to nothing, so a tiny share costs the least the class grants.
_TINY_ASKS = (Share(Fraction(1, 10**6)), MemoryShare(Fraction(2**20)))


def quota_warnings(quotas: QuotaConfig, policy: Policy) -> list[tuple[Path, str]]:
    """Return (path of the key, warning) for each limit under its class's smallest charge
    and each budget its limits make unreachable, in `default` and every namespace."""
    warnings: list[tuple[Path, str]] = []
    for where, limits, budgets in _entries(quotas):
        for class_name, limit in limits.items():
            gpu_class = policy.classes.get(class_name)
            if class_name == ALL_CLASSES or gpu_class is None or limit == 0:
                continue
            least = smallest_charge(gpu_class)
            if limit < least:
                warnings.append(((*where, class_name), _too_small(class_name, limit, least)))
        for key, budget in budgets.items():
            caps = [limits[k] for k in (key, ALL_CLASSES) if k in limits]
            if caps and budget.gpu_seconds > min(caps) * budget.window:
                warnings.append(((*where, BUDGET_KEY, key), _unreachable(budget, min(caps))))
    return warnings


def smallest_charge(gpu_class: ClassBase) -> Fraction:
    """Return the least a pod of the class can be charged: a whole GPU for a class that
    gives whole GPUs only, else what its stack grants for the smallest share."""
    charges = []
    if gpu_class.shareable:
        for ask in _TINY_ASKS:
            try:
                charges.append(gpu_class.grant(ask).charge)
            except Denial:
                continue
    return min(charges, default=Fraction(1))


def _entries(
    quotas: QuotaConfig,
) -> Iterator[tuple[Path, Mapping[str, Fraction], Mapping[str, Budget]]]:
    yield ("default",), quotas.default, quotas.default_budget
    for namespace, entry in quotas.namespaces.items():
        yield ("namespaces", namespace), entry.limits, entry.budget


def _too_small(class_name: str, limit: Fraction, least: Fraction) -> str:
    whole = "the class gives whole GPUs only" if least == 1 else "its smallest share"
    # The least limit as a quantity can be written: in thousandths, rounded up.
    writable = Fraction(math.ceil(least * 1000), 1000)
    return (
        f"{format_amount(limit)} is less than the least a pod of "
        f"class {class_name} is charged ({format_amount(least)}: {whole}), so it admits no "
        f"pod; write 0 to forbid the class, or at least {format_amount(writable)}"
    )


def _unreachable(budget: Budget, cap: Fraction) -> str:
    most = cap * budget.window
    return (
        f"{budget} can never be spent: a limit of {format_amount(cap)} "
        f"GPU{'s' if cap != 1 else ''} holds at most {amount_in(most, budget.unit)} in "
        f"{duration(budget.window)}; lower the budget, or raise the limit"
    )
