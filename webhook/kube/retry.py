"""Keep work against the apiserver going, backing off while the apiserver fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

from webhook.kube.client import KubeError

# A blip (an apiserver restart, a dropped connection) heals within a second or two.
FIRST_BACKOFF_SECONDS = 1.0
# During an outage, still try twice a minute: recovery is noticed soon, and a struggling
# apiserver is not hammered by every replica at once.
MAX_BACKOFF_SECONDS = 30.0

Attempt = Callable[[Callable[[], None]], Awaitable[None]]


async def retry_forever(attempt: Attempt, *, what: str, log: logging.Logger) -> NoReturn:
    """Run `attempt` again and again until cancelled; after a `KubeError`, wait first.

    The wait doubles with each failure, up to `MAX_BACKOFF_SECONDS`. `attempt` is given a
    `healthy` callback to call once it has made progress (a list succeeded), so that the next
    failure waits `FIRST_BACKOFF_SECONDS` again.
    """
    backoff = FIRST_BACKOFF_SECONDS

    def healthy() -> None:
        nonlocal backoff
        backoff = FIRST_BACKOFF_SECONDS

    while True:
        try:
            await attempt(healthy)
        except KubeError as error:
            log.warning("%s failed (retrying in %.0f s): %s", what, backoff, error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
