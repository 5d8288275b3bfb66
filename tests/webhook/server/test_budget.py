"""Every request has a budget: compressed, stalled, heavy and abandoned bodies, and the
connection limit, each met with a clear answer while other reviews are still served."""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from certs import new_ca, new_serving_cert, server_ssl_context, write_tls_dir
from tests.builders import pod, review
from tests.webhook.server.test_server import snapshot
from webhook.config.snapshot import ConfigHolder
from webhook.observe.metrics import Metrics
from webhook.reviews.request import (
    LARGE_REVIEW_BYTES,
    AdmissionRequest,
    decode_review,
    decoded_weight,
)
from webhook.server import handlers, listener
from webhook.server.app import create_app
from webhook.server.budget import BudgetExceeded, ByteBudget, MiB, RequestBudget
from webhook.server.listener import LimitedSite
from webhook.server.settings import Settings

JSON = {"Content-Type": "application/json"}


class Served:
    """An app served on loopback as `gpuadm serve` serves it (runner options and site)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = 0
        self.runner = web.AppRunner(app, **listener.RUNNER_OPTIONS)
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await self.runner.setup()
        site = LimitedSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]
        self.session = aiohttp.ClientSession(f"http://127.0.0.1:{self.port}")

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.runner.cleanup()

    async def send(
        self, path: str, data: bytes, headers: dict[str, str] = JSON
    ) -> aiohttp.ClientResponse:
        assert self.session is not None
        async with self.session.post(path, data=data, headers=headers) as response:
            await response.read()
            return response

    async def review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.send(path, orjson.dumps(body))
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = (await response.json())["response"]
        assert answer["uid"] == body["request"]["uid"]
        return answer


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[Served]:
    running = Served(app)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def heavy_review(objects: int, uid: str = "heavy") -> bytes:
    """A pod review whose status holds `objects` empty objects: few bytes, much to decode."""
    body = review(pod({"gpuadm.io/h100": "1"}), uid=uid)
    body["request"]["object"]["status"] = {"conditions": [{}] * objects}
    return orjson.dumps(body)


def small_review(uid: str) -> dict[str, Any]:
    return review(pod({"gpuadm.io/h100": "1"}), uid=uid)


async def test_a_budget_hands_out_bytes_first_come_first_served() -> None:
    budget = ByteBudget(100)
    order: list[str] = []

    async def holder(name: str, amount: int, release: asyncio.Event) -> None:
        async with budget.hold(amount):
            order.append(name)
            await release.wait()

    first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
    big = asyncio.create_task(holder("big", 80, first))
    await asyncio.sleep(0)
    waiting_large = asyncio.create_task(holder("large", 60, second))
    await asyncio.sleep(0)
    # 10 bytes would fit beside the 80 held, but the 60 waiting came first.
    waiting_small = asyncio.create_task(holder("small", 10, third))
    await asyncio.sleep(0)
    assert order == ["big"]
    assert budget.in_use == 80
    first.set()
    await big
    await asyncio.sleep(0)
    assert order == ["big", "large", "small"]
    assert budget.in_use == 70
    second.set()
    third.set()
    await asyncio.gather(waiting_large, waiting_small)
    assert budget.in_use == 0


async def test_a_waiter_that_gives_up_lets_those_behind_it_through() -> None:
    budget = ByteBudget(100)
    release = asyncio.Event()

    async def hold(amount: int) -> None:
        async with budget.hold(amount):
            await release.wait()

    held = asyncio.create_task(hold(90))
    await asyncio.sleep(0)
    blocked = asyncio.create_task(hold(50))
    behind = asyncio.create_task(hold(10))
    await asyncio.sleep(0)
    assert budget.in_use == 90
    blocked.cancel()
    await asyncio.sleep(0)
    assert budget.in_use == 100  # the 10 behind it got in at once
    release.set()
    await asyncio.gather(held, behind)
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert budget.in_use == 0


async def test_more_than_the_whole_budget_is_refused() -> None:
    with pytest.raises(BudgetExceeded):
        async with ByteBudget(10).hold(11):
            pass


def test_the_decoded_weight_bounds_what_decoding_really_takes() -> None:
    for body in (
        heavy_review(20_000),
        orjson.dumps(small_review("w")),
        b"[" + b"1.5," * 9999 + b"1]",
    ):
        tracemalloc.start()
        decoded = orjson.loads(body)
        taken, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert decoded is not None
        assert taken <= decoded_weight(body) <= 80 * max(len(body), taken // 10)


@pytest.fixture
async def server() -> AsyncIterator[Served]:
    budget = RequestBudget(read_seconds=1.0)
    async with served(create_app(Settings(), ConfigHolder(snapshot()), budget=budget)) as running:
        yield running


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        pytest.param("gzip", gzip.compress(b" " * (7 * MiB)), id="gzip-bomb"),
        pytest.param("deflate", zlib.compress(b"[{}," * 100_000), id="deflate"),
        pytest.param("gzip", b"\x1f\x8b not really gzip", id="garbage-gzip"),
        pytest.param("br", b"\x00\x01", id="brotli"),
    ],
)
async def test_a_compressed_body_is_refused_unread(
    server: Served, encoding: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    headers = JSON | {"Content-Encoding": encoding}
    response = await server.send("/mutate", body, headers)
    assert response.status == 415
    assert f"Content-Encoding '{encoding}' is not accepted" in (await response.json())["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_review_too_heavy_to_decode_is_a_413_naming_the_cost(server: Served) -> None:
    body = heavy_review(700_000)  # 2.8 MiB that would decode to about 30 MiB of objects
    assert decoded_weight(body) > RequestBudget().large_decoding.capacity
    response = await server.send("/validate", body)
    assert response.status == 413
    assert "MiB to decode, more than the 112 MiB" in (await response.json())["error"]
    # A review of the same pod that decodes to what it says is judged as ever.
    await server.review("/validate", small_review("after"))


async def _stalled_post(port: int, path: str, announced: int, sent: bytes) -> bytes:
    """POST announcing `announced` bytes, send `sent` of them, and wait for an answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {announced}\r\n\r\n"
    )
    writer.write(head.encode() + sent)
    await writer.drain()
    answer = await reader.read(4096)
    writer.close()
    return answer


