"""Work on a review's pod, done where it costs the other reviews least."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from webhook.reviews.request import LARGE_REVIEW_BYTES

P = ParamSpec("P")
T = TypeVar("T")


async def in_turn(size: int, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call `call` for a review of `size` bytes: on the loop if small, else in a thread.

    Work on a pod is linear in its size: well under a millisecond for a typical review, so
    a thread hand-off would cost more than it saves; tens of milliseconds for a pod of a
    megabyte, which in a thread no longer holds up every other review.
    """
    if size < LARGE_REVIEW_BYTES:
        return call(*args, **kwargs)
    return await asyncio.to_thread(call, *args, **kwargs)
