"""HTTP/2, as `gpuadm serve --http2` serves the apiserver: the same answers as HTTP/1.1 over
one connection, and every limit of a stream and a connection held against callers that do
what the apiserver never does."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import h2.errors
import h2.settings
import jsonpatch
import orjson
import pytest
from aiohttp import web
from hyperframe.frame import ContinuationFrame, HeadersFrame

from certs import new_ca, new_serving_cert, server_ssl_context, write_tls_dir
from policies import Plan
from policies.judge import QuotaVerdict
from tests.builders import large_pod, pod, review
from tests.certs.factory import write_caller
from tests.webhook.calls import decoded_patch
from tests.webhook.server.h2client import H2Client, client_context
from tests.webhook.server.test_server import snapshot
from webhook.admission import decisions
from webhook.claims.templates import NoTemplates
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot
from webhook.observe.metrics import Metrics
from webhook.quota.gate import Unlimited
from webhook.reviews.request import LARGE_REVIEW_BYTES, AdmissionRequest, decode_review
from webhook.server import http2, listener
from webhook.server.app import create_app
from webhook.server.appkeys import DRAIN
from webhook.server.budget import RequestBudget
from webhook.server.listener import LimitedSite
from webhook.server.settings import Settings


class Stalled(Unlimited):
    """A quota whose admissions wait until `release` is set: answers that stay in progress."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        return await super().admit(request, plan, config)


@dataclass
class Served:
    port: int
    ca_file: Path
    site: LimitedSite
    runner: web.AppRunner
    app: web.Application
    tls: Path

    def h1_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def connect(self, **options: Any) -> H2Client:
        return await H2Client.connect(self.port, client_context(self.ca_file), **options)


@asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    settings: Settings | None = None,
    quota: Unlimited | None = None,
    budget: RequestBudget | None = None,
    client_ca_file: Path | None = None,
    max_answers: int = http2.MAX_ANSWERS_IN_PROGRESS,
) -> AsyncIterator[Served]:
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    serving_cert = new_serving_cert(
        ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now
    )
    paths = write_tls_dir(tmp_path / "tls", ca=ca, serving=serving_cert)
    settings = settings or Settings(client_ca_file=client_ca_file)
    app = create_app(settings, ConfigHolder(snapshot()), quota=quota, budget=budget)
    runner = web.AppRunner(app, **listener.RUNNER_OPTIONS)
    await runner.setup()
    site = LimitedSite(
        runner,
        "127.0.0.1",
        0,
        ssl_context=server_ssl_context(
            paths.cert_file, paths.key_file, client_ca_file=client_ca_file
        ),
        http2=True,
        max_http2_answers=max_answers,
    )
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield Served(port, paths.ca_file, site, runner, app, tmp_path / "tls")
    finally:
        await runner.cleanup()