async def test_stalled_senders_time_out_and_hold_back_no_one(server: Served) -> None:
    port = server.port
    # Three senders that announce large bodies and stall (the old large-review slots were
    # two), and one that announces a small body and stalls.
    stalled = [
        asyncio.create_task(_stalled_post(port, "/mutate", 100_000, b'{"kind"')) for _ in range(3)
    ] + [asyncio.create_task(_stalled_post(port, "/mutate", 500, b"{"))]
    await asyncio.sleep(0.1)
    # A legitimate large review and small ones are answered while they stall.
    large = review(pod({"gpuadm.io/h100": "1"}, annotations={"big": "x" * 70_000}), uid="large")
    assert len(orjson.dumps(large)) > LARGE_REVIEW_BYTES
    await server.review("/mutate", large)
    for index in range(5):
        await server.review("/mutate", small_review(f"s{index}"))
    assert not any(task.done() for task in stalled)
    for answer in await asyncio.wait_for(asyncio.gather(*stalled), timeout=30):
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"not received and let in within 1 s" in answer


async def test_a_caller_that_hangs_up_is_no_error(
    server: Served, caplog: pytest.LogCaptureFixture
) -> None:
    port = server.port
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    await writer.drain()
    await asyncio.sleep(0.1)
    writer.transport.abort()
    await asyncio.sleep(0.2)
    await server.review("/mutate", small_review("next"))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_heavy_reviews_wait_their_turn_and_small_ones_pass_them() -> None:
    # A budget with room for one heavy review at a time: the others wait, the small ones
    # beside them do not.
    heavy = heavy_review(40_000)
    assert len(heavy) >= LARGE_REVIEW_BYTES
    weight = decoded_weight(heavy)
    budget = RequestBudget(large_decode_bytes=weight, decode_bytes=weight + 8 * MiB)
    app = create_app(Settings(), ConfigHolder(snapshot()), budget=budget)
    peak = 0
    async with served(app) as server:

        async def send_heavy(index: int) -> int:
            nonlocal peak
            response = await server.send("/validate", heavy_review(40_000, f"h{index}"))
            peak = max(peak, budget.large_decoding.in_use)
            return response.status

        heavy_ones = [asyncio.create_task(send_heavy(index)) for index in range(4)]
        for index in range(10):
            await server.review("/validate", small_review(f"s{index}"))
        assert await asyncio.gather(*heavy_ones) == [200] * 4
    assert peak <= weight
    assert budget.decoding.in_use == budget.large_decoding.in_use == 0


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@pytest.fixture
async def limited() -> AsyncIterator[tuple[int, Metrics]]:
    app = web.Application()
    app.router.add_get("/", _hello)
    metrics = Metrics()
    runner = web.AppRunner(app)
    await runner.setup()
    site = LimitedSite(
        runner,
        "127.0.0.1",
        0,
        max_connections=3,
        on_refused=metrics.connections_refused.inc,
        on_opened=metrics.connections_opened.inc,
    )
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.base_events.Server)
    yield server.sockets[0].getsockname()[1], metrics
    await runner.cleanup()


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    return await reader.read(4096)


