"""What tenants see: one GPUQuota object per namespace and class, kept current by the leader.

`kubectl get gpuquotas -n team-a` lists a namespace's classes with their limit, what is in
use, reserved and waiting, and their GPU-hour budget with what was used of it in its window;
`kubectl describe gpuquota a100` adds the pods that hold it and the line. The objects are
gpuadm's (a CRD, deploy/base/crd.yaml) and readable through the standard `view` role, which
the ClusterRole `gpuadm-quota-view` is aggregated into. They are written only when what they
say changes, and a namespace's are looked at again whenever its pods, line or quotas change,
so they are current within `period` seconds; records written by other replicas are read
again at least every `full_every` seconds.

The cap across classes, `*`, is the object `all.classes` (no class name holds a dot).

What was used of a budget is what the GPU-hour record says, as counted at its last
checkpoint (`HoursLedger.recorded_use`), not the seconds of the pods running since: so an
object changes once per checkpoint, not at every pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from policies.policy import MANAGED_BY, MANAGER
from policies.quota.quotas import ALL_CLASSES
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import GPUADM_API, AsyncApi
from webhook.quota.line import QueueLine
from webhook.quota.report import ClassReport, namespace_report, reported_namespaces
from webhook.quota.usage import UsageIndex

log = logging.getLogger("gpuadm.publish")

API_VERSION = "gpuadm.io/v1alpha1"
KIND = "GPUQuota"
ALL_CLASSES_NAME = "all.classes"
CLASS_LABEL = "gpuadm.io/quota-class"
PERIOD_SECONDS = 2.0
FULL_EVERY_SECONDS = 30.0


def object_name(class_name: str) -> str:
    """Name the GPUQuota object of a class."""
    return ALL_CLASSES_NAME if class_name == ALL_CLASSES else class_name


def quota_object(report: ClassReport) -> dict[str, Any]:
    """Return the GPUQuota object that shows a report."""
    status = report.to_json()
    del status["namespace"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(report.class_name),
            "namespace": report.namespace,
            "labels": {MANAGED_BY: MANAGER, CLASS_LABEL: object_name(report.class_name)},
        },
        "status": status,
    }


class QuotaPublisher:
    """Writes the GPUQuota objects while this replica leads."""

    def __init__(
        self,
        line: QueueLine,
        usage: UsageIndex,
        config: ConfigHolder,
        api: AsyncApi,
        *,
        ready: Callable[[], bool],
        period: float = PERIOD_SECONDS,
        full_every: float = FULL_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        budget_used: Callable[[str], Mapping[str, Fraction]] = lambda namespace: {},
        gang_sizes: Callable[[str], Mapping[str, int]] = lambda namespace: {},
    ) -> None:
        """`budget_used`: per namespace, the GPU-seconds used of each budget in its window
        (`HoursLedger.recorded_use`); none known by default. `gang_sizes`: per namespace,
        the size of each gang of its line that the leader has read."""
        self.line = line
        self.usage = usage
        self.config = config
        self.api = api
        self.ready = ready
        self.period = period
        self.full_every = full_every
        self.clock = clock
        self.budget_used = budget_used
        self.gang_sizes = gang_sizes
        self._due: set[str] = set()
        self._full_at = 0.0
        # What is published: namespace -> object name -> (status, object as stored). None
        # until listed, which each new term as leader starts with.
        self._published: dict[str, dict[str, tuple[Any, dict[str, Any]]]] | None = None
        self._restart = True
        self._missing_api_logged = False

    def wake(self, namespace: str) -> None:
        """Look at a namespace again on the next pass."""
        self._due.add(namespace)

    def restart(self) -> None:
        """List what is published again, and look at every namespace, on the next pass (on
        becoming the leader, or when the config changes). Safe to call during a pass."""
        self._restart = True

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """Publish until cancelled (leader-only work: it runs only while this replica leads).

        `progress` is called after each pass, or wait for the pod view or the config.
        """
        self._restart = True  # whatever changed while another replica led
        while True:
            await asyncio.sleep(self.period)
            if not (self.ready() and self.config.loaded):
                self._restart = True
                progress()
                continue
            try:
                await self.pass_once()
            except KubeError as error:
                if error.status != 404:
                    raise
                self._log_missing_api()
                self._restart = True
            progress()

    async def pass_once(self) -> None:
        """Publish the namespaces that are due, or all of them when a full pass is due."""
        if self._restart or self._published is None:
            self._restart = False
            self._published = await self._list_published()
            self._full_at = 0.0
        quotas = self.config.current.quotas
        now = self.clock()
        if now - self._full_at >= self.full_every:
            self._full_at = now
            due = set(
                reported_namespaces(
                    quotas,
                    self.usage.namespaces(),
                    self.usage.waiting_namespaces(),
                    await self.line.recorded_namespaces(),
                )
            ) | set(self._published)
        else:
            due = set(self._due)
        self._due.clear()
        published = self._published
        for namespace in sorted(due):
            try:
                await self._publish(namespace, published)
            except KubeError as error:
                # One namespace must not hold up the others: a listed namespace that does not
                # exist (yet) refuses its objects with 404. It is tried again on the next
                # full pass, or when its pods change.
                if error.status != 404:
                    log.warning("cannot publish the quota of namespace %s: %s", namespace, error)
                published.pop(namespace, None)

    async def _publish(
        self, namespace: str, published_all: dict[str, dict[str, tuple[Any, dict[str, Any]]]]
    ) -> None:
        quotas = self.config.current.quotas
        cohort = quotas.cohort_of(namespace)
        reserved = await self.line.reserved(namespace, quotas.record_key(namespace))
        reports = namespace_report(
            namespace,
            quotas,
            self.usage.holdings(namespace),
            reserved.values(),
            # A gated pod with a reservation is charged, its gate about to go: not waiting.
            [w for w in self.usage.waiting(namespace) if w.uid not in reserved],
            budget_used=self.budget_used(namespace),
            gang_sizes=self.gang_sizes(namespace),
            cohort_usage=None if cohort is None else await self.line.cohort_usage(cohort),
        )
        # A namespace the quota file lists is shown even while it holds nothing (with its
        # budgets, if it has only those); any other (under `default`) once it holds, reserves
        # or waits for a GPU, and while its record counts GPU-hours in a budget's window.
        relevant = namespace in quotas.namespaces or any(
            r.in_use or r.reserved or r.waiting or r.budget_used for r in reports
        )
        wanted = {object_name(r.class_name): quota_object(r) for r in reports} if relevant else {}
        published = published_all.setdefault(namespace, {})
        for name, body in wanted.items():
            current = published.get(name)
            if current is not None and current[0] == body["status"]:
                continue
            published[name] = (body["status"], await self._write(namespace, body, current))
        for name in set(published) - set(wanted):
            await self.api.delete_quota_status(namespace, name)
            del published[name]
        if not published:
            del published_all[namespace]

    async def _write(
        self, namespace: str, body: dict[str, Any], current: tuple[Any, dict[str, Any]] | None
    ) -> dict[str, Any]:
        if current is not None:
            body["metadata"]["resourceVersion"] = current[1]["metadata"]["resourceVersion"]
            try:
                return await self.api.replace_quota_status(namespace, body)
            except KubeError as error:
                if error.status not in (404, 409):
                    raise
            body["metadata"].pop("resourceVersion", None)
        try:
            return await self.api.create_quota_status(namespace, body)
        except KubeError as error:
            if error.status != 409:
                raise
        # It exists, written by an earlier leader: replace it at the version it has now
        # (custom resources take no update without one). A conflict here is retried on the
        # next pass.
        found = await self.api.get_quota_status(namespace, body["metadata"]["name"])
        if found is None:
            return await self.api.create_quota_status(namespace, body)
        body["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
        return await self.api.replace_quota_status(namespace, body)

    async def _list_published(self) -> dict[str, dict[str, tuple[Any, dict[str, Any]]]]:
        items = await self.api.list_all(f"{GPUADM_API}/gpuquotas", f"{MANAGED_BY}={MANAGER}")
        published: dict[str, dict[str, tuple[Any, dict[str, Any]]]] = {}
        for item in items:
            metadata = item.get("metadata") or {}
            published.setdefault(str(metadata.get("namespace")), {})[str(metadata.get("name"))] = (
                item.get("status"),
                item,
            )
        return published

    def _log_missing_api(self) -> None:
        if not self._missing_api_logged:
            self._missing_api_logged = True
            log.warning(
                "the GPUQuota API (gpuquotas.gpuadm.io) is not installed: tenants cannot see "
                "their quota with kubectl; apply deploy/base/crd.yaml"
            )
