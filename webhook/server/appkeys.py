"""Typed keys of what the aiohttp application holds, for the handlers that read it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from webhook.observe.metrics import Metrics
from webhook.server.drain import Drain
from webhook.server.incoming import Routes

# Each check returns None when ready, else the reason it is not.
ReadinessCheck = Callable[[], str | None]

DRAIN = web.AppKey("drain", Drain)
METRICS = web.AppKey("metrics", Metrics)
READINESS = web.AppKey("readiness", Sequence[ReadinessCheck])
# Every route, for servers other than aiohttp's own router (HTTP/2), and the most bytes a
# body may have, as aiohttp's `client_max_size`.
ROUTES: web.AppKey[Routes] = web.AppKey("routes")
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
