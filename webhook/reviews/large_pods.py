"""Work on a review's pod, done where it costs the other reviews least: a large pod's in a
thread of its own, a small one's on the event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from webhook.reviews.request import LARGE_REVIEW_BYTES

P = ParamSpec("P")
T = TypeVar("T")

# Threads for large pods. Planning is pure Python, so more threads than cores buy nothing;
# and each thread that has held a large pod keeps its own malloc arena at its high-water
# mark, so a few threads keep the process's memory bounded where the default executor's
# many would each grow one.
LARGE_POD_THREADS = 2
_LARGE_POD_WORK = ThreadPoolExecutor(
    max_workers=LARGE_POD_THREADS, thread_name_prefix="gpuadm-large-pod"
)


async def off_loop_if_large(
    size: int, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """Call `call` for a review of `size` bytes: on the loop if small, else in a thread.

    Work on a pod is linear in its size: well under a millisecond for a typical review, so
    a thread hand-off would cost more than it saves; tens of milliseconds for a pod of a
    megabyte, which in a thread no longer holds up every other review.
    """
    if size < LARGE_REVIEW_BYTES:
        return call(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_LARGE_POD_WORK, functools.partial(call, *args, **kwargs))
