"""The quota ledger: the three parts of exact quota, wired together on one store.

- `book.ReservationBook`: each namespace's record of reservations, read, stored with
  compare-and-swap, and pruned; and what a namespace holds by it;
- `admissions.AdmissionJudge`: each admission judged against the book, those that arrive
  together stored together (group commit); the `QuotaGate` of `/validate`;
- `line.QueueLine`: queue mode on the book: gated pods judged as they join their line,
  released in turns by the leader, and their room given back when they leave.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from policies import Plan
from policies.judge import QuotaVerdict
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.admissions import AdmissionJudge
from webhook.quota.book import CATCH_UP_SECONDS, RESERVATION_TTL, ReservationBook
from webhook.quota.line import QueueLine
from webhook.quota.namespaces import every_namespace_exists
from webhook.quota.reservations import ReservationStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

__all__ = ["RESERVATION_TTL", "QuotaLedger"]


class QuotaLedger:
    """One replica's quota: a `QuotaGate` (its judge), its book and its line."""

    def __init__(
        self,
        usage: UsageIndex,
        store: ReservationStore,
        *,
        pods_visible: bool,
        usage_ready: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        reservation_ttl: float = RESERVATION_TTL,
        metrics: Metrics | None = None,
        namespace_exists: Callable[[str], Awaitable[bool]] = every_namespace_exists,
        drop_shown: bool = False,
        catch_up_seconds: float = CATCH_UP_SECONDS,
        relist: Callable[[], None] = lambda: None,
    ) -> None:
        """Build a ledger; with `pods_visible` False (standalone) reservations never expire.

        `usage_ready` says whether the usage index is in sync; `namespace_exists` whether a
        namespace is real, so that nothing is judged or kept for one that is not. With
        `drop_shown`, reservations leave the record once the watch shows their pods; a
        judgement waits `catch_up_seconds` at most for the watch to reach a record's mark;
        `relist` asks the pod watch for a full list (`ReservationBook`).
        """
        self.book = ReservationBook(
            usage,
            store,
            pods_visible=pods_visible,
            clock=clock,
            reservation_ttl=reservation_ttl,
            metrics=metrics,
            drop_shown=drop_shown,
            catch_up_seconds=catch_up_seconds,
            relist=relist,
        )
        self.line = QueueLine(self.book, usage)
        self.judge = AdmissionJudge(
            self.book, self.line, usage_ready=usage_ready, namespace_exists=namespace_exists
        )

    def should_gate(
        self, namespace: str, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Say whether a pod being created gets gpuadm's gate (`AdmissionJudge.should_gate`)."""
        return self.judge.should_gate(namespace, plan, config)

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Judge the pod and reserve its charge (`AdmissionJudge.admit`)."""
        return await self.judge.admit(request, plan, config)
