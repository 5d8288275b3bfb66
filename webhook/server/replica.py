"""One replica, wired: standalone on files, or in a cluster on ConfigMaps, pods and records."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from aiohttp import web

from certs import CertificateReloader
from webhook.claims.lookup import ClusterClaims
from webhook.claims.templates import ClusterTemplates
from webhook.config.configmap_source import ConfigMapSource
from webhook.config.file_source import FileSource
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore
from webhook.kube.rest import AsyncApi
from webhook.leader.events import EventWriter, PodEvents
from webhook.leader.lease import LeaseElector
from webhook.leader.publish import QuotaPublisher
from webhook.leader.reclaim import CohortKeeper
from webhook.leader.release import Releaser
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.quota.book import ReservationBook
from webhook.quota.configmap_store import ConfigMapStore
from webhook.quota.gang_sizes import GangSizes
from webhook.quota.ledger import QuotaLedger
from webhook.quota.namespaces import KnownNamespaces
from webhook.quota.podwatch import PodWatcher
from webhook.quota.readings import export_quota
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.lifecycle import Background, LeaderOnly, Progress, Supervisor
from webhook.server.settings import Settings

log = logging.getLogger("gpuadm.replica")
# Expired reservations are dropped from the records this often: records stay small, and
# a pruning pass costs one read (and rarely a write) per namespace.
PRUNE_SECONDS = 30.0
# /readyz fails when the config has not been read for this long: standalone, the files are
# polled every `reload_seconds`; in a cluster, each ConfigMap watch call ends within
# `CONFIG_WATCH_SECONDS`, so three missed renewals mean the replica has lost the apiserver.
CONFIG_FILES_STALE_SECONDS = 30.0
CONFIG_WATCH_SECONDS = 30
CONFIG_WATCH_STALE_SECONDS = 3.0 * CONFIG_WATCH_SECONDS


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
    export_quota(metrics, ledger.book, holder, usage)
    # No pods run without a cluster: budgets are judged, against nothing used.
    hours = HoursLedger(RunIndex(), None)
    log.info("standalone: config from %s, quota usage kept in memory", settings.policy_file)
    if config.quotas.has_budgets():
        log.warning(
            "standalone: GPU-hour budgets are judged, but with no cluster no pod runs, so "
            "none is ever spent"
        )
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
        budgets=hours,
        metrics=metrics,
        audit=audit,
        tls=tls,
        background=[
            Background(
                "config-files",
                files.run,
                stale_after=max(CONFIG_FILES_STALE_SECONDS, 10 * settings.reload_seconds),
            )
        ],
    )


def cluster_app(
    settings: Settings,
    api: AsyncApi,
    *,
    audit: AuditLog | None = None,
    tls: CertificateReloader | None = None,
    extra: tuple[Background, ...] = (),
) -> web.Application:
    """Serve from the cluster through `api`: ConfigMaps, the pod watch and shared usage
    records. The app holds `api`'s session open, and closes it when it stops.

    `extra` is more background work for the life of the app (the TLS keeper, on `api` too).
    """
    metrics = Metrics()
    holder = ConfigHolder(metrics=metrics)
    usage = UsageIndex()
    runs = RunIndex(metrics=metrics)
    pods = PodWatcher(api, usage, holder, metrics, followers=(runs,))
    hours = HoursLedger(
        runs,
        HoursStore(api, settings.namespace),
        pods_ready=pods.ready,
        checkpoint_seconds=settings.gpu_hours_checkpoint_seconds,
        bucket_seconds=settings.gpu_hours_bucket_seconds,
        # A new leader takes the Lease over once it went unrenewed for its duration, and
        # tries a fifth as often: within two durations of the last leader's checkpoint.
        handover_seconds=2 * settings.lease_seconds,
        metrics=metrics,
    )
    metrics.watch_hours(lambda: hours.readings(holder.current.quotas) if holder.loaded else [])
    config = ConfigMapSource(
        api,
        settings.namespace,
        holder,
        on_policy_change=pods.request_relist,
        watch_seconds=CONFIG_WATCH_SECONDS,
    )
    gang_sizes = GangSizes(
        api,
        usage,
        strict=lambda namespace: holder.current.quotas.terms(namespace).queueing == "strict",
    )
    ledger = QuotaLedger(
        usage,
        ConfigMapStore(api, settings.namespace, metrics=metrics),
        pods_visible=True,
        usage_ready=pods.ready,
        metrics=metrics,
        namespace_exists=KnownNamespaces(api).exists,
        relist=pods.request_relist,
        holder=settings.identity or "gpuadm",
        gang_size=gang_sizes.size_of,
    )
    log.info("quota: this replica sets room aside as %s", ledger.book.allowances.holder)
    export_quota(metrics, ledger.book, holder, usage)
    templates = ClusterTemplates(api, holder)
    elector = LeaseElector(
        api,
        settings.namespace,
        settings.identity or "gpuadm",
        duration=settings.lease_seconds,
        metrics=metrics,
    )

    def held(namespace: str) -> dict[str, str]:
        """The classes of a namespace's line that wait for their GPU-hour budget, with why."""
        return hours.held(namespace, usage.line(namespace).by_class(), holder.current)

    events = EventWriter(
        PodEvents(api, settings.identity or "gpuadm"),
        usage,
        lambda namespace: ledger.line.placer(
            namespace,
            holder.current.quotas.limits_for(namespace),
            held(namespace),
            gangs=gang_sizes.known(namespace),
            cohort=holder.current.quotas.cohort_of(namespace),
        ),
        ready=lambda: pods.ready() and holder.loaded,
    )
    releaser = Releaser(
        ledger.line,
        usage,
        holder,
        api,
        events,
        leading=elector.leading,
        ready=pods.ready,
        metrics=metrics,
        held=held,
        gang_sizes=gang_sizes,
    )
    publisher = QuotaPublisher(
        ledger.line,
        usage,
        holder,
        api,
        ready=pods.ready,
        # The record only, as of its last checkpoint, not the seconds running since: the
        # published status changes once per checkpoint, not at every pass.
        budget_used=lambda namespace: hours.recorded_use(
            namespace, holder.current.quotas.budgets_for(namespace)
        ),
        gang_sizes=lambda namespace: gang_sizes.known(namespace).sizes,
    )
    keeper = CohortKeeper(
        ledger.line,
        usage,
        holder,
        api,
        leading=elector.leading,
        ready=pods.ready,
        metrics=metrics,
    )
    usage.on_change(releaser.wake)
    usage.on_change(keeper.wake)
    holder.on_change(keeper.wake_all)
    elector.on_lead(keeper.wake_all)
    usage.on_change(publisher.wake)
    holder.on_change(releaser.wake_all)
    holder.on_change(publisher.restart)
    elector.on_lead(releaser.wake_all)
    elector.on_lead(publisher.restart)
    log.info("in a cluster: config from ConfigMaps in namespace %s", settings.namespace)
    supervisor = Supervisor(metrics)
    leader_work = LeaderOnly(
        supervisor,
        elector,
        [
            Background("release", _with_progress(releaser.run)),
            Background("queue-events", events.run),
            Background("publish", publisher.run),
            Background("cohorts", _with_progress(keeper.run)),
            Background(
                "gpu-hours-checkpoint",
                partial(hours.checkpoint_forever, lambda: holder.current.quotas),
            ),
        ],
    )
    return create_app(
        settings,
        holder,
        quota=ledger,
        budgets=hours,
        templates=templates,
        claims=ClusterClaims(api),
        metrics=metrics,
        audit=audit,
        tls=tls,
        supervisor=supervisor,
        background=[
            Background("configmaps", config.run, stale_after=CONFIG_WATCH_STALE_SECONDS),
            Background("pods", pods.run),
            Background("prune", partial(_prune_forever, ledger.book)),
            Background("quota-allowances", ledger.keep_allowances),
            Background("gpu-hours-records", hours.read_forever),
            Background("claim-templates", templates.run),
            Background("lease", elector.run),
            Background("leader-work", leader_work.run),
            Background("apiserver-session", api.hold_open),
            *extra,
        ],
        readiness=[config.not_ready_reason, pods.not_ready_reason],
        # A record every replica reads alike: failing readiness for it would take them all.
        notices=[hours.notice],
    )


async def _prune_forever(book: ReservationBook, progress: Progress) -> None:
    """Drop expired reservations every `PRUNE_SECONDS`; a failed pass is raised, for the
    supervisor to log and retry."""
    while True:
        await asyncio.sleep(PRUNE_SECONDS)
        await book.prune_all()
        progress()


def _with_progress(
    run: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[Progress], Coroutine[Any, Any, None]]:
    """Adapt a loop that reports no progress of its own: it made some by starting."""

    async def adapted(progress: Progress) -> None:
        progress()
        await run()

    return adapted
