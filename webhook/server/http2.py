"""HTTP/2 for the apiserver's calls: a burst of reviews over one connection, one handshake.

The apiserver's webhook client speaks HTTP/2 to a server that offers it by ALPN, and then
sends every call over one connection, many at once. Over HTTP/1.1 it keeps at most 25 idle
connections per webhook and no TLS session cache, so a burst of calls opens, and pays a
full handshake for, most of them: half of what a replica spends in a burst
(docs/performance.md). With `--http2` the listener (`server.listener`) offers `h2` and
hands each connection that chose it to `Http2Connection`; the rest stay aiohttp's.

The same routes answer (`ROUTES`, through `Incoming`), under the same budgets, and what one
connection may cost is bounded on its own:

- streams: at most `MAX_STREAMS` open at once per connection (the setting the caller must
  keep to), and as many answers in progress. A stream the caller resets still counts until
  its handler is done, so resetting streams does not make room for more work (the "rapid
  reset" attack); a connection that resets more than half of its streams, past
  `RESETS_TOLERATED`, is told to stop (GOAWAY, ENHANCE_YOUR_CALM) and closed.
- replica-wide: at most `MAX_ANSWERS_IN_PROGRESS` streams answered at once over all
  connections; a stream over it is refused (REFUSED_STREAM, which a caller retries).
- bodies: a stream's bytes are acknowledged (its window opened again) only while its
  handler reads them, so a body not yet read holds at most its window, `STREAM_WINDOW`;
  a body over the app's `client_max_size` is answered 413 and its bytes dropped.
- headers: at most `MAX_HEADER_BYTES` decoded, as `h2` enforces; frames and CONTINUATION
  floods are bounded by `h2` itself.
- output: while the caller does not read, nothing more is read from it either, and an
  answer waits for the caller's window; a caller that lets `MAX_UNSENT_BYTES` pile up is
  cut off.
- time: each request has the handlers' own read budget; a connection with nothing in
  progress is closed after `KEEPALIVE_SECONDS`, as aiohttp closes an idle one.

Leaving: `close()` sends GOAWAY naming the last stream that will be answered, answers
those, then closes. The listener calls it when the replica stops, and a draining replica
(`server.drain`) after each answer, as it closes HTTP/1.1 connections after each answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from webhook.server.appkeys import DRAIN, MAX_BODY_BYTES, ROUTES

log = logging.getLogger("gpuadm.http2")

ALPN = "h2"
# Open streams per connection: what the caller is told to keep to. The apiserver opens
# another connection when it needs more at once.
MAX_STREAMS = 100
# Streams answered at once over all connections of a replica: as many as connections may
# be open, one call each, over HTTP/1.1.
MAX_ANSWERS_IN_PROGRESS = 1024
# A stream's window: a review under `LARGE_REVIEW_BYTES` fits it whole. The connection's
# window is every stream's, so one stream waiting to be read never holds up the others.
STREAM_WINDOW = 65_535
CONNECTION_WINDOW = MAX_STREAMS * STREAM_WINDOW
MAX_HEADER_BYTES = 16 * 1024
# Streams a connection may reset before its resets are weighed against its streams.
RESETS_TOLERATED = 100
# Bytes of answers the caller has not read before the connection is cut: several answers
# of the largest kind (a /metrics page), never a whole burst's worth.
MAX_UNSENT_BYTES = 4 * 1024 * 1024
KEEPALIVE_SECONDS = 75.0
# The largest frame any HTTP/2 peer takes.
_SMALLEST_FRAME = 16_384
# Headers of HTTP/1.1 connections, which HTTP/2 forbids.
_HOP_BY_HOP = frozenset(
    {"connection", "content-length", "keep-alive", "transfer-encoding", "upgrade"}
)


class _StreamsOutliveGoaway(h2.connection.H2ConnectionStateMachine):
    """h2's connection states, but a GOAWAY, sent or received, leaves the connection open.

    HTTP/2 answers the streams a GOAWAY names (RFC 9113, section 6.8); h2's own states take
    nothing but another GOAWAY after one, so nothing under way could be answered. No stream
    begins after it all the same: `Http2Connection` refuses them.
    """

    _transitions = {  # noqa: RUF012 (h2's own is a plain class attribute)
        **h2.connection.H2ConnectionStateMachine._transitions,
        **{
            (state, goaway): (None, state)
            for state in (
                h2.connection.ConnectionState.CLIENT_OPEN,
                h2.connection.ConnectionState.SERVER_OPEN,
            )
            for goaway in (
                h2.connection.ConnectionInputs.SEND_GOAWAY,
                h2.connection.ConnectionInputs.RECV_GOAWAY,
            )
        },
    }


def streams_outlive_goaway(connection: h2.connection.H2Connection) -> None:
    """Let `connection`, not yet used, go on with its streams after a GOAWAY."""
    connection.state_machine = _StreamsOutliveGoaway()


class AnswersInProgress:
    """The streams being answered now, over all HTTP/2 connections of a replica."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0


