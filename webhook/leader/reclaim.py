"""The leader's work on cohorts: mark borrowed pods, and take idle quota back for lenders.

Every `period` seconds, and soon after what a cohort's members hold or wait for changes,
the leader, for each cohort and class (`policies.quota.cohorts`):

1. reads the cohort's record afresh, so that what every member holds counts the pods other
   replicas admitted and the watch does not show yet;
2. labels each member's borrowed pods (`gpuadm.io/borrowed: "true"`, with an annotation of
   what they borrow) and unlabels those no longer borrowed: at most `MARKS_PER_PASS` pods
   a pass, the rest on the next. The label is for people and dashboards; nothing of quota
   is decided by it, so a pod whose label lags is judged the same;
3. for each member whose `reclaim` allows it and whose first waiting pod of the class fits
   its nominal quota but not the room the borrowers leave, evicts borrowed pods of the other
   members through the Eviction API (so PodDisruptionBudgets hold): lowest priority first,
   then newest, a gang whole, only as much as the waiting pod needs, and none at all if
   the candidates cannot free that much. An eviction a budget refuses (429) moves on to the
   next candidate. An Event on each evicted pod and on the waiting pod says why.

A reclaim is planned on what members will hold once their pods being deleted are gone
(`cohorts.settled`), and pods this leader evicted count as such until the watch shows them
deleted: so a pass after an eviction, or a new leader after a failover, never evicts twice
for one waiting pod, and one cut short is carried on by the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from policies.quantity import format_amount
from policies.quota.borrowing import BORROWED, borrowing_note
from policies.quota.cohorts import (
    ZERO,
    Cohort,
    Giving,
    Held,
    Unit,
    candidates,
    reclaim_plan,
    settled,
)
from policies.quota.queue import Waiting
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.observe.metrics import Metrics
from webhook.quota.claims import Claim
from webhook.quota.holdings import Holding
from webhook.quota.line import QueueLine
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.reclaim")

PERIOD_SECONDS = 5.0
MIN_GAP_SECONDS = 1.0
# The most label patches one pass makes: a cohort of thousands of borrowed pods is marked
# over several passes, never in one burst of writes.
MARKS_PER_PASS = 50
# A pod this leader evicted counts as ending for this long, or until the watch shows it so.
EVICTED_SECONDS = 60.0
LABEL_PATH = "/metadata/labels/" + BORROWED.replace("~", "~0").replace("/", "~1")
ANNOTATION_PATH = "/metadata/annotations/" + BORROWED.replace("~", "~0").replace("/", "~1")


def held_of(holding: Holding, evicted: bool) -> Held:
    """Return a running pod as reclaim sees it."""
    return Held(
        holding.uid,
        holding.namespace,
        holding.pod,
        holding.class_name,
        holding.charge,
        holding.priority,
        holding.created,
        holding.gang,
        holding.ending or evicted,
    )


class CohortKeeper:
    """Marks borrowed pods and reclaims idle quota for lenders, while this replica leads."""

    def __init__(
        self,
        line: QueueLine,
        usage: UsageIndex,
        config: ConfigHolder,
        api: AsyncApi,
        *,
        leading: Callable[[], bool],
        ready: Callable[[], bool],
        metrics: Metrics,
        period: float = PERIOD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.line = line
        self.usage = usage
        self.config = config
        self.api = api
        self.leading = leading
        self.ready = ready
        self.metrics = metrics
        self.period = period
        self.clock = clock
        self._wake = asyncio.Event()
        self._evicted: dict[str, float] = {}  # uid -> when this leader evicted it
        self.passes = 0

    def wake(self, namespace: str) -> None:
        """Take a pass soon if a cohort member's holdings or line changed."""
        if self.config.loaded and self.config.current.quotas.cohort_of(namespace) is not None:
            self._wake.set()

    def wake_all(self) -> None:
        """Take a pass soon (the quotas changed, or this replica leads)."""
        self._wake.set()

    async def run(self) -> None:
        """Take passes until cancelled; a pass that fails raises to the supervisor."""
        while True:
            try:
                async with asyncio.timeout(self.period):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if not (self.leading() and self.ready() and self.config.loaded):
                # Only the leader counts what is borrowed and lent: a replica that led
                # before shows nothing stale.
                self.metrics.cohort_borrowed.clear()
                self.metrics.cohort_lent.clear()
                continue
            await self.pass_once()
            # Woken by every pod event of a member, a pass reads each cohort's record: at
            # most one a second, however busy the members.
            await asyncio.sleep(MIN_GAP_SECONDS)

    async def pass_once(self) -> None:
        """Mark and reclaim in every cohort of the config, once."""
        self.passes += 1
        now = self.clock()
        self._evicted = {u: at for u, at in self._evicted.items() if now - at < EVICTED_SECONDS}
        marks = MARKS_PER_PASS
        # Series of cohorts, members and classes no longer in the config go.
        self.metrics.cohort_borrowed.clear()
        self.metrics.cohort_lent.clear()
        for cohort in self.config.current.quotas.cohorts.values():
            try:
                usage = await self.line.cohort_usage(cohort)
            except KubeError as error:
                log.warning("cannot read the record of cohort %s: %s", cohort.name, error)
                continue
            for class_name in cohort.classes():
                pods = self._pods(cohort, class_name)
                self._publish(cohort, class_name, usage)
                marks = await self._mark(cohort, class_name, pods, marks)
                await self._reclaim(cohort, class_name, pods, usage)

    def _pods(self, cohort: Cohort, class_name: str) -> dict[str, list[Held]]:
        return {
            ns: [
                held_of(h, h.uid in self._evicted)
                for h in self.usage.holdings(ns)
                if h.class_name == class_name
            ]
            for ns in cohort.members
        }

    def _publish(
        self, cohort: Cohort, class_name: str, usage: dict[str, dict[str, Fraction]]
    ) -> None:
        lent = cohort.lent(class_name, usage)
        for ns in cohort.members:
            used = usage.get(ns, {}).get(class_name, ZERO)
            borrowed = cohort.borrowed(ns, class_name, used)
            labels = (cohort.name, ns, class_name)
            self.metrics.cohort_borrowed.labels(*labels).set(float(borrowed))
            self.metrics.cohort_lent.labels(*labels).set(float(lent.get(ns, ZERO)))

    async def _mark(
        self, cohort: Cohort, class_name: str, pods: dict[str, list[Held]], budget: int
    ) -> int:
        """Label the borrowed pods and unlabel the others; return what is left of `budget`."""
        for ns, held in pods.items():
            borrowed = {p.uid for p in cohort.borrowed_pods(ns, class_name, held)}
            marked = {h.uid for h in self.usage.holdings(ns) if h.marked}
            for pod in held:
                if budget <= 0:
                    return 0
                want = pod.uid in borrowed
                if want == (pod.uid in marked) or pod.ending:
                    continue
                budget -= 1
                await self._set_mark(cohort, pod, want)
        return budget

    async def _set_mark(self, cohort: Cohort, pod: Held, borrowed: bool) -> None:
        test: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": pod.uid}]
        if borrowed:
            note = borrowing_note(cohort, pod.namespace, pod.class_name, pod.charge)
            patch: list[dict[str, Any]] = [
                *test,
                *_ensure("/metadata/labels"),
                {"op": "add", "path": LABEL_PATH, "value": "true"},
                *_ensure("/metadata/annotations"),
                {"op": "add", "path": ANNOTATION_PATH, "value": note},
            ]
        else:
            patch = [
                *test,
                {"op": "remove", "path": LABEL_PATH},
                {"op": "remove", "path": ANNOTATION_PATH},
            ]
        try:
            found = await self.api.get_pod(pod.namespace, pod.name)
            if found is None:
                return
            metadata = found.get("metadata") or {}
            if borrowed:
                patch = [p for p in patch if not _present(metadata, p)]
            else:
                patch = [p for p in patch if p["op"] == "test" or _present(metadata, p)]
            if len(patch) > 1:
                await self.api.patch_pod(pod.namespace, pod.name, patch)
        except KubeError as error:  # its label waits for the next pass
            log.info("cannot mark pod %s/%s: %s", pod.namespace, pod.name, error)

    async def _reclaim(
        self,
        cohort: Cohort,
        class_name: str,
        pods: dict[str, list[Held]],
        usage: Mapping[str, Mapping[str, Fraction]],
    ) -> None:
        after = settled(usage, class_name, pods)
        quotas = self.config.current.quotas
        claims = {
            c.namespace: c for c in self.line.cohort_claims(cohort) if c.class_name == class_name
        }
        # A waiting pod the record charges is released already, its gate about to go: its
        # room is counted, and it needs none back.
        charged = self.line.charged(cohort.key)
        for ns, member in cohort.members.items():
            if member.reclaim == "never":
                continue
            claimant: Waiting | Claim | None
            if quotas.mode_for(ns) == "queue":
                claimant = self._first_waiting(ns, class_name, charged)
            else:  # enforce: a pod refused lately left a claim in the record
                claimant = claims.get(ns)
            if claimant is None:
                continue
            need = cohort.needs_back(ns, class_name, claimant.charge, after)
            if not need:
                continue
            units = candidates(cohort, ns, class_name, claimant.priority, pods)
            if not reclaim_plan(cohort, ns, class_name, need, after, units):
                log.info(
                    "cohort %s: %s waits for %s %s the borrowers cannot give back under "
                    "reclaim: %s",
                    cohort.name,
                    ns,
                    format_amount(need),
                    class_name,
                    member.reclaim,
                )
                continue
            await self._evict(cohort, class_name, claimant, need, units, after)
            return  # one claimant a pass: the next pass sees what this one freed

    def _first_waiting(self, namespace: str, class_name: str, charged: set[str]) -> Waiting | None:
        for pod in self.usage.line(namespace).ordered():
            if pod.class_name == class_name and pod.uid not in charged:
                return pod
        return None

    async def _evict(
        self,
        cohort: Cohort,
        class_name: str,
        claimant: Waiting | Claim,
        need: Fraction,
        units: list[Unit],
        usage: Mapping[str, Mapping[str, Fraction]],
    ) -> None:
        giving = Giving(cohort, class_name, usage)
        amount = f"{format_amount(need)} {class_name}"
        for unit in units:
            if giving.freed >= need:
                break
            gives = giving.gives(unit)
            if not gives:
                continue
            evicted = 0
            for pod in unit.pods:
                if await self._evict_one(cohort, pod, claimant, amount):
                    evicted += 1
                elif not evicted:
                    break  # a gang whose first pod a budget protects is left whole
            if evicted:
                giving.took(unit, gives)
        if not isinstance(claimant, Waiting):
            return  # a refused pod is not there to be told: its retry finds the room
        await self._tell(
            claimant,
            "GPUQuotaReclaiming",
            (
                f"gpuadm evicted borrowed pods in cohort {cohort.name} to return {amount} "
                f"to {claimant.namespace}"
                if giving.freed >= need
                else f"gpuadm could evict only part of the {amount} borrowers of cohort "
                f"{cohort.name} hold of {claimant.namespace}'s quota: PodDisruptionBudgets "
                "refused the rest; it tries again"
            ),
            warning=False,
        )

    async def _evict_one(
        self, cohort: Cohort, pod: Held, claimant: Waiting | Claim, amount: str
    ) -> bool:
        try:
            await self.api.evict_pod(pod.namespace, pod.name, pod.uid)
        except KubeError as error:
            if error.status == 404:  # gone already: its room is free
                return True
            reason = "disruption_budget" if error.status == 429 else "failed"
            self.metrics.cohort_reclaims.labels(cohort.name, pod.class_name, reason).inc()
            log.info("cannot evict pod %s/%s: %s", pod.namespace, pod.name, error)
            return False
        self._evicted[pod.uid] = self.clock()
        self.metrics.cohort_reclaims.labels(cohort.name, pod.class_name, "evicted").inc()
        log.info(
            "evicted borrowed pod %s/%s to return %s to %s (cohort %s)",
            pod.namespace,
            pod.name,
            amount,
            claimant.namespace,
            cohort.name,
        )
        await self._tell(
            pod,
            "GPUQuotaReclaimed",
            f"evicted to return {amount} to {claimant.namespace} (cohort {cohort.name}): "
            "this pod held GPUs borrowed from its idle quota",
            warning=True,
        )
        return True

    async def _tell(self, pod: Held | Waiting, reason: str, message: str, *, warning: bool) -> None:
        try:
            await self.api.record_event(
                namespace=pod.namespace,
                kind="Pod",
                name=pod.name,
                uid=pod.uid,
                reason=reason,
                message=message,
                warning=warning,
            )
        except KubeError as error:  # an Event is for people: the reclaim stands without it
            log.info("cannot record an Event on pod %s/%s: %s", pod.namespace, pod.name, error)


def _ensure(path: str) -> list[dict[str, Any]]:
    """A patch step that makes a map if the pod has none (filtered out if it has one)."""
    return [{"op": "add", "path": path, "value": {}}]


def _present(metadata: Mapping[str, Any], step: Mapping[str, Any]) -> bool:
    """Tell whether a patch step's target is there already (with its value, for an add)."""
    parts = str(step["path"]).split("/")[2:]
    if not parts:
        return False
    node: Any = metadata
    for part in parts:
        key = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    if step["op"] == "add" and len(parts) > 1:
        return bool(node == step["value"])
    return step["op"] != "add" or isinstance(node, dict)
