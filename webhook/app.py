"""The aiohttp application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from webhook import http
from webhook.audit import AuditLog
from webhook.config import ConfigHolder
from webhook.files import watch_files
from webhook.keys import AUDIT, CONFIG, METRICS, QUOTA, READINESS, SETTINGS
from webhook.metrics import Metrics
from webhook.quota import QuotaGate, Unlimited
from webhook.settings import Settings
from webhook.tls import reload_certificates


def create_app(
    settings: Settings,
    config: ConfigHolder,
    *,
    quota: QuotaGate | None = None,
    metrics: Metrics | None = None,
    audit: AuditLog | None = None,
) -> web.Application:
    """Build the webhook application: routes, state and background work."""
    # One byte over the review limit lets the edge tell "too large" apart from a body that
    # happens to be exactly the limit.
    app = web.Application(client_max_size=settings.max_review_bytes + 1)
    app[SETTINGS] = settings
    app[CONFIG] = config
    app[QUOTA] = quota if quota is not None else Unlimited()
    app[METRICS] = metrics if metrics is not None else Metrics()
    if audit is not None:
        app[AUDIT] = audit
        app.cleanup_ctx.append(_run_audit)
    app[READINESS] = [lambda: None if config.loaded else "no valid config loaded"]
    app.router.add_post("/mutate", http.handle_mutate)
    app.router.add_post("/validate", http.handle_validate)
    app.router.add_get("/healthz", http.handle_healthz)
    app.router.add_get("/readyz", http.handle_readyz)
    app.router.add_get("/metrics", http.handle_metrics)
    app.cleanup_ctx.append(watch_files)
    app.cleanup_ctx.append(reload_certificates)
    return app


async def _run_audit(app: web.Application) -> AsyncIterator[None]:
    """Write audit records for the life of the app; flush every accepted one at shutdown."""
    audit = app[AUDIT]
    audit.start()
    yield
    audit.close()
