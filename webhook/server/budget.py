"""What one replica spends on requests in flight, bounded so that no caller can sink it.

A review costs memory three ways before it is answered: its connection (a TLS session and
aiohttp's buffers, about 50 KiB even when idle), its body while it is read, and its decoded
JSON while it is judged. The decoded JSON is the large one, and it does not follow the body's
size: 7 MiB of `{},{},...` decodes to 168 MiB of Python objects, 7 MiB of a real pod's JSON
to about 45. So each is bounded on its own:

- connections: at most `server.listener.MAX_CONNECTIONS` at once, each TLS handshake within
  `HANDSHAKE_SECONDS` of that module;
- bodies: read within `READ_SECONDS`; a large one (from `LARGE_REVIEW_BYTES`) first takes
  its announced length from a budget of `LARGE_READ_BYTES`, so stalled senders hold that
  budget and no more, and only until their time is up;
- decoded reviews: each takes `decoded_weight(body)`, an upper bound of what it decodes to,
  from `DECODE_BYTES` before it is decoded, and gives it back once answered. Large reviews
  may hold `LARGE_DECODE_BYTES` of it at most, so small reviews always find room.

A wait for any of these ends with the request's deadline, `READ_SECONDS` from its arrival:
the caller gets a 503 asking it to retry, never an answer that came too late to matter.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

MiB = 1024 * 1024
# The apiserver sends a review's body at once, and gives up on a webhook after its
# timeoutSeconds (10 by default, 30 at most). A body not read by then has no one to answer.
READ_SECONDS = 10.0
# Announced bytes of large bodies read at once: four reviews of the largest size.
LARGE_READ_BYTES = 32 * MiB
# Decoded reviews in flight, weighed by `decoded_weight`. A replica's own state (the usage
# index of 100,000 pods, the plan memo, the connections) takes up to about 250 MiB of the
# chart's 512 MiB limit; this is the rest, with room for the allocator's slack.
DECODE_BYTES = 160 * MiB
# Of which large reviews may hold at most this much: 48 MiB always stays for the rest.
LARGE_DECODE_BYTES = 112 * MiB


class BudgetExceeded(Exception):
    """A request asks for more than its budget could ever give."""


class ByteBudget:
    """A weighted, first-come-first-served semaphore over bytes.

    Holders take what they need and give it back on leaving; a holder that does not fit waits,
    and holds back those behind it, so a large request is not starved by small ones.
    """

    def __init__(self, capacity: int) -> None:
        """Hand out at most `capacity` bytes at once."""
        self.capacity = capacity
        self.in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @asynccontextmanager
    async def hold(self, amount: int) -> AsyncIterator[None]:
        """Hold `amount` bytes for the body of the `async with`; raise `BudgetExceeded` for
        more than the whole capacity."""
        await self._acquire(amount)
        try:
            yield
        finally:
            self._release(amount)

    async def _acquire(self, amount: int) -> None:
        if amount > self.capacity:
            raise BudgetExceeded(f"{amount} bytes is more than the {self.capacity}-byte budget")
        if not self._waiters and self.in_use + amount <= self.capacity:
            self.in_use += amount
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (amount, granted)
        self._waiters.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release(amount)  # granted as the wait was given up: hand it on
            else:
                self._waiters.remove(entry)
                self._grant()  # those behind it may fit now
            raise

    def _release(self, amount: int) -> None:
        self.in_use -= amount
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.in_use + self._waiters[0][0] <= self.capacity:
            amount, granted = self._waiters.popleft()
            self.in_use += amount
            granted.set_result(None)


class RequestBudget:
    """The budgets every review endpoint of one replica shares."""

    def __init__(
        self,
        *,
        large_read_bytes: int = LARGE_READ_BYTES,
        decode_bytes: int = DECODE_BYTES,
        large_decode_bytes: int = LARGE_DECODE_BYTES,
        read_seconds: float = READ_SECONDS,
    ) -> None:
        """Share the given budgets; each request must be read and let in within
        `read_seconds`."""
        self.large_reading = ByteBudget(large_read_bytes)
        self.decoding = ByteBudget(decode_bytes)
        self.large_decoding = ByteBudget(large_decode_bytes)
        self.read_seconds = read_seconds

    def decode_room(self, large: bool) -> int:
        """Return the most a single review may weigh, large or not."""
        return self.large_decoding.capacity if large else self.decoding.capacity
