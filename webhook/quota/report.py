"""What a namespace holds, has reserved and waits for, per class: the one count behind
`gpuadm quota` and the GPUQuota objects tenants read, made the way the ledger judges.

- in use: the GPU pods the watch (or a list) shows, charged from their resources;
- reserved: pods admitted or released whose reservation is in the record but that are not
  shown as pods yet;
- waiting: the pods held in line by gpuadm's scheduling gate, in the order they go;
- the GPU-hour budget, when the namespace has one for the class (or `*`), and what was used
  of it in its window, as the caller counts it (the report is handed numbers: the quota room
  knows nothing of the GPU-hour records).

The ledger judges against in use plus reserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from policies.quantity import format_amount
from policies.quota.budget import Budget
from policies.quota.cohorts import Cohort
from policies.quota.queue import Waiting, in_line_order
from policies.quota.quotas import ALL_CLASSES, QuotaConfig
from webhook.quota.holdings import Holding
from webhook.quota.reservations import Reservation

# The pods a report names, at most, per class: enough to see who holds a quota, small enough
# for an object a tenant reads with kubectl (the counts stay exact).
NAMED_PODS_MAX = 100


@dataclass(frozen=True, slots=True)
class ClassReport:
    """One namespace's quota of one class (or of all classes, `*`)."""

    namespace: str
    class_name: str
    mode: str
    limit: Fraction | None
    in_use: Fraction
    reserved: Fraction
    holders: tuple[tuple[str, Fraction], ...]
    waiting: tuple[Waiting, ...]
    # The GPU-hour budget of the class (or `*`), and the GPU-seconds used in its window (None:
    # no budget, or not known to whoever made the report).
    budget: Budget | None = None
    budget_used: Fraction | None = None
    # The size of each gang, where it is known (the leader reads what sizes a gang).
    gang_sizes: Mapping[str, int] = field(default_factory=dict)
    # In a cohort (`policies.quota.cohorts`): its name, what the namespace holds beyond its
    # nominal quota (the limit), and what of its idle quota borrowers hold (None: not known
    # to whoever made the report).
    cohort: str | None = None
    borrowed: Fraction | None = None
    lent: Fraction | None = None

    @property
    def waiting_gpus(self) -> Fraction:
        """The GPUs the waiting pods ask for together."""
        return sum((w.charge for w in self.waiting), Fraction(0))

    def _gangs(self) -> list[dict[str, Any]]:
        """The gangs of the waiting pods, in line order: how many of their pods wait, what
        they ask for, and the size where it is known."""
        found: dict[str, dict[str, Any]] = {}
        for w in self.waiting:
            if not w.gang:
                continue
            gang = found.setdefault(w.gang, {"gang": w.gang, "pods": 0, "gpus": Fraction(0)})
            gang["pods"] += 1
            gang["gpus"] += w.charge
            size = self.gang_sizes.get(w.gang, w.gang_size)
            if size is not None:
                gang["size"] = size
        return [{**g, "gpus": format_amount(g["gpus"])} for g in found.values()]

    def to_json(self) -> dict[str, Any]:
        """Return the report as `gpuadm quota -o json` prints it and GPUQuota stores it."""
        data: dict[str, Any] = {
            "namespace": self.namespace,
            "class": self.class_name,
            "mode": self.mode,
            "inUse": format_amount(self.in_use),
            "reserved": format_amount(self.reserved),
            "waiting": len(self.waiting),
            "waitingGpus": format_amount(self.waiting_gpus),
            "holders": [
                {"pod": pod, "gpus": format_amount(charge)}
                for pod, charge in self.holders[:NAMED_PODS_MAX]
            ],
            "queue": [
                {"pod": w.name, "gpus": format_amount(w.charge), "position": position}
                | ({"gang": w.gang} if w.gang else {})
                for position, w in enumerate(self.waiting[:NAMED_PODS_MAX], start=1)
            ],
        }
        if gangs := self._gangs():
            data["gangs"] = gangs[:NAMED_PODS_MAX]
        if self.limit is not None:
            data["limit"] = format_amount(self.limit)
        if len(self.holders) > NAMED_PODS_MAX:
            data["holdersNotListed"] = len(self.holders) - NAMED_PODS_MAX
        if len(self.waiting) > NAMED_PODS_MAX:
            data["queueNotListed"] = len(self.waiting) - NAMED_PODS_MAX
        if self.cohort is not None:
            data["cohort"] = self.cohort
            if self.limit is not None:
                data["nominal"] = format_amount(self.limit)
            if self.borrowed is not None:
                data["borrowed"] = format_amount(self.borrowed)
            if self.lent is not None:
                data["lent"] = format_amount(self.lent)
        if self.budget is not None:
            data["budget"] = str(self.budget)
        if self.budget is not None and self.budget_used is not None:
            data["budgetUsed"] = self.budget.say(self.budget_used)
        return data


