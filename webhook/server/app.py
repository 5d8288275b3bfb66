"""The aiohttp application factory: routes, decisions bound once, and background work."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial

from aiohttp import web

from certs import CertificateReloader
from webhook.admission import decisions
from webhook.claims.lookup import Claims, NoClaims
from webhook.claims.templates import NoTemplates, Templates
from webhook.config.snapshot import ConfigHolder
from webhook.gpu_hours.gate import BudgetGate, NoBudgets
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.quota.gate import QuotaGate, Unlimited
from webhook.server import handlers
from webhook.server.appkeys import DRAIN, METRICS, NOTICES, READINESS, ReadinessCheck
from webhook.server.budget import RequestBudget
from webhook.server.drain import Drain
from webhook.server.lifecycle import Background, Supervisor
from webhook.server.settings import Settings
from webhook.tls.reloading import TLS_STALE_SECONDS, certificate_problem, keep_certificate_fresh


def create_app(
    settings: Settings,
    config: ConfigHolder,
    *,
    quota: QuotaGate | None = None,
    budgets: BudgetGate | None = None,
    templates: Templates | None = None,
    claims: Claims | None = None,
    metrics: Metrics | None = None,
    audit: AuditLog | None = None,
    tls: CertificateReloader | None = None,
    background: Sequence[Background] = (),
    supervisor: Supervisor | None = None,
    readiness: Sequence[ReadinessCheck] = (),
    notices: Sequence[ReadinessCheck] = (),
    budget: RequestBudget | None = None,
) -> web.Application:
    """Build the whole webhook application; nothing is added to it after this returns.

    `config` holds the config in force; `quota` charges admitted pods (default: unlimited);
    `budgets` judges them against GPU-hour budgets (default: none);
    `templates` makes the ResourceClaimTemplates of dra pods and `claims` reads the claims
    pods name (default: none, as when serving from files); `audit` receives a record per
    decision; `tls` is the certificate reloader of the served
    context, polled for new files; `background` runs while the app serves, under
    `supervisor` (default: a new one), whose stale tasks fail /readyz; `readiness` checks are
    added to the config check behind /readyz, and `notices` are shown by it without failing.
    """
    metrics = metrics if metrics is not None else Metrics()
    tasks = supervisor if supervisor is not None else Supervisor(metrics)
    gate = quota if quota is not None else Unlimited()
    # One byte over the review limit lets the edge tell "too large" apart from a body that
    # happens to be exactly the limit.
    app = web.Application(client_max_size=settings.max_review_bytes + 1)
    app[METRICS] = metrics
    drain = app[DRAIN] = Drain()
    app.on_response_prepare.append(drain.close_after_answer)
    checks: list[ReadinessCheck] = [
        drain.not_ready_reason,
        lambda: None if config.loaded else "no valid config loaded",
        *readiness,
        tasks.not_ready_reason,
    ]
    budget = budget if budget is not None else RequestBudget()
    metrics.watch_budget("large_reading", lambda: budget.large_reading.in_use)
    metrics.watch_budget("decoding", lambda: budget.decoding.in_use)
    endpoint = partial(
        handlers.ReviewEndpoint,
        metrics=metrics,
        audit=audit,
        max_review_bytes=settings.max_review_bytes,
        budget=budget,
        require_client_certificate=settings.client_ca_file is not None,
    )
    mutate = partial(
        decisions.mutate, config=config, templates=templates or NoTemplates(), quota=gate
    )
    validate = partial(
        decisions.validate,
        config=config,
        quota=gate,
        budgets=budgets if budgets is not None else NoBudgets(),
        claims=claims or NoClaims(),
        trusted=decisions.Trusted(settings.trusted_user, settings.claim_controllers),
    )
    app.router.add_post("/mutate", endpoint("mutate", mutate).handle)
    app.router.add_post("/validate", endpoint("validate", validate).handle)
    app.router.add_get("/healthz", handlers.handle_healthz)
    app.router.add_get("/readyz", handlers.handle_readyz)
    app.router.add_get("/metrics", handlers.handle_metrics)
    if audit is not None:
        metrics.watch_audit(audit.reading)
        app.cleanup_ctx.append(partial(_audit_writer, audit))
    work = list(background)
    if tls is not None:
        fresh = partial(keep_certificate_fresh, tls, metrics, every_seconds=settings.reload_seconds)
        work.append(Background("tls-reload", fresh, stale_after=TLS_STALE_SECONDS))
        checks.append(partial(certificate_problem, tls))
    app[READINESS] = tuple(checks)
    app[NOTICES] = tuple(notices)
    metrics.watch_readiness(lambda: all(check() is None for check in app[READINESS]))
    for item in work:
        app.cleanup_ctx.append(tasks.for_app_lifetime(item))
    return app


async def _audit_writer(audit: AuditLog, app: web.Application) -> AsyncIterator[None]:
    """Write audit records for the life of the app; flush every accepted one at shutdown."""
    audit.start()
    yield
    audit.close()
