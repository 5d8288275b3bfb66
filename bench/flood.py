"""A small review's latency while a few clients flood gpuadm with large, distinct pods.

Reviews of 64 KiB and more are served at most two at a time per endpoint and planned off the
event loop, so that a tenant sending megabyte pods cannot hold up everyone else's. The small
reviews are the bench's usual 3 KiB ones, sent by vegeta at a fixed rate; the anchor is the
same attack with no flood. The flood's pods are the memory test's: thousands of containers,
each pod different from every other, so that no plan is remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from bench import cpus
from bench.reviews import mutate_and_validate_bodies
from bench.server import Served, serving_gpuadm
from bench.vegeta import Vegeta
from tests.builders import large_pod, review

FLOOD_CLIENTS = 4
SMALL_RATE = 100.0
SMALL_CONNECTIONS = 4
# Stands in the container names of the large pod; each send puts a new tag of this length in.
TAG = b"floodtag"


def flood_figures(vegeta: Path, workdir: Path, *, seconds: float) -> dict[str, Any]:
    """Return p50/p99 of small /mutate reviews with no flood, then during one."""
    small, _ = mutate_and_validate_bodies()
    with cpus.pinned(cpus.GENERATOR_CPU), contextlib.ExitStack() as stack:
        with cpus.pinned(cpus.SERVER_CPU):
            served = stack.enter_context(serving_gpuadm(workdir / "flood"))
        attack = Vegeta(vegeta, served.url, served.ca_file, SMALL_CONNECTIONS, workdir)
        attack.fixed_rate("/mutate", small, rate=SMALL_RATE, seconds=1)  # warm up
        quiet = attack.fixed_rate("/mutate", small, rate=SMALL_RATE, seconds=seconds)
        with Flood(served, clients=FLOOD_CLIENTS) as flood:
            busy = attack.fixed_rate("/mutate", small, rate=SMALL_RATE, seconds=seconds)
    return {
        "rate": SMALL_RATE,
        "clients": FLOOD_CLIENTS,
        "large_review_bytes": len(flood.template),
        "large_answered": flood.answered,
        "quiet": quiet.as_dict(),
        "flood": busy.as_dict(),
    }


def large_review() -> bytes:
    """Return a review of about 900 KiB whose container names hold `TAG`."""
    return orjson.dumps(review(large_pod(TAG.decode())))


class Flood:
    """Clients that each send large, distinct pods to /mutate, one after another.

    They run on an event loop of their own, in a thread, while vegeta measures; the flood is
    under way (one large review answered) before the block starts.
    """

    def __init__(self, served: Served, *, clients: int) -> None:
        """Flood `served` from `clients` connections."""
        self.template = large_review()
        self.answered = 0
        self._served = served
        self._clients = clients
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._task: asyncio.Future[list[None]] | None = None
        self._first = threading.Event()

    def __enter__(self) -> Flood:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        if not self._first.wait(timeout=60):
            raise RuntimeError("the flood's first large review was not answered within 60 s")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        context = ssl.create_default_context(cafile=str(self._served.ca_file))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
        self._task = asyncio.gather(*(self._send_forever() for _ in range(self._clients)))

    async def _stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._session.close()

    async def _send_forever(self) -> None:
        url = f"{self._served.url}/mutate"
        headers = {"Content-Type": "application/json"}
        while True:
            body = self.template.replace(TAG, uuid.uuid4().hex[: len(TAG)].encode())
            async with self._session.post(url, data=body, headers=headers) as answer:
                await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"a large review was answered with HTTP {answer.status}")
            self.answered += 1
            self._first.set()
