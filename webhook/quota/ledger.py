"""The quota ledger: the three parts of exact quota, wired together on one store.

- `book.ReservationBook`: each namespace's record of reservations, read, stored with
  compare-and-swap, and pruned; and what a namespace holds by it;
- `admissions.AdmissionJudge`: each admission judged against the book, those that arrive
  together stored together (group commit); the `QuotaGate` of `/validate`;
- `line.QueueLine`: queue mode on the book: gated pods judged as they join their line,
  released in turns by the leader, and their room given back when they leave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from policies import Plan
from policies.quota.judge import QuotaVerdict
from webhook.config.snapshot import ConfigSnapshot
from webhook.kube.errors import KubeError
from webhook.quota.admissions import AdmissionJudge
from webhook.quota.allowances import KEEP_SECONDS
from webhook.quota.book import RESERVATION_TTL, ReservationBook
from webhook.quota.gang_room import GangSize, sized_on_pods
from webhook.quota.line import QueueLine
from webhook.quota.namespaces import every_namespace_exists
from webhook.quota.reservations import ReservationStore
from webhook.quota.usage import UsageIndex
from webhook.quota.verdicts import gate_verdict
from webhook.quota.watermark import CATCH_UP_SECONDS
from webhook.reviews.request import AdmissionRequest

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

__all__ = ["RESERVATION_TTL", "QuotaLedger"]

log = logging.getLogger("gpuadm.quota")

# A namespace whose room aside could not be given back is tried again after this long, and
# its failure logged once a minute at most.
RETRY_SECONDS = 1.0
FAILED_LOG_SECONDS = 60.0


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
        catch_up_seconds: float = CATCH_UP_SECONDS,
        relist: Callable[[], None] = lambda: None,
        holder: str = "",
        gang_size: GangSize = sized_on_pods,
    ) -> None:
        """Build a ledger; with `pods_visible` False (standalone) reservations never expire.

        `usage_ready` says whether the usage index is in sync; `namespace_exists` whether a
        namespace is real, so that nothing is judged or kept for one that is not. With
        `pods_visible` (in a cluster), reservations leave the record once the watch shows
        their pods, a judgement waits `catch_up_seconds` at most for the watch to reach a
        record's mark, and `relist` asks the pod watch for a full list; room is set aside
        for this replica, named after `holder`, to admit from without a write
        (`webhook.quota.allowances`), and `keep_allowances` must run (`ReservationBook`).
        `gang_size` reads the size of a gang a pod is in, for enforce mode.
        """
        self.book = ReservationBook(
            usage,
            store,
            pods_visible=pods_visible,
            clock=clock,
            reservation_ttl=reservation_ttl,
            metrics=metrics,
            catch_up_seconds=catch_up_seconds,
            relist=relist,
            holder=holder,
        )
        self.line = QueueLine(self.book, usage)
        self.judge = AdmissionJudge(
            self.book,
            self.line,
            usage_ready=usage_ready,
            namespace_exists=namespace_exists,
            gang_size=gang_size,
        )

    def should_gate(
        self, namespace: str, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Say whether a pod being created gets gpuadm's gate (`verdicts.gate_verdict`)."""
        return gate_verdict(namespace, plan, config)

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Judge the pod and reserve its charge (`AdmissionJudge.admit`)."""
        return await self.judge.admit(request, plan, config)

    async def keep_allowances(self, progress: Callable[[], None]) -> None:
        """Give back this replica's room aside in each namespace once it is idle or near
        its end, every `KEEP_SECONDS`.

        A namespace whose room cannot be given back (the apiserver unreachable, the record
        busy, full or unreadable) is logged, once a minute at most, and tried again after
        `RETRY_SECONDS`; the others go on meanwhile. Its room stays counted as held by the
        other replicas, until its end plus the reservations' lifetime at most.
        """
        book = self.book
        retry_at: dict[str, float] = {}
        logged: dict[str, float] = {}
        while True:
            await asyncio.sleep(KEEP_SECONDS)
            now = time.monotonic()
            for namespace in book.allowances.due(book.clock()):
                if retry_at.get(namespace, 0.0) > now:
                    continue
                try:
                    await book.give_back(namespace)
                    retry_at.pop(namespace, None)
                    logged.pop(namespace, None)
                except Exception as error:
                    retry_at[namespace] = now + RETRY_SECONDS
                    if now - logged.get(namespace, float("-inf")) >= FAILED_LOG_SECONDS:
                        logged[namespace] = now
                        log.warning(
                            "cannot give back the room set aside in namespace %s: %s",
                            namespace,
                            getattr(error, "detail", None) or error,
                            exc_info=not isinstance(error, KubeError),
                        )
            progress()