def namespace_report(
    namespace: str,
    quotas: QuotaConfig,
    holdings: Iterable[Holding],
    reserved: Iterable[Reservation],
    line: Sequence[Waiting],
    *,
    budget_used: Mapping[str, Fraction] | None = None,
    gang_sizes: Mapping[str, int] | None = None,
    cohort_usage: Mapping[str, Mapping[str, Fraction]] | None = None,
) -> list[ClassReport]:
    """Report each class the namespace has a limit or a GPU-hour budget for, holds, reserves
    or waits for, and `*` when it has a cap or a budget across classes. Classes come in name
    order, `*` last.

    `budget_used`: per class with a budget (or `*`), the GPU-seconds used in the budget's
    window; a class it leaves out reports its budget without what was used of it.
    `gang_sizes`: the size of each gang of the line, where it is known. `cohort_usage`:
    what each member of the namespace's cohort holds, pods and reservations, to say what of
    its idle quota borrowers hold.
    """
    terms = quotas.terms(namespace)
    limits, mode, budgets = terms.limits, terms.mode, terms.budgets
    used = budget_used or {}
    holders: dict[str, list[tuple[str, Fraction]]] = {}
    for holding in holdings:
        holders.setdefault(holding.class_name, []).append((holding.pod, holding.charge))
    reserved_by_class: dict[str, Fraction] = {}
    for reservation in reserved:
        reserved_by_class[reservation.class_name] = (
            reserved_by_class.get(reservation.class_name, Fraction(0)) + reservation.charge
        )
    ordered = in_line_order(line)
    classes = sorted(
        {k for k in (*limits, *budgets) if k != ALL_CLASSES}
        | set(holders)
        | set(reserved_by_class)
        | {w.class_name for w in ordered}
    )
    reports = [
        _report(
            namespace,
            name,
            mode,
            limits.get(name),
            holders.get(name, []),
            reserved_by_class.get(name, Fraction(0)),
            [w for w in ordered if w.class_name == name],
            budgets.get(name),
            used,
            gang_sizes or {},
        )
        for name in classes
    ]
    cohort = quotas.cohort_of(namespace)
    if cohort is not None:
        reports = [_in_cohort(r, cohort, cohort_usage) for r in reports]
    if ALL_CLASSES in limits or ALL_CLASSES in budgets:
        everyone = [h for name in sorted(holders) for h in holders[name]]
        reports.append(
            _report(
                namespace,
                ALL_CLASSES,
                mode,
                limits.get(ALL_CLASSES),
                everyone,
                sum(reserved_by_class.values(), Fraction(0)),
                ordered,
                budgets.get(ALL_CLASSES),
                used,
                gang_sizes or {},
            )
        )
    return reports


def _in_cohort(
    report: ClassReport, cohort: Cohort, usage: Mapping[str, Mapping[str, Fraction]] | None
) -> ClassReport:
    """Say what a cohort member's report of a shared class borrows and lends."""
    namespace, class_name = report.namespace, report.class_name
    if not cohort.members[namespace].shares(class_name):
        return report
    held = report.in_use + report.reserved
    lent = None if usage is None else cohort.lent(class_name, usage).get(namespace)
    return replace(
        report,
        cohort=cohort.name,
        borrowed=cohort.borrowed(namespace, class_name, held),
        lent=lent,
    )


def _report(
    namespace: str,
    class_name: str,
    mode: str,
    limit: Fraction | None,
    holders: list[tuple[str, Fraction]],
    reserved: Fraction,
    waiting: list[Waiting],
    budget: Budget | None,
    budget_used: Mapping[str, Fraction],
    gang_sizes: Mapping[str, int],
) -> ClassReport:
    return ClassReport(
        namespace=namespace,
        class_name=class_name,
        mode=mode,
        limit=limit,
        in_use=sum((charge for _, charge in holders), Fraction(0)),
        reserved=reserved,
        holders=tuple(sorted(holders)),
        waiting=tuple(waiting),
        budget=budget,
        # What was used is said only of a budget: without one there is no window to count in.
        budget_used=None if budget is None else budget_used.get(class_name),
        gang_sizes=gang_sizes,
    )


def reported_namespaces(
    quotas: QuotaConfig, *active: Iterable[str], only: str | None = None
) -> list[str]:
    """Return the namespaces a report covers: those the quota file lists, and those that
    hold, reserve or wait for GPUs; or just `only`."""
    if only is not None:
        return [only]
    names: set[str] = set(quotas.namespaces)
    for group in active:
        names.update(group)
    return sorted(names)


def reservations_to_report(
    reservations: Mapping[str, Reservation], shown: Iterable[str]
) -> list[Reservation]:
    """Return the reservations not yet shown as pods (`shown`: the uids of GPU pods seen)."""
    seen = set(shown)
    return [r for uid, r in reservations.items() if uid not in seen]