class _Stream:
    """One request: its headers, the body so far, and whether anyone waits for more."""

    __slots__ = (
        "body",
        "changed",
        "ended",
        "headers",
        "id",
        "reading",
        "received",
        "reset",
        "too_large",
        "unacknowledged",
    )

    def __init__(self, stream_id: int, headers: CIMultiDictProxy[str]) -> None:
        self.id = stream_id
        self.headers = headers
        self.body: list[bytes] = []
        self.received = 0
        self.unacknowledged = 0
        self.ended = False
        self.reset = False
        self.reading = False
        self.too_large = False
        self.changed = asyncio.Event()


class Http2Request:
    """A stream's request, as the handlers see any request (`server.incoming.Incoming`)."""

    __slots__ = ("_connection", "_stream", "method", "path")

    def __init__(self, connection: Http2Connection, stream: _Stream, method: str, path: str):
        self._connection = connection
        self._stream = stream
        self.method = method
        self.path = path

    @property
    def app(self) -> web.Application:
        return self._connection.app

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._stream.headers

    @property
    def content_type(self) -> str:
        # As aiohttp reads it: the media type alone, lower case, and its default when absent.
        value = self._stream.headers.get("Content-Type", "application/octet-stream")
        return value.partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self._stream.headers.get("Content-Length", "")
        # h2 closes a connection whose stream's length is not a number; one of more digits
        # than any body could have is read as unknown, and the body's own size then rules.
        return int(value) if value.isascii() and value.isdigit() and len(value) <= 19 else None

    @property
    def transport(self) -> asyncio.BaseTransport | None:
        return self._connection.transport

    async def read(self) -> bytes:
        """Return the whole body once the stream ends; the caller's window opens as it is read."""
        stream = self._stream
        stream.reading = True
        self._connection.acknowledge(stream)
        while True:
            if stream.reset:
                raise ConnectionResetError("the caller reset the stream")
            if stream.too_large:
                raise web.HTTPRequestEntityTooLarge(
                    max_size=self._connection.app[MAX_BODY_BYTES], actual_size=stream.received
                )
            if stream.ended:
                body = b"".join(stream.body)
                stream.body.clear()
                return body
            stream.changed.clear()
            await stream.changed.wait()