def _mutated(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as gpuadm's own mutation leaves it."""
    decision = asyncio.run(
        decisions.mutate(
            decode_review(orjson.dumps(review(body))),
            config=ConfigHolder(snapshot()),
            templates=NoTemplates(),
            quota=Unlimited(),
        )
    )
    patch = decoded_patch(decision.review("mutation")["response"])
    mutated: dict[str, Any] = jsonpatch.apply_patch(body, patch)
    return mutated


_CLASS_POD = _mutated(pod({"gpuadm.io/h100": "1"}))


def gpu_review(uid: str) -> dict[str, Any]:
    """A review of a class pod as gpuadm's mutation left it: validation admits it."""
    return review(_CLASS_POD, uid=uid)


async def closed_with(client: H2Client, code: int) -> None:
    """Wait until the server closes `client`'s connection, its first GOAWAY saying `code`."""
    await asyncio.wait_for(client.closed.wait(), 10)
    assert client.goaway is not None
    assert client.goaway.error_code == code


async def eventually(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def test_reviews_and_probes_are_answered_as_over_http1(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        async with aiohttp.ClientSession() as session:
            raw = review(pod({"gpuadm.io/h100": "1"}), uid="raw")
            for path, body in (("/mutate", raw), ("/validate", gpu_review("stored"))):
                async with session.post(
                    f"https://localhost:{served.port}{path}",
                    json=body,
                    ssl=served.h1_context(),
                ) as response:
                    assert response.version == aiohttp.HttpVersion11
                    over_http1 = (await response.json())["response"]
                assert await client.review(path, body) == over_http1
            for path in ("/healthz", "/readyz"):
                answer = await client.call(path, method="GET")
                assert (answer.status, bytes(answer.body)) == (200, b"ok")
                assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        metrics = await client.call("/metrics", method="GET")
        assert metrics.status == 200
        assert int(metrics.headers["content-length"]) == len(metrics.body)
        # Both calls of each endpoint counted, over either protocol.
        assert (
            b'gpuadm_admission_requests_total{decision="mutated",endpoint="mutate",'
            b'operation="CREATE"} 2.0'
        ) in metrics.body
        assert (
            b'gpuadm_admission_requests_total{decision="allowed",endpoint="validate",'
            b'operation="CREATE"} 2.0'
        ) in metrics.body
        missing = await client.call("/nowhere", method="GET")
        assert missing.status == 404
        assert missing.json() == {"error": "no such path: /nowhere"}
        wrong = await client.call("/mutate", method="GET")
        assert wrong.status == 405
        await client.close()


async def test_a_burst_shares_one_connection_and_every_call_is_answered(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        assert client.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 100
        bodies = [gpu_review(f"burst-{n}") for n in range(http2.MAX_STREAMS)]
        answers = await asyncio.gather(*(client.review("/validate", b) for b in bodies))
        assert [a["uid"] for a in answers] == [b["request"]["uid"] for b in bodies]
        assert all(a["allowed"] for a in answers)
        assert served.site.open_connections == 1
        await client.close()
        await eventually(lambda: served.site.open_connections == 0, "the connection closed")


async def test_a_large_review_flows_past_the_first_window(tmp_path: Path) -> None:
    body = review(large_pod("h2"), uid="large")
    encoded = orjson.dumps(body)
    assert len(encoded) > 2 * LARGE_REVIEW_BYTES > 2 * http2.STREAM_WINDOW
    async with serving(tmp_path) as served:
        client = await served.connect()
        answer = await client.call("/mutate", encoded)
        assert answer.status == 200
        assert answer.json()["response"]["uid"] == "large"
        await client.close()


async def test_a_body_over_the_limit_is_refused_and_the_connection_still_flows(
    tmp_path: Path,
) -> None:
    settings = Settings(max_review_bytes=64 * 1024)
    async with serving(tmp_path, settings=settings) as served:
        client = await served.connect()
        # Bodies over the limit, more than the connection's whole window in all: were
        # their bytes held unacknowledged, the last call could not be sent.
        too_large = b"x" * (200 * 1024)
        for _ in range(http2.CONNECTION_WINDOW // len(too_large) // 10 + 1):
            refused = [client.open("/validate", too_large, end=False) for _ in range(10)]
            for stream_id in refused:
                answer = client.answers[stream_id]
                await asyncio.wait_for(answer.done.wait(), 10)
                assert answer.status == 413
                assert "exceeds the 65536-byte limit" in answer.json()["error"]
        assert (await client.review("/validate", gpu_review("after")))["allowed"]
        await client.close()


async def test_an_answer_larger_than_the_callers_window_arrives_whole(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect(window=100)
        answer = await client.call("/metrics", method="GET")
        assert answer.status == 200
        assert len(answer.body) > 100
        assert int(answer.headers["content-length"]) == len(answer.body)
        await client.close()


async def test_a_slow_body_is_answered_503_when_its_time_is_up(tmp_path: Path) -> None:
    async with serving(tmp_path, budget=RequestBudget(read_seconds=0.3)) as served:
        client = await served.connect()
        stream_id = client.open("/validate", b'{"kind": "Admiss', end=False)
        answer = client.answers[stream_id]
        await asyncio.wait_for(answer.done.wait(), 10)
        assert answer.status == 503
        assert "not received and let in within 0.3 s" in answer.json()["error"]
        await client.close()


async def test_a_caller_without_a_client_certificate_is_refused(tmp_path: Path) -> None:
    caller = write_caller(tmp_path)
    client_ca_file = caller.ca_file
    async with serving(tmp_path, client_ca_file=client_ca_file) as served:
        anonymous = await served.connect()
        answer = await anonymous.call("/validate", orjson.dumps(gpu_review("anon")))
        assert answer.status == 401
        assert "client certificate" in answer.json()["error"]
        context = client_context(served.ca_file, cert=(caller.cert_file, caller.key_file))
        apiserver = await H2Client.connect(served.port, context)
        assert (await apiserver.review("/validate", gpu_review("known")))["allowed"]
        for client in (anonymous, apiserver):
            await client.close()


async def test_reset_streams_hold_their_place_until_their_answers_end(tmp_path: Path) -> None:
    stalled = Stalled()
    async with serving(tmp_path, quota=stalled) as served:
        client = await served.connect()
        opened = [
            client.open("/validate", orjson.dumps(gpu_review(f"s-{n}")))
            for n in range(http2.MAX_STREAMS)
        ]
        await eventually(lambda: stalled.waiting == http2.MAX_STREAMS, "all in the quota")
        for stream_id in opened:
            client.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        client.flush()
        # The streams are closed, but their answers are still being worked out: a new
        # stream would be work beyond the limit, and is refused.
        over = client.answers[client.open("/validate", orjson.dumps(gpu_review("over")))]
        await asyncio.wait_for(over.done.wait(), 10)
        assert over.reset == h2.errors.ErrorCodes.REFUSED_STREAM
        assert stalled.waiting == http2.MAX_STREAMS
        stalled.release.set()
        await eventually(lambda: stalled.waiting == 0, "the answers ended")
        await eventually(lambda: served.site._answers.count == 0, "every place given back")
        assert (await client.review("/validate", gpu_review("after")))["allowed"]
        await client.close()


async def test_a_connection_that_resets_most_of_its_streams_is_closed(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        other = await served.connect()
        sent = 0
        while not client.closed.is_set() and sent < 10 * http2.RESETS_TOLERATED:
            stream_id = client.open("/validate", end=False)
            client.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            client.flush()
            sent += 1
            if sent % 20 == 0:
                await asyncio.sleep(0.01)
        await closed_with(client, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        # Told soon after the tolerance ran out: streams refused while the reset ones were
        # still being closed did not count, and those sent after GOAWAY were not read.
        assert sent < 3 * http2.RESETS_TOLERATED
        await eventually(lambda: served.site._answers.count == 0, "every place given back")
        # Nobody else pays for it.
        assert (await other.review("/validate", gpu_review("other")))["allowed"]
        await other.close()
        await client.close()


async def test_answers_in_progress_are_bounded_over_all_connections(tmp_path: Path) -> None:
    stalled = Stalled()
    async with serving(tmp_path, quota=stalled, max_answers=3) as served:
        first, second = await served.connect(), await served.connect()
        for client, count in ((first, 2), (second, 1)):
            for n in range(count):
                client.open("/validate", orjson.dumps(gpu_review(f"{id(client)}-{n}")))
        await eventually(lambda: stalled.waiting == 3, "three in the quota")
        over = first.answers[first.open("/validate", orjson.dumps(gpu_review("over")))]
        await asyncio.wait_for(over.done.wait(), 10)
        assert over.reset == h2.errors.ErrorCodes.REFUSED_STREAM
        stalled.release.set()
        for client in (first, second):
            waiting = [a for a in client.answers.values() if a is not over]
            await asyncio.wait_for(asyncio.gather(*(a.done.wait() for a in waiting)), 10)
            assert all(a.status == 200 for a in waiting)
        assert (await second.review("/validate", gpu_review("after")))["allowed"]
        for client in (first, second):
            await client.close()


async def test_a_caller_that_breaks_the_protocol_is_cut_off_alone(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        broken = await served.connect()
        other = await served.connect()
        # A DATA frame on stream 0, which no stream may carry.
        broken.writer.write(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
        await closed_with(broken, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        assert (await other.review("/validate", gpu_review("other")))["allowed"]
        for client in (broken, other):
            await client.close()


async def test_a_draining_replica_closes_each_connection_after_its_answer(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        served.app[DRAIN].begin()
        assert (await client.review("/validate", gpu_review("last")))["allowed"]
        await closed_with(client, h2.errors.ErrorCodes.NO_ERROR)
        await client.close()


async def test_a_stop_answers_what_is_in_progress_then_closes(tmp_path: Path) -> None:
    stalled = Stalled()
    async with serving(tmp_path, quota=stalled) as served:
        client = await served.connect()
        begun = client.answers[client.open("/validate", orjson.dumps(gpu_review("begun")))]
        await eventually(lambda: stalled.waiting == 1, "in the quota")
        stopping = asyncio.create_task(served.site.stop())
        await eventually(lambda: client.goaway is not None, "GOAWAY received")
        assert client.goaway is not None
        assert client.goaway.last_stream_id == 1
        assert not begun.done.is_set()
        stalled.release.set()
        await asyncio.wait_for(begun.done.wait(), 10)
        assert begun.status == 200
        assert begun.json()["response"]["allowed"]
        await asyncio.wait_for(stopping, 10)
        await asyncio.wait_for(client.closed.wait(), 10)
        await client.close()


async def test_an_idle_connection_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http2, "KEEPALIVE_SECONDS", 0.2)
    async with serving(tmp_path) as served:
        client = await served.connect()
        assert (await client.review("/validate", gpu_review("one")))["allowed"]
        await closed_with(client, h2.errors.ErrorCodes.NO_ERROR)
        await client.close()


async def test_an_answer_its_caller_never_takes_is_given_up_and_its_place_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http2, "SEND_SECONDS", 0.3)
    async with serving(tmp_path) as served:
        # No window for any answer's body: each waits for room that never comes.
        client = await served.connect(window=0)
        answers = [client.answers[client.open("/metrics", method="GET", headers={})]]
        answers += [client.answers[client.open("/healthz", method="GET", headers={})]]
        for answer in answers:
            await asyncio.wait_for(answer.done.wait(), 10)
            assert answer.status == 200  # its headers came, then nothing
            assert answer.reset == h2.errors.ErrorCodes.CANCEL
        assert served.site._answers.count == 0
        other = await served.connect()
        assert (await other.review("/validate", gpu_review("other")))["allowed"]
        for each in (client, other):
            await each.close()


async def test_a_body_sent_after_its_answer_is_dropped_not_kept(tmp_path: Path) -> None:
    async with serving(tmp_path, budget=RequestBudget(read_seconds=0.3)) as served:
        # Its 503 cannot be sent (no window for it), so the stream stays open meanwhile.
        client = await served.connect(window=0)
        stream_id = client.open("/validate", b"{", end=False)
        await eventually(lambda: client.answers[stream_id].status == 503, "the 503's headers")
        # Three windows' worth more: the server opens its windows for them, and keeps none.
        client.unsent[stream_id] = (b"x" * (3 * http2.STREAM_WINDOW), False)
        client.pump()
        await eventually(lambda: not client.unsent, "all of the body sent", seconds=3)
        assert client.answers[stream_id].reset is None  # sent, not cut short
        [connection] = served.site._served_http2
        assert all(not stream.body for stream in connection._streams.values())
        await client.close()


async def test_callers_that_do_not_offer_http2_are_served_http1(tmp_path: Path) -> None:
    async with (
        serving(tmp_path) as served,
        aiohttp.ClientSession() as session,
        session.post(
            f"https://localhost:{served.port}/validate",
            json=gpu_review("h1"),
            ssl=served.h1_context(),
        ) as response,
    ):
        assert response.status == 200
        assert (await response.json())["response"]["allowed"]


async def test_refused_connections_count_http2_ones(tmp_path: Path) -> None:
    metrics = Metrics()
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    cert = new_serving_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now)
    paths = write_tls_dir(tmp_path, ca=ca, serving=cert)
    app = create_app(Settings(), ConfigHolder(snapshot()))
    runner = web.AppRunner(app, **listener.RUNNER_OPTIONS)
    await runner.setup()
    site = LimitedSite(
        runner,
        "127.0.0.1",
        0,
        ssl_context=server_ssl_context(paths.cert_file, paths.key_file),
        http2=True,
        max_connections=2,
        on_refused=metrics.connections_refused.inc,
    )
    await site.start()
    try:
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        port = server.sockets[0].getsockname()[1]
        held = [await H2Client.connect(port, client_context(paths.ca_file)) for _ in range(2)]
        # The third is closed as it arrives, before a frame of HTTP/2 is read.
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context(paths.ca_file), server_hostname="localhost"
        )
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            assert await asyncio.wait_for(reader.read(1), 10) == b""
        writer.close()
        assert metrics.connections_refused._value.get() == 1
        for client in held:
            await client.close()
    finally:
        await runner.cleanup()


async def test_headers_over_their_bound_close_the_connection(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        other = await served.connect()
        client.open("/validate", headers={"x-padding": "x" * (2 * http2.MAX_HEADER_BYTES)})
        await closed_with(client, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        assert (await other.review("/validate", gpu_review("other")))["allowed"]
        for each in (client, other):
            await each.close()


async def test_a_flood_of_continuation_frames_closes_the_connection(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        # A header block that never ends: HEADERS without END_HEADERS, then CONTINUATION
        # frames of one byte each, which a server that kept them all would keep forever.
        headers = HeadersFrame(1)
        headers.data = client.h2.encoder.encode(
            [(":method", "POST"), (":path", "/validate"), (":scheme", "https")]
        )
        client.writer.write(headers.serialize())
        for _ in range(1000):
            continuation = ContinuationFrame(1)
            continuation.data = b"\x00"
            client.writer.write(continuation.serialize())
            if client.closed.is_set():
                break
            await asyncio.sleep(0)
        await closed_with(client, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        await client.close()


def test_served_on_uvloop_as_gpuadm_serve_runs(tmp_path: Path) -> None:
    """`gpuadm serve` runs on uvloop when it is installed, whose TLS transports are not
    asyncio's own classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        async with serving(tmp_path) as served:
            client = await served.connect()
            assert (await client.review("/validate", gpu_review("on-uvloop")))["allowed"]
            metrics = await client.call("/metrics", method="GET")
            assert metrics.status == 200
            await client.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def test_a_header_block_held_open_is_bounded(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        # Full CONTINUATION frames of a block that never ends: h2 would keep 64 of them,
        # a megabyte, until the connection idled out.
        headers = HeadersFrame(1)
        headers.data = client.h2.encoder.encode([(":method", "POST"), (":path", "/validate")])
        client.writer.write(headers.serialize())
        for _ in range(http2.MAX_HEADER_BLOCK_BYTES // 16_384 + 2):
            continuation = ContinuationFrame(1)
            continuation.data = b"\x00" * 16_384
            client.writer.write(continuation.serialize())
        await closed_with(client, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        await client.close()


async def test_a_refused_stream_leaves_the_idle_timer_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http2, "KEEPALIVE_SECONDS", 0.3)
    async with serving(tmp_path, max_answers=0) as served:
        client = await served.connect()
        refused = await client.call("/validate", orjson.dumps(gpu_review("refused")))
        assert refused.reset == h2.errors.ErrorCodes.REFUSED_STREAM
        await closed_with(client, h2.errors.ErrorCodes.NO_ERROR)
        await client.close()


async def test_a_caller_that_keeps_opening_refused_streams_is_told_to_calm_down(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, max_answers=0) as served:
        client = await served.connect()
        sent = 0
        while not client.goaways and sent < 3 * http2.REFUSALS_TOLERATED:
            if client.h2.open_outbound_streams >= http2.MAX_STREAMS:
                await asyncio.sleep(0.001)  # the refusals are on their way back
                continue
            client.open("/healthz", method="GET", headers={})
            sent += 1
            if sent % 50 == 0:
                await asyncio.sleep(0)
        await closed_with(client, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        assert sent < 2 * http2.REFUSALS_TOLERATED
        await client.close()


async def test_an_old_connection_is_closed_after_its_last_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http2, "MAX_STREAMS_PER_CONNECTION", 3)
    async with serving(tmp_path) as served:
        client = await served.connect()
        for n in range(3):
            assert (await client.review("/validate", gpu_review(f"age-{n}")))["allowed"]
        # The third was answered, and GOAWAY named it as the last.
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.goaway is not None
        assert (client.goaway.error_code, client.goaway.last_stream_id) == (0, 5)
        await client.close()


async def test_a_frame_larger_than_allowed_is_not_held_while_it_arrives(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        # A DATA frame announcing 16 MiB, where 16 KiB is allowed: h2 would hold it all
        # before it looked at its length.
        header = (16 * 1024 * 1024 - 1).to_bytes(3, "big") + b"\x00\x00" + (1).to_bytes(4, "big")
        client.writer.write(header + b"x" * 40_000)
        await closed_with(client, h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
        await client.close()


async def test_streams_after_goaway_are_refused_then_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http2, "MAX_STREAMS_PER_CONNECTION", 1)
    stalled = Stalled()
    async with serving(tmp_path, quota=stalled) as served:
        client = await served.connect()
        # The first stream makes the connection old: GOAWAY names it, and it is answered.
        first = client.answers[client.open("/validate", orjson.dumps(gpu_review("first")))]
        await eventually(lambda: client.goaway is not None, "GOAWAY")
        after = await client.call("/healthz", method="GET", headers={})
        assert after.reset == h2.errors.ErrorCodes.REFUSED_STREAM
        # A caller that ignores it is cut off, its answer in progress with it.
        for _ in range(http2.AFTER_GOAWAY_TOLERATED + 1):
            client.open("/healthz", method="GET", headers={})
            if client.h2.open_outbound_streams >= http2.MAX_STREAMS - 1:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.goaways[-1].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert first.status == 0
        stalled.release.set()
        await eventually(lambda: served.site._answers.count == 0, "every place given back")
        await client.close()


async def test_a_flood_of_pings_is_cut_off(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        sent = 0
        while not client.closed.is_set() and sent < 2 * http2.IDLE_FRAMES_TOLERATED:
            client.h2.ping(sent.to_bytes(8, "big"))
            client.flush()
            sent += 1
            if sent % 100 == 0:
                await asyncio.sleep(0)
        await closed_with(client, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        await client.close()


async def test_late_resets_are_what_the_apiserver_does_and_never_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every reset as late as a timed-out call's.
    monkeypatch.setattr(http2, "EARLY_RESET_SECONDS", -1.0)
    async with serving(tmp_path) as served:
        client = await served.connect()
        for n in range(3 * http2.RESETS_TOLERATED):
            stream_id = client.open("/validate", end=False)
            client.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            client.flush()
            if n % 20 == 0:
                await asyncio.sleep(0.01)
        assert (await client.review("/validate", gpu_review("still")))["allowed"]
        assert client.goaway is None
        await client.close()


async def test_what_was_due_before_the_callers_goaway_is_still_sent(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        assert (await client.call("/healthz", method="GET", headers={})).status == 200
        client.h2.ping(b"12345678")
        client.h2.close_connection()
        client.flush()  # PING and GOAWAY in one write: h2 would drop the PING's answer
        await asyncio.wait_for(client.closed.wait(), 10)
        assert client.ping_acks == 1
        await client.close()


async def test_h2_remembers_a_bounded_number_of_closed_streams(tmp_path: Path) -> None:
    async with serving(tmp_path) as served:
        client = await served.connect()
        for _ in range(http2.MAX_CLOSED_STREAMS + 100):
            assert (await client.call("/healthz", method="GET", headers={})).status == 200
        [connection] = served.site._served_http2
        assert len(connection._h2._closed_streams) <= http2.MAX_CLOSED_STREAMS
        await client.close()
