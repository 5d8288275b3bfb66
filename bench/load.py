"""A small, fast HTTP/1.1 load generator over TLS keep-alive connections.

Closed loop (each connection sends its next request when the last answer arrives) measures
the highest throughput; open loop (requests start on a fixed schedule) measures latency at a
given rate without hiding queueing delay (latency counts from the scheduled start).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """Throughput and latency of one run."""

    requests: int
    seconds: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds

    def percentile(self, p: float) -> float:
        """Latency at percentile p (0-100), in seconds."""
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def _request(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> None:
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:80]!r}")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)


async def closed_loop(
    port: int,
    context: ssl.SSLContext,
    path: str,
    bodies: list[bytes],
    *,
    connections: int,
    seconds: float,
) -> Result:
    """Send as fast as the server answers, on `connections` keep-alive connections."""
    requests = [_request(path, body) for body in bodies]
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        index = offset
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await _exchange(reader, writer, requests[index % len(requests)])
            latencies.append(time.perf_counter() - started)
            index += connections
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return Result(len(latencies), time.perf_counter() - started, latencies)


async def open_loop(
    port: int,
    context: ssl.SSLContext,
    path: str,
    bodies: list[bytes],
    *,
    connections: int,
    rate: float,
    seconds: float,
) -> Result:
    """Start requests at `rate` per second, spread over `connections` connections."""
    requests = [_request(path, body) for body in bodies]
    latencies: list[float] = []
    interval = connections / rate
    total = int(rate * seconds)

    async def worker(offset: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        start = time.perf_counter() + offset / rate
        for n in range(total // connections):
            scheduled = start + n * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await _exchange(reader, writer, requests[(offset + n * connections) % len(requests)])
            latencies.append(time.perf_counter() - scheduled)
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return Result(len(latencies), time.perf_counter() - started, latencies)
