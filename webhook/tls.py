"""Keep the served certificate fresh: poll its files and reload them into the live context."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from certs import CertificateReloader
from webhook.keys import METRICS, SETTINGS, TLS_RELOADER
from webhook.metrics import Metrics

log = logging.getLogger("gpuadm.tls")


async def reload_certificates(app: web.Application) -> AsyncIterator[None]:
    """Poll the certificate files for the life of the application, when serving TLS."""
    reloader = app.get(TLS_RELOADER)
    if reloader is None:
        yield
        return
    metrics = app[METRICS]
    metrics.certificate_expiry.set(reloader.not_after.timestamp())
    task = asyncio.create_task(_poll(reloader, metrics, app[SETTINGS].reload_seconds))
    yield
    task.cancel()


async def _poll(reloader: CertificateReloader, metrics: Metrics, every: float) -> None:
    reported = None
    while True:
        await asyncio.sleep(every)
        if reloader.check():
            log.info("serving a new certificate, valid until %s", reloader.not_after.isoformat())
            metrics.certificate_expiry.set(reloader.not_after.timestamp())
        if reloader.last_error != reported:
            reported = reloader.last_error
            if reported:
                log.error("new certificate not loaded, the current one stays: %s", reported)