async def test_connections_over_the_limit_are_closed_and_counted(
    limited: tuple[int, Metrics],
) -> None:
    port, metrics = limited
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for reader, writer in held:
        assert b"hello" in await _get(reader, writer)
    over = await asyncio.open_connection("127.0.0.1", port)
    over[1].write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await over[0].read(4096) == b""  # closed, nothing served
    assert metrics.connections_refused._value.get() == 1
    # Once one of the three goes, a new connection is served again.
    held[0][1].close()
    await held[0][1].wait_closed()
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert b"hello" in await _get(reader, writer)
    assert metrics.connections_opened._value.get() == 4  # the refused one is not counted
    for _, other in (*held[1:], (reader, writer)):
        other.close()


async def test_connections_closed_at_once_free_their_place_at_once(
    limited: tuple[int, Metrics],
) -> None:
    """A burst's connections are short: the apiserver closes each it opened past the 25 it
    keeps idle as soon as its call is answered. Ten times the limit of them, one after
    another within a second, are all served: none is counted once it is gone."""
    port, metrics = limited
    for _ in range(30):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert b"hello" in await _get(reader, writer)
        writer.close()
        await writer.wait_closed()
    assert metrics.connections_refused._value.get() == 0
    assert metrics.connections_opened._value.get() == 30


async def test_a_caller_that_speaks_http2_unasked_is_refused_and_served_nothing(
    limited: tuple[int, Metrics],
) -> None:
    """HTTP/2 with prior knowledge, past ALPN: the preface and a SETTINGS frame."""
    port, _ = limited
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    answer = await asyncio.wait_for(reader.read(4096), timeout=10)
    assert answer.startswith(b"HTTP/1.0 400 Bad Request"), answer
    assert await asyncio.wait_for(reader.read(4096), timeout=10) == b""  # closed
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert b"hello" in await _get(reader, writer)
    writer.close()


async def test_a_silent_caller_is_dropped_at_the_handshake_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "HANDSHAKE_SECONDS", 0.3)
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    serving = new_serving_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now)
    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)
    app = web.Application()
    app.router.add_get("/", _hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = LimitedSite(
        runner, "127.0.0.1", 0, ssl_context=server_ssl_context(paths.cert_file, paths.key_file)
    )
    await site.start()
    try:
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1]
        )
        # No ClientHello: the server gives up on the handshake and closes.
        assert await asyncio.wait_for(reader.read(1), timeout=30) == b""
        writer.close()
    finally:
        await runner.cleanup()


async def test_a_large_review_is_decoded_off_the_event_loop_and_a_small_one_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Decoding a review of a megabyte takes milliseconds that would hold up every small
    # review behind it: it is done in the large pods' thread, as their planning is.
    threads: dict[str, str] = {}

    def recording(body: bytes) -> AdmissionRequest:
        decoded = decode_review(body)
        threads[decoded.uid] = threading.current_thread().name
        return decoded

    monkeypatch.setattr(handlers, "decode_review", recording)
    large = review(pod({"gpuadm.io/h100": "1"}, annotations={"big": "x" * 70_000}), uid="large")
    assert len(orjson.dumps(large)) >= LARGE_REVIEW_BYTES
    async with served(create_app(Settings(), ConfigHolder(snapshot()))) as server:
        await server.review("/mutate", large)
        await server.review("/mutate", small_review("small"))
        # Refused as clearly from the thread as from the loop: a large body that is no JSON.
        broken = await server.send("/mutate", b"{" + b" " * LARGE_REVIEW_BYTES)
        assert broken.status == 400
        assert "body is not valid JSON" in (await broken.json())["error"]
    assert threads["large"].startswith("gpuadm-large-pod")
    assert threads["small"] == threading.current_thread().name


def test_a_replica_keeps_an_idle_connection_longer_than_the_apiserver_does() -> None:
    # Closed by the replica first, a connection the apiserver is just reusing would fail
    # that call; the test servers here and `gpuadm serve` run with the same options.
    assert listener.RUNNER_OPTIONS["keepalive_timeout"] > listener.APISERVER_IDLE_SECONDS == 90
