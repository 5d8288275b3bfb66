"""Typed keys of everything the aiohttp application holds."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from certs import CertificateReloader
from webhook.audit import AuditLog
from webhook.config import ConfigHolder
from webhook.metrics import Metrics
from webhook.quota import QuotaGate
from webhook.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
CONFIG = web.AppKey("config", ConfigHolder)
QUOTA = web.AppKey("quota", QuotaGate)
# Each check returns None when ready, else the reason it is not.
READINESS = web.AppKey("readiness", list[Callable[[], str | None]])
METRICS = web.AppKey("metrics", Metrics)
AUDIT = web.AppKey("audit", AuditLog)
TLS_RELOADER = web.AppKey("tls_reloader", CertificateReloader)
