"""Keep the served certificate fresh: poll its files and reload them into the live context."""

from __future__ import annotations

import asyncio
import logging

from certs import CertificateReloader
from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.tls")


async def keep_certificate_fresh(
    reloader: CertificateReloader, metrics: Metrics, *, every_seconds: float
) -> None:
    """Poll the certificate files until cancelled; export when the served one expires."""
    metrics.certificate_expiry.set(reloader.not_after.timestamp())
    reported = None
    while True:
        await asyncio.sleep(every_seconds)
        if reloader.check():
            log.info("serving a new certificate, valid until %s", reloader.not_after.isoformat())
            metrics.certificate_expiry.set(reloader.not_after.timestamp())
        if reloader.last_error != reported:
            reported = reloader.last_error
            if reported:
                log.error("new certificate not loaded, the current one stays: %s", reported)