class Http2Connection(asyncio.Protocol):
    """One caller's HTTP/2 connection: its streams answered by the app's routes."""

    def __init__(
        self,
        app: web.Application,
        in_progress: AnswersInProgress,
        on_closed: Callable[[Http2Connection], None] = lambda connection: None,
    ) -> None:
        """Answer with `app`'s `ROUTES`; count answers in `in_progress`, shared by the
        replica's connections; `on_closed` is called once the connection is gone."""
        self.app = app
        self.transport: asyncio.Transport | None = None
        self._in_progress = in_progress
        self._on_closed = on_closed
        # Headers come as bytes: they are decoded here, where a byte that is not UTF-8 is
        # replaced rather than an error in the middle of the protocol.
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config=config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_BYTES,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self._h2.decoder.max_header_list_size = MAX_HEADER_BYTES
        streams_outlive_goaway(self._h2)
        self._streams: dict[int, _Stream] = {}
        # Handlers running, whether or not their stream is still open.
        self._answering: set[asyncio.Task[None]] = set()
        self._streams_seen = 0
        self._resets = 0
        # Once GOAWAY is sent: the last stream this connection answers.
        self._last_stream: int | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._window_opened = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None

    # asyncio's callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whose class is not asyncio's own under uvloop.
        self.transport = cast(asyncio.Transport, transport)
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - STREAM_WINDOW)
        self._flush()
        self._idle_from_now()

    def data_received(self, data: bytes) -> None:
        try:
            for event in self._h2.receive_data(data):
                self._on_event(event)
        except h2.exceptions.ProtocolError as error:
            log.warning("closed an HTTP/2 connection that broke the protocol: %s", error)
            self._abort(h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        except Exception:
            log.exception("closed an HTTP/2 connection whose frames could not be read")
            self._abort(h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        self._flush()

    def eof_received(self) -> bool | None:
        return None  # close: the caller will send nothing more

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
        for stream in self._streams.values():
            stream.reset = True
            stream.changed.set()
        self._streams.clear()
        self._writable.set()
        self._window_opened.set()
        self.transport = None
        self._on_closed(self)

    def pause_writing(self) -> None:
        # The caller is not reading: read no more of what it sends until it does.
        self._writable.clear()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # What the listener asks.

    @property
    def answering(self) -> int:
        """Streams being answered now."""
        return len(self._answering)

    def close(self) -> None:
        """Answer the streams already begun, begin no more, then close (GOAWAY, NO_ERROR)."""
        if self.transport is None or self._last_stream is not None:
            return
        self._last_stream = self._h2.highest_inbound_stream_id
        self._h2.close_connection(
            error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=self._last_stream
        )
        self._flush()
        self._close_when_done()

    # The protocol's events.

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            if (stream := self._streams.get(event.stream_id)) is not None:
                stream.ended = True
                stream.changed.set()
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window_opened.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # The caller is leaving: it begins no more streams, and those under way are
            # answered before the connection closes.
            if self._last_stream is None:
                self._last_stream = self._h2.highest_inbound_stream_id
            self._close_when_done()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._streams_seen += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._last_stream is not None and stream_id > self._last_stream:
            # Sent before the caller read our GOAWAY: it may send it again, elsewhere.
            self._refuse(stream_id)
            return
        if len(self._answering) >= MAX_STREAMS or (
            self._in_progress.count >= self._in_progress.limit
        ):
            log.warning(
                "refused an HTTP/2 stream: %d answers in progress on its connection, %d in all",
                len(self._answering),
                self._in_progress.count,
            )
            self._refuse(stream_id)
            return
        pseudo: dict[str, str] = {}
        headers: CIMultiDict[str] = CIMultiDict()
        for raw_name, raw_value in event.headers or ():
            name = _text(raw_name)
            value = _text(raw_value)
            if name.startswith(":"):
                pseudo[name] = value
            else:
                headers.add(name, value)
        stream = _Stream(stream_id, CIMultiDictProxy(headers))
        self._streams[stream_id] = stream
        method = pseudo.get(":method", "")
        path = pseudo.get(":path", "").partition("?")[0]
        request = Http2Request(self, stream, method, path)
        task = asyncio.get_running_loop().create_task(self._answer(stream, request))
        self._answering.add(task)
        self._in_progress.count += 1
        task.add_done_callback(self._answered)

    def _refuse(self, stream_id: int) -> None:
        """Tell the caller a stream was not begun, so it may send it again."""
        # A stream the caller reset already, in the same read, needs nothing more.
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        length = event.flow_controlled_length or 0
        if stream is None or stream.reset:
            self._h2.acknowledge_received_data(length, event.stream_id)
            return
        data = event.data or b""
        limit = self.app[MAX_BODY_BYTES]
        if stream.too_large or stream.received + len(data) > limit:
            # Nothing more of it is kept, and its window stays open so that the others flow.
            stream.too_large = True
            stream.body.clear()
            self._h2.acknowledge_received_data(length, event.stream_id)
        else:
            stream.body.append(data)
            stream.unacknowledged += length
            if stream.reading:
                self.acknowledge(stream)
        stream.received += len(data)
        stream.changed.set()

    def _on_reset(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        self._resets += 1
        stream.reset = True
        stream.changed.set()
        self.acknowledge(stream)
        self._window_opened.set()
        if self._resets > RESETS_TOLERATED and 2 * self._resets > self._streams_seen:
            log.warning(
                "closed an HTTP/2 connection that reset %d of its %d streams",
                self._resets,
                self._streams_seen,
            )
            self._abort(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def acknowledge(self, stream: _Stream) -> None:
        """Open the caller's windows again by what was received of `stream` and not
        acknowledged."""
        if stream.unacknowledged and self.transport is not None:
            self._h2.acknowledge_received_data(stream.unacknowledged, stream.id)
            stream.unacknowledged = 0
            self._flush()

    # Answering.

    async def _answer(self, stream: _Stream, request: Http2Request) -> None:
        handler = self.app[ROUTES].get((request.method, request.path))
        try:
            if handler is not None:
                response = await handler(request)
            elif any(path == request.path for _, path in self.app[ROUTES]):
                response = _error(405, f"{request.method} is not allowed on {request.path}")
            else:
                response = _error(404, f"no such path: {request.path}")
        except Exception:
            log.exception("answering an HTTP/2 request to %s failed", request.path)
            response = _error(500, "internal error")
        await self._send(stream, response)

    async def _send(self, stream: _Stream, response: web.Response) -> None:
        if stream.reset or self.transport is None:
            return  # nobody to answer (a handler's 499 says as much)
        body = b"" if response.body is None else response.body
        if not isinstance(body, bytes):
            raise TypeError(f"an HTTP/2 answer must be bytes, not {type(body).__name__}")
        headers = [
            (":status", str(response.status)),
            ("content-length", str(len(body))),
            *(
                (name.lower(), value)
                for name, value in response.headers.items()
                if name.lower() not in _HOP_BY_HOP
            ),
        ]
        try:
            self._h2.send_headers(stream.id, headers, end_stream=not body)
            self._flush()
            sent = 0
            while sent < len(body):
                await self._writable.wait()
                if stream.reset or self.transport is None:
                    return
                room = min(
                    self._h2.local_flow_control_window(stream.id),
                    self._h2.max_outbound_frame_size or _SMALLEST_FRAME,
                    len(body) - sent,
                )
                if room <= 0:
                    self._window_opened.clear()
                    await self._window_opened.wait()
                    continue
                end = sent + room
                self._h2.send_data(stream.id, body[sent:end], end_stream=end == len(body))
                sent = end
                self._flush()
            if not stream.ended:
                # Answered before the whole body came (a 413): the rest is not wanted.
                self._h2.reset_stream(stream.id, h2.errors.ErrorCodes.NO_ERROR)
                self._flush()
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return  # the caller reset the stream, or left, while it was answered
        finally:
            if (done := self._streams.pop(stream.id, None)) is not None:
                self.acknowledge(done)
        if self.app[DRAIN].draining:
            self.close()

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._answering.discard(task)
        self._in_progress.count -= 1
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("an HTTP/2 answer failed", exc_info=error)
        if self._last_stream is not None:
            self._close_when_done()
        elif not self._answering:
            self._idle_from_now()

    # The connection.

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if not data or self.transport is None or self.transport.is_closing():
            return
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.warning("closed an HTTP/2 connection whose caller does not read its answers")
            self.transport.abort()

    def _close_when_done(self) -> None:
        if not self._answering and self.transport is not None:
            self._flush()
            self.transport.close()

    def _abort(self, code: int) -> None:
        if self.transport is None:
            return
        self._h2.close_connection(error_code=code)
        self._flush()
        self.transport.close()

    def _idle_from_now(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(KEEPALIVE_SECONDS, self._close_idle)

    def _close_idle(self) -> None:
        self._idle = None
        if not self._answering:
            self.close()


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def served_over_http2(transport: asyncio.BaseTransport) -> bool:
    """Whether the caller chose HTTP/2 in the TLS handshake."""
    ssl_object: Any = transport.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == ALPN
