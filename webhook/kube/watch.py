"""Run a blocking Kubernetes watch in a daemon thread and hand its events to the event loop.

The official client is synchronous. A watch blocks for as long as it is open, so it runs in
a thread of its own, not the default executor, which the loop waits for when it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

Event = dict[str, Any]


async def consume_watch(
    start: Callable[[], Iterator[Event]], handle: Callable[[Event], None]
) -> None:
    """Run `start()` in a thread and call `handle` on the loop for each event, in order.

    Returns when the watch ends (the server closed it at its timeout); raises what the
    watch raised.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(kind: str, item: Any) -> None:
        # A closed loop means the process is shutting down: the event has nowhere to go.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, (kind, item))

    def pump() -> None:
        try:
            for event in start():
                put("event", event)
        except Exception as error:
            put("error", error)
        else:
            put("end", None)

    threading.Thread(target=pump, name="gpuadm-watch", daemon=True).start()
    while True:
        kind, item = await queue.get()
        if kind == "event":
            handle(item)
        elif kind == "end":
            return
        else:
            raise item
