"""Background work that lives as long as the app: one supervised way to run every loop.

Every poller, watch and leader pass is a `Background`: a name, and a coroutine function that
runs until it is cancelled, calling `progress()` each time it has done a unit of work (a list,
a watch call that ended normally, a poll, a pass). The `Supervisor` runs each one for the life
of the app, with aiohttp's recipe (create the task, yield while the app serves, cancel, await)
and, in between, never lets it die:

- whatever the work raises, or a return, is a failure: logged once with its reason (an
  apiserver error as a warning; anything else as an error, with its traceback), counted in
  `gpuadm_task_restarts_total{task}`, and followed by a restart after a backoff that doubles
  from 1 s to 30 s, and starts again at 1 s once the work has made progress;
- the same failure again is not logged again for ten minutes; the first progress after a
  failure is logged as a recovery;
- `gpuadm_task_last_success_age_seconds{task}` says how long ago each task last made
  progress, and a task given a `stale_after` makes /readyz fail while it has made none for
  that long.

Leader-only work (`LeaderOnly`) runs only while this replica holds the Lease: it is started
when the replica becomes the leader and cancelled when it stops being one, so no loop of it
asks whether it leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aiohttp import web

from webhook.kube.errors import KubeError
from webhook.observe.metrics import Metrics
from webhook.observe.readings import TaskReading

log = logging.getLogger("gpuadm.tasks")

Progress = Callable[[], None]

FIRST_BACKOFF_SECONDS = 1.0
# During an outage, still try twice a minute: recovery is noticed soon, and a struggling
# apiserver is not hammered by every replica at once.
MAX_BACKOFF_SECONDS = 30.0
# A failure that repeats is logged again this often, with how many restarts it has cost.
RELOG_SECONDS = 600.0
# How often leader-only work checks that the Lease is still held, between the elector's
# own notices: well under the time the Lease takes to pass to another replica.
LEADERSHIP_CHECK_SECONDS = 1.0


class Background(NamedTuple):
    """A named piece of work that runs until it is cancelled, reporting its progress.

    `stale_after`: /readyz fails while the work has made no progress for this many seconds.
    """

    name: str
    run: Callable[[Progress], Coroutine[Any, Any, None]]
    stale_after: float | None = None


@dataclass(slots=True)
class _TaskState:
    started: float
    last_success: float | None = None
    running: bool = False
    failure: str | None = None
    failure_logged_at: float = 0.0
    restarts: int = 0


class Supervisor:
    """Runs background work for the life of the app, restarting whatever fails."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        first_backoff: float = FIRST_BACKOFF_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Count restarts in `metrics`; measure ages on `clock`; wait out backoffs by `sleep`."""
        self.metrics = metrics
        self.clock = clock
        self.sleep = sleep
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self._tasks: dict[str, tuple[Background, _TaskState]] = {}
        metrics.watch_tasks(self.readings)

    def for_app_lifetime(
        self, work: Background
    ) -> Callable[[web.Application], AsyncIterator[None]]:
        """Return a cleanup context that supervises `work` while the app serves."""

        async def context(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(self.supervise(work), name=work.name)
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        return context

    async def supervise(self, work: Background) -> None:
        """Run `work` until cancelled, restarting it after every failure."""
        state = _TaskState(started=self.clock())
        self._tasks[work.name] = (work, state)
        backoff = self.first_backoff
        try:
            while True:
                state.running = True
                made_progress = False

                def progress() -> None:
                    nonlocal made_progress
                    made_progress = True
                    self._progressed(work.name, state)

                try:
                    await work.run(progress)
                    failure: BaseException | None = None
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    failure = error
                state.running = False
                if made_progress:
                    backoff = self.first_backoff
                self._failed(work.name, state, failure, backoff)
                await self.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
        finally:
            state.running = False

    def _progressed(self, name: str, state: _TaskState) -> None:
        state.last_success = self.clock()
        if state.failure is not None:
            log.info("task %s recovered (%d restarts)", name, state.restarts)
            state.failure = None

    def _failed(
        self, name: str, state: _TaskState, error: BaseException | None, backoff: float
    ) -> None:
        state.restarts += 1
        self.metrics.task_restarts.labels(name).inc()
        reason = "it returned" if error is None else f"{type(error).__name__}: {error}"
        now = self.clock()
        if reason == state.failure and now - state.failure_logged_at < RELOG_SECONDS:
            log.debug("task %s failed again, restarting in %.0f s: %s", name, backoff, reason)
            return
        again = " again" if reason == state.failure else ""
        state.failure, state.failure_logged_at = reason, now
        if isinstance(error, KubeError):
            log.warning(
                "task %s failed%s (%d restarts), restarting in %.0f s: %s",
                *(name, again, state.restarts, backoff, reason),
            )
        else:
            log.error(
                "task %s failed%s (%d restarts), restarting in %.0f s: %s",
                *(name, again, state.restarts, backoff, reason),
                exc_info=error,
            )

    def readings(self) -> list[TaskReading]:
        """Return each task's restarts and the age of its last progress, for the metrics."""
        now = self.clock()
        return [
            TaskReading(name, state.running, now - (state.last_success or state.started))
            for name, (_, state) in sorted(self._tasks.items())
        ]

    def not_ready_reason(self) -> str | None:
        """Say which tasks with a bound have made no progress within it, or None."""
        now = self.clock()
        stale = []
        for name, (work, state) in sorted(self._tasks.items()):
            if work.stale_after is None:
                continue
            age = now - (state.last_success or state.started)
            if age > work.stale_after:
                why = f": {state.failure}" if state.failure else ""
                stale.append(
                    f"{name} has made no progress for {age:.0f} s "
                    f"(allowed {work.stale_after:.0f} s){why}"
                )
        return "; ".join(stale) or None


class Leadership(Protocol):
    """What leader-only work needs of the elector."""

    def leading(self) -> bool:
        """Tell whether this replica holds the Lease now."""

    def on_lead(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time this replica becomes the leader."""

    def on_lose(self, listener: Callable[[], None]) -> None:
        """Call `listener()` each time this replica stops being the leader."""


class LeaderOnly:
    """Work that runs, supervised, only while this replica leads."""

    def __init__(
        self,
        supervisor: Supervisor,
        leadership: Leadership,
        work: Sequence[Background],
        *,
        check_seconds: float = LEADERSHIP_CHECK_SECONDS,
    ) -> None:
        """Run `work` under `supervisor` whenever `leadership` says this replica leads."""
        self.supervisor = supervisor
        self.leadership = leadership
        self.work = tuple(work)
        self.check_seconds = check_seconds
        self._changed = asyncio.Event()
        leadership.on_lead(self._changed.set)
        leadership.on_lose(self._changed.set)

    async def run(self, progress: Progress) -> None:
        """Start the work on becoming the leader, stop it on losing the Lease; until cancelled."""
        while True:
            await self._until(lambda: self.leadership.leading())
            tasks = [
                asyncio.create_task(self.supervisor.supervise(w), name=w.name) for w in self.work
            ]
            log.info("leading: started %s", ", ".join(w.name for w in self.work))
            progress()
            try:
                await self._until(lambda: not self.leadership.leading())
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            log.info("no longer leading: stopped %s", ", ".join(w.name for w in self.work))
            progress()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.check_seconds)
