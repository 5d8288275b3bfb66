"""Background work that lives as long as the app: one way to start and stop it.

aiohttp's recipe, used for every poller and watcher: create the task, yield while the app
serves, then cancel the task and await it. A task that fails while the app serves is logged
at once, with its traceback, and its failure is raised again at shutdown, never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NamedTuple

from aiohttp import web

log = logging.getLogger("gpuadm.server")


class Background(NamedTuple):
    """A named piece of work that runs until it is cancelled."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]


def run_for_app_lifetime(work: Background) -> Callable[[web.Application], AsyncIterator[None]]:
    """Return a cleanup context that runs `work` while the app serves."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(work.run(), name=work.name)
        task.add_done_callback(_report_failure)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


def _report_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error("background task %s stopped: %s", task.get_name(), error, exc_info=error)
