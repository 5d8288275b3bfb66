"""Keep the served certificate fresh: poll its files and reload them into the live context."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from certs import CertificateReloader
from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.tls")

# The reload poller checks every second or so; this long without a finished check means it
# is stuck, and a replica that cannot take a renewed certificate should not take traffic.
TLS_STALE_SECONDS = 60.0


async def keep_certificate_fresh(
    reloader: CertificateReloader,
    metrics: Metrics,
    progress: Callable[[], None] = lambda: None,
    *,
    every_seconds: float,
) -> None:
    """Poll the certificate files until cancelled; export when the served one expires.

    `progress` is called after each check, whether or not the files held a new pair: a bad
    pair keeps the served certificate, which `certificate_problem` judges on its own.
    """
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
        progress()


def certificate_problem(
    reloader: CertificateReloader, now: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> str | None:
    """Say why the served certificate cannot serve (it has expired), or None."""
    if reloader.not_after <= now():
        return f"the served certificate expired at {reloader.not_after.isoformat()}"
    return None
