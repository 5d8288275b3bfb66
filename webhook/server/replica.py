"""One replica, wired: standalone on files, or in a cluster on ConfigMaps, pods and records."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from functools import partial

from aiohttp import web

from certs import CertificateReloader
from webhook.claims.lookup import ClusterClaims
from webhook.claims.templates import ClusterTemplates
from webhook.config.configmap_source import ConfigMapSource
from webhook.config.file_source import FileSource
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot
from webhook.kube.client import Kube
from webhook.kube.rest import AsyncApi
from webhook.leader.events import PodEvents
from webhook.leader.lease import LeaseElector
from webhook.leader.publish import QuotaPublisher
from webhook.leader.release import Releaser
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics, QueueReading
from webhook.quota.configmap_store import ConfigMapStore
from webhook.quota.ledger import QuotaLedger
from webhook.quota.namespaces import KnownNamespaces
from webhook.quota.podwatch import PodWatcher
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.lifecycle import Background
from webhook.server.settings import Settings

log = logging.getLogger("gpuadm.replica")
# Expired reservations are dropped from the records this often: records stay small, and
# a pruning pass costs one read (and rarely a write) per namespace.
PRUNE_SECONDS = 30.0


def standalone_app(
    settings: Settings,
    config: ConfigSnapshot,
    *,
    audit: AuditLog | None = None,
    tls: CertificateReloader | None = None,
) -> web.Application:
    """Serve from files, with an in-memory ledger of what this process admitted.

    `config` is what the files held at start; later changes are picked up by polling them.
    """
    assert settings.policy_file is not None
    metrics = Metrics()
    holder = ConfigHolder(metrics=metrics)
    holder.offer(config)
    files = FileSource(
        holder, settings.policy_file, settings.quotas_file, every_seconds=settings.reload_seconds
    )
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=False, metrics=metrics)
    export_quota(metrics, ledger, holder, usage)
    log.info("standalone: config from %s, quota usage kept in memory", settings.policy_file)
    if config.quotas.mode == "queue" or any(
        entry.mode == "queue" for entry in config.quotas.namespaces.values()
    ):
        log.warning(
            "standalone: queue mode gives waiting pods their scheduling gate, but with no "
            "cluster there is no one to release them"
        )
    return create_app(
        settings,
        holder,
        quota=ledger,
        metrics=metrics,
        audit=audit,
        tls=tls,
        background=[Background("config-files", files.run)],
    )


def cluster_app(
    settings: Settings,
    kube: Kube,
    *,
    audit: AuditLog | None = None,
    tls: CertificateReloader | None = None,
    extra: tuple[Background, ...] = (),
) -> web.Application:
    """Serve from the cluster: ConfigMaps, the pod watch and shared usage records.

    `extra` is more background work for the life of the app (the TLS keeper).
    """
    metrics = Metrics()
    holder = ConfigHolder(metrics=metrics)
    usage = UsageIndex()
    pods = PodWatcher(kube, usage, holder, metrics)
    config = ConfigMapSource(kube, settings.namespace, holder, on_policy_change=pods.request_relist)
    api = AsyncApi(kube.endpoint())
    ledger = QuotaLedger(
        usage,
        ConfigMapStore(kube, api, settings.namespace),
        pods_visible=True,
        usage_ready=pods.ready,
        metrics=metrics,
        namespace_exists=KnownNamespaces(api).exists,
    )
    export_quota(metrics, ledger, holder, usage)
    templates = ClusterTemplates(api, holder)
    elector = LeaseElector(
        api,
        settings.namespace,
        settings.identity or "gpuadm",
        duration=settings.lease_seconds,
        metrics=metrics,
    )
    releaser = Releaser(
        ledger,
        usage,
        holder,
        api,
        PodEvents(api, settings.identity or "gpuadm"),
        leading=elector.leading,
        ready=pods.ready,
        metrics=metrics,
    )
    publisher = QuotaPublisher(
        ledger, usage, holder, api, leading=elector.leading, ready=pods.ready
    )
    usage.on_change(releaser.wake)
    usage.on_change(publisher.wake)
    holder.on_change(releaser.wake_all)
    holder.on_change(publisher.restart)
    elector.on_lead(releaser.wake_all)
    elector.on_lead(publisher.restart)
    log.info("in a cluster: config from ConfigMaps in namespace %s", settings.namespace)
    return create_app(
        settings,
        holder,
        quota=ledger,
        templates=templates,
        claims=ClusterClaims(api),
        metrics=metrics,
        audit=audit,
        tls=tls,
        background=[
            Background("configmaps", config.run),
            Background("pods", pods.run),
            Background("prune", partial(_prune_forever, ledger)),
            Background("claim-templates", templates.run),
            Background("lease", elector.run),
            Background("release", releaser.run),
            Background("publish", publisher.run),
            Background("apiserver-session", api.hold_open),
            *extra,
        ],
        readiness=[config.not_ready_reason, pods.not_ready_reason],
    )


def export_quota(
    metrics: Metrics, ledger: QuotaLedger, holder: ConfigHolder, usage: UsageIndex
) -> None:
    """Export, at each scrape, what the ledger's namespaces hold under the quotas in force,
    and the lines of waiting pods."""
    metrics.watch_quota(lambda: ledger.readings(holder.current.quotas) if holder.loaded else [])
    metrics.watch_queue(lambda: queue_readings(usage, time.time()))


def queue_readings(usage: UsageIndex, now: float) -> list[QueueReading]:
    """Return each line's length and its longest wait, per namespace and class."""
    readings = []
    for namespace in sorted(usage.waiting_namespaces()):
        by_class: dict[str, list[float]] = {}
        for pod in usage.waiting(namespace):
            by_class.setdefault(pod.class_name, []).append(_since(pod.created, now))
        for class_name, waits in sorted(by_class.items()):
            readings.append(QueueReading(namespace, class_name, len(waits), max(waits)))
    return readings


def _since(created: str, now: float) -> float:
    try:
        return max(0.0, now - datetime.fromisoformat(created).timestamp())
    except ValueError:
        return 0.0


async def _prune_forever(ledger: QuotaLedger) -> None:
    while True:
        await asyncio.sleep(PRUNE_SECONDS)
        try:
            await ledger.prune_all()
        except Exception:  # an apiserver error or a bad record must not end pruning for good
            log.exception("pruning the quota records failed; retrying in %.0f s", PRUNE_SECONDS)
