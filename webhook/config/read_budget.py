"""Every config read has a time budget, and a read past it is left behind, never waited on.

The loader bounds what a document may cost (size, nesting, aliases, nodes, no loops), so a
read ends; the budget is the second wall. A read runs in a daemon thread of its own: a
replica whose read overruns answers from the last good config, its event loop never waits
on the parser, and SIGTERM still ends it, since a daemon thread holds no process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from policies import ConfigError

T = TypeVar("T")

# A config of a few KiB reads in milliseconds; the largest a ConfigMap holds (1 MiB, some
# 28,000 namespaces) in 5 to 15 seconds on two busy cores. Under the 30 s in which a config
# source must show progress, so that a slow read never makes a replica unready.
READ_BUDGET_SECONDS = 20.0
# Reads left running past their budget, at most, before further reads are refused outright:
# each one holds a thread and CPU until the parser ends.
MAX_OVERRUNNING = 2

_overrunning: set[threading.Thread] = set()


def _overran(source: str, seconds: float) -> ReadOverran:
    return ReadOverran(
        source,
        [f"{source}: not read within {seconds:g} s, and abandoned"],
    )


class ReadOverran(ConfigError):
    """A read took longer than its budget and was left to end on its own, or was not
    started while earlier ones still run: no verdict on the text, which a calmer moment
    may read."""


def _start(
    work: Callable[[], T],
    on_done: Callable[[T | None, BaseException | None], None],
    source: str,
) -> threading.Thread:
    """Run `work` in a daemon thread of its own, then `on_done(result, error)` there."""
    _overrunning.intersection_update({t for t in _overrunning if t.is_alive()})
    if len(_overrunning) >= MAX_OVERRUNNING:
        raise ReadOverran(
            source,
            [
                f"{source}: not read, since {len(_overrunning)} earlier reads still run past "
                "their budget; the next edit or poll tries again"
            ],
        )

    def run() -> None:
        try:
            result = work()
        except BaseException as error:  # handed to the waiting side whole
            on_done(None, error)
        else:
            on_done(result, None)

    thread = threading.Thread(target=run, name="gpuadm-config-read", daemon=True)
    thread.start()
    return thread


async def read_within(
    work: Callable[[], T], *, source: str, seconds: float = READ_BUDGET_SECONDS
) -> T:
    """Return what `work()` returns, or raise what it raises; raise `ConfigError` naming
    `source` if it takes more than `seconds`, leaving it to end on its own."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def hand_over(result: T | None, error: BaseException | None) -> None:
        # A loop closed while the read ran has nobody waiting for it any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    thread = _start(work, hand_over, source)
    try:
        return await asyncio.wait_for(done, seconds)
    except TimeoutError:
        _overrunning.add(thread)
        raise _overran(source, seconds) from None


def read_within_blocking(
    work: Callable[[], T], *, source: str, seconds: float = READ_BUDGET_SECONDS
) -> T:
    """Like `read_within`, for a command that has no event loop."""
    outcome: list[tuple[T | None, BaseException | None]] = []
    thread = _start(work, lambda result, error: outcome.append((result, error)), source)
    thread.join(seconds)
    if not outcome:
        _overrunning.add(thread)
        raise _overran(source, seconds)
    result, error = outcome[0]
    if error is not None:
        raise error
    return result  # type: ignore[return-value]
