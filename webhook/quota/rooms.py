"""What the namespaces of one record hold, through one batch of admissions or one turn.

A namespace's record holds its own reservations; a cohort's (`policies.quota.cohorts`)
holds those of all of its members, so that one compare-and-swap covers every namespace
whose idle quota is shared. A batch judged on a cohort's record judges each member against
its limits of the moment, from what every member holds, kept up to date as it admits.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from policies.quota.borrowing import told
from policies.quota.cohorts import Cohort
from policies.quota.judge import QuotaVerdict
from policies.quota.quotas import QuotaConfig
from webhook.quota.book import ReservationBook
from webhook.quota.claims import CLAIM_REFRESH_SECONDS, claim_key
from webhook.quota.reservations import Allowance, Reservation


class Rooms:
    """What each namespace of a record holds, from the record read for a batch."""

    def __init__(
        self,
        book: ReservationBook,
        key: str,
        cohort: Cohort | None,
        reservations: Mapping[str, Reservation],
        allowances: Mapping[str, Allowance],
    ) -> None:
        self.key = key
        self.cohort = cohort
        self._book = book
        self._reservations = reservations
        if cohort is not None:
            self.totals = cohort_usage(book, cohort, reservations)
        else:
            self.totals = {key: book.in_use(key, reservations, allowances)}

    def of(self, namespace: str) -> dict[str, Fraction]:
        """Return what a namespace holds now, per class."""
        totals = self.totals.get(namespace)
        if totals is None:  # not a member by this batch's config: counted all the same
            totals = self._book.in_use(
                self.key, self._reservations, {}, set_aside=False, of=namespace
            )
            self.totals[namespace] = totals
        return totals

    def set(self, namespace: str, totals: dict[str, Fraction]) -> None:
        """Note what a namespace holds after an admission."""
        self.totals[namespace] = totals

    def limits(self, namespace: str, limits: Mapping[str, Fraction]) -> Mapping[str, Fraction]:
        """Return a namespace's limits of the moment: in a cohort, what it may reach now."""
        if self.cohort is None or namespace not in self.cohort.members:
            return limits
        return self.cohort.limits_now(namespace, limits, self.totals)

    def claim(
        self,
        verdict: QuotaVerdict,
        namespace: str,
        class_name: str,
        charge: Fraction,
        priority: int,
        reservations: dict[str, Reservation],
        now: float,
    ) -> bool:
        """Add to `reservations` a claim for a member's pod refused within its nominal
        quota, whose `reclaim` lets it take room back from borrowers; tell whether the
        record is to be written for it (a claim written lately stands)."""
        cohort = self.cohort
        if verdict.allowed or cohort is None or namespace not in cohort.members:
            return False
        if cohort.members[namespace].reclaim == "never" or class_name not in verdict.exceeded:
            return False
        if not cohort.needs_back(namespace, class_name, charge, self.totals):
            return False
        key = claim_key(namespace, class_name)
        known = reservations.get(key)
        if known is not None and now - known.at < CLAIM_REFRESH_SECONDS:
            return False
        reservations[key] = Reservation(
            class_name, Fraction(0), now, f"{charge}@{priority}", namespace=namespace
        )
        return True

    def told(
        self,
        verdict: QuotaVerdict,
        namespace: str,
        class_name: str,
        charge: Fraction,
        in_use: Mapping[str, Fraction],
    ) -> QuotaVerdict:
        """Return `verdict`, judged against `in_use`, telling what the pod borrows or
        what of its cohort it did not fit."""
        if self.cohort is None or namespace not in self.cohort.members:
            return verdict
        usage = {**self.totals, namespace: dict(in_use)}
        return told(verdict, self.cohort, namespace, class_name, charge, usage)


def cohort_usage(
    book: ReservationBook,
    cohort: Cohort,
    reservations: Mapping[str, Reservation] | None = None,
) -> dict[str, dict[str, Fraction]]:
    """Return what each member of a cohort holds, from its record's `reservations` (by
    default, this replica's copy). No room is set aside in a cohort's record."""
    if reservations is None:
        reservations = book.copied(cohort.key)
    return {
        member: book.in_use(cohort.key, reservations, {}, set_aside=False, of=member)
        for member in cohort.members
    }


def record_key(quotas: QuotaConfig, namespace: str) -> tuple[str, Cohort | None]:
    """Return the key of the record that holds a namespace's reservations, and its cohort."""
    cohort = quotas.cohort_of(namespace)
    return (cohort.key, cohort) if cohort is not None else (namespace, None)


def priority_of(pod: Mapping[str, Any]) -> int:
    """Return a pod's priority, as the apiserver's Priority admission set it (0: none)."""
    spec = pod.get("spec")
    priority = spec.get("priority") if isinstance(spec, Mapping) else None
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
