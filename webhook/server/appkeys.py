"""Typed keys of what the aiohttp application holds, for the handlers that read it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from webhook.observe.metrics import Metrics
from webhook.server.drain import Drain

# Each check returns None when ready, else the reason it is not.
ReadinessCheck = Callable[[], str | None]

DRAIN = web.AppKey("drain", Drain)
METRICS = web.AppKey("metrics", Metrics)
READINESS = web.AppKey("readiness", Sequence[ReadinessCheck])
# Checks of the same form whose reasons /readyz shows without failing: a degraded part that
# every replica shares, so that failing readiness would take all of them down.
NOTICES = web.AppKey("notices", Sequence[ReadinessCheck])
