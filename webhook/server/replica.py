"""One replica, wired: standalone on files, or in a cluster on ConfigMaps, pods and records."""

from __future__ import annotations

import asyncio
import logging
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
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
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
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False, metrics=metrics)
    export_quota(metrics, ledger, holder)
    log.info("standalone: config from %s, quota usage kept in memory", settings.policy_file)
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
    export_quota(metrics, ledger, holder)
    templates = ClusterTemplates(api, holder)
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
            Background("apiserver-session", api.hold_open),
            *extra,
        ],
        readiness=[config.not_ready_reason, pods.not_ready_reason],
    )


def export_quota(metrics: Metrics, ledger: QuotaLedger, holder: ConfigHolder) -> None:
    """Export, at each scrape, what the ledger's namespaces hold under the quotas in force."""
    metrics.watch_quota(lambda: ledger.readings(holder.current.quotas) if holder.loaded else [])


async def _prune_forever(ledger: QuotaLedger) -> None:
    while True:
        await asyncio.sleep(PRUNE_SECONDS)
        try:
            await ledger.prune_all()
        except Exception:  # an apiserver error or a bad record must not end pruning for good
            log.exception("pruning the quota records failed; retrying in %.0f s", PRUNE_SECONDS)
