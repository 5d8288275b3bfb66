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
  reset" attack); a connection that resets more than half of its streams within
  `EARLY_RESET_SECONDS` of opening them, past `RESETS_TOLERATED`, is told to stop (GOAWAY,
  ENHANCE_YOUR_CALM). So is one that keeps opening streams it is refused; one that goes on
  after that, or sends frames that begin no work (PING, SETTINGS...) past
  `IDLE_FRAMES_TOLERATED`, is cut off.
- replica-wide: at most `MAX_ANSWERS_IN_PROGRESS` streams answered at once over all
  connections; a stream over it is refused (REFUSED_STREAM, which a caller retries).
- bodies: a stream's bytes are acknowledged (its window opened again) only while its
  handler reads them, so a body not yet read holds at most its window, `STREAM_WINDOW`;
  a body over the app's `client_max_size`, or sent after its handler is done, is dropped.
- headers: at most `MAX_HEADER_BYTES` decoded, and at most `MAX_HEADER_BLOCK_BYTES` of a
  block waiting for its last CONTINUATION frame; no frame larger than the 16 KiB allowed
  is held while it arrives.
- output: while the caller does not read, nothing more is read from it either; an answer
  waits for the caller's window for `SEND_SECONDS` at most, then its stream is reset.
- time and age: each request has the handlers' own read budget; a connection with nothing
  in progress is closed after `KEEPALIVE_SECONDS`, as aiohttp closes an idle one, and one
  that has begun `MAX_STREAMS_PER_CONNECTION` streams or lived `MAX_CONNECTION_SECONDS` is
  closed gracefully, which also bounds what h2 keeps of it and lets the apiserver's next
  connection reach another replica.

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
# another connection when it needs more at once. Go's client assumes 100 until it has read
# the setting, and h2 closes a connection that opens more: never set it lower.
MAX_STREAMS = 100
# Streams answered at once over all connections of a replica: as many as connections may
# be open, one call each, over HTTP/1.1.
MAX_ANSWERS_IN_PROGRESS = 1024
# A stream's window: a review under `LARGE_REVIEW_BYTES` fits it whole. The connection's
# window is every stream's, so one stream waiting to be read never holds up the others.
STREAM_WINDOW = 65_535
CONNECTION_WINDOW = MAX_STREAMS * STREAM_WINDOW
MAX_HEADER_BYTES = 16 * 1024
# Of a header block still arriving (HEADERS, then CONTINUATION frames): h2 keeps up to 64
# frames of 16 KiB before it decodes any.
MAX_HEADER_BLOCK_BYTES = 2 * MAX_HEADER_BYTES
# Resets within this long of a stream's opening count against the connection: the
# apiserver cancels a call only once its webhook timeout (a second at least) is out.
EARLY_RESET_SECONDS = 0.5
RESETS_TOLERATED = 100
# Streams a connection may have refused in `REFUSALS_SECONDS` before it is told to stop:
# the apiserver sends a refused call again at once, then after 1, 2 and 4 s, so a replica
# at its limits refuses each of 100 calls about five times.
REFUSALS_TOLERATED = 20 * MAX_STREAMS
REFUSALS_SECONDS = 10.0
# Frames that begin no work (PING, SETTINGS, WINDOW_UPDATE, empty DATA, PRIORITY, unknown
# kinds) a connection may send in `REFUSALS_SECONDS`, and streams it may open after our
# GOAWAY: a caller past either is cut off.
IDLE_FRAMES_TOLERATED = 5_000
AFTER_GOAWAY_TOLERATED = MAX_STREAMS
# How long an answer waits for the caller to take it (its window, its reading).
SEND_SECONDS = 10.0
KEEPALIVE_SECONDS = 75.0
# A connection's age, in streams and in seconds, before it is closed gracefully.
MAX_STREAMS_PER_CONNECTION = 10_000
MAX_CONNECTION_SECONDS = 300.0
# Closed streams h2 remembers, to tell a late frame of one from a protocol error: h2's own
# 65,536 weigh 7.5 MiB a connection.
MAX_CLOSED_STREAMS = 1024
_FRAME_HEADER_BYTES = 9
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


class _Served(h2.connection.H2Connection):
    """h2's server side, as `Http2Connection` needs it: streams outlive a GOAWAY, what was
    to be sent before a GOAWAY arrived is still sent (h2 would drop it: acknowledgements
    and window updates among it), and fewer closed streams are remembered."""

    MAX_CLOSED_STREAMS = MAX_CLOSED_STREAMS

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config=config)
        streams_outlive_goaway(self)

    def clear_outbound_data_buffer(self) -> None:
        pass


class AnswersInProgress:
    """The streams being answered now, over all HTTP/2 connections of a replica."""

    __slots__ = ("limit", "tasks")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def count(self) -> int:
        return len(self.tasks)


class _Stream:
    """One request: its headers, the body so far, and whether anyone waits for more."""

    __slots__ = (
        "body",
        "changed",
        "done",
        "ended",
        "headers",
        "id",
        "opened",
        "reading",
        "received",
        "reset",
        "too_large",
        "unacknowledged",
        "window",
    )

    def __init__(self, stream_id: int, headers: CIMultiDictProxy[str], opened: float) -> None:
        self.id = stream_id
        self.headers = headers
        self.opened = opened
        self.body = bytearray()
        self.received = 0
        self.unacknowledged = 0
        self.ended = False
        self.reset = False
        self.reading = False
        self.too_large = False
        # Its handler has returned: what more comes of its body is dropped.
        self.done = False
        self.changed = asyncio.Event()
        # Set when the caller's window for it may have opened.
        self.window = asyncio.Event()

    @property
    def discarding(self) -> bool:
        return self.reset or self.too_large or self.done


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
        try:
            while True:
                if stream.reset:
                    raise ConnectionResetError("the caller reset the stream")
                if stream.too_large:
                    raise web.HTTPRequestEntityTooLarge(
                        max_size=self._connection.max_body_bytes, actual_size=stream.received
                    )
                if stream.ended:
                    body = bytes(stream.body)
                    stream.body.clear()
                    return body
                stream.changed.clear()
                await stream.changed.wait()
        finally:
            # A read given up (its time is out) opens no more window.
            stream.reading = False


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
        # What the app holds for every stream, read once.
        self.max_body_bytes = app[MAX_BODY_BYTES]
        self._routes = app[ROUTES]
        self._paths = frozenset(path for _, path in self._routes)
        self._drain = app[DRAIN]
        self.transport: asyncio.Transport | None = None
        self._in_progress = in_progress
        self._on_closed = on_closed
        # Headers come as bytes: they are decoded here, where a byte that is not UTF-8 is
        # replaced rather than an error in the middle of the protocol. What goes out is only
        # :status and the handlers' own few headers, lower case.
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._h2 = _Served(config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_BYTES,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self._h2.decoder.max_header_list_size = MAX_HEADER_BYTES
        self._streams: dict[int, _Stream] = {}
        # Handlers running, whether or not their stream is still open.
        self._answering: set[asyncio.Task[None]] = set()
        self._begun = 0
        self._early_resets = 0
        self._refused = 0
        self._refused_since = 0.0
        self._idle_frames = 0
        self._begun_lately = 0
        self._after_goaway = 0
        # Set by the listener when it stops: GOAWAY as soon as the connection is made.
        self.close_on_arrival = False
        self._opened = 0.0
        # Once GOAWAY is sent: the last stream this connection answers.
        self._last_stream: int | None = None
        # Once the connection is cut: nothing more is read or begun.
        self._dead = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle: asyncio.TimerHandle | None = None
        self._flush_due = False

    # asyncio's callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whose class is not asyncio's own under uvloop.
        self.transport = cast(asyncio.Transport, transport)
        self._opened = self._refused_since = asyncio.get_running_loop().time()
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - STREAM_WINDOW)
        self._flush()
        self._idle_from_now()
        if self.close_on_arrival:
            self.close()

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        try:
            for event in self._h2.receive_data(data):
                if self._dead:
                    return
                self._on_event(event)
        except h2.exceptions.ProtocolError as error:
            # h2 has said GOAWAY with its reason already.
            log.warning("closed an HTTP/2 connection that broke the protocol: %s", error)
            self._cut()
            return
        except Exception:
            log.exception("closed an HTTP/2 connection whose frames could not be read")
            self._cut(h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
        if self._header_block_pending() > MAX_HEADER_BLOCK_BYTES:
            log.warning("closed an HTTP/2 connection whose header block never ended")
            self._cut(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return
        if self._frame_pending() > self._h2.max_inbound_frame_size + _FRAME_HEADER_BYTES:
            log.warning("closed an HTTP/2 connection that sent a frame larger than allowed")
            self._cut(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
            return
        self._flush()

    def eof_received(self) -> bool | None:
        return None  # close: the caller will send nothing more

    def connection_lost(self, exc: Exception | None) -> None:
        self._dead = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        for stream in self._streams.values():
            stream.reset = True
            stream.changed.set()
            stream.window.set()
        self._streams.clear()
        self._writable.set()
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

    def close(self, code: int = h2.errors.ErrorCodes.NO_ERROR) -> None:
        """Answer the streams already begun, begin no more, then close (GOAWAY)."""
        if self.transport is None or self._dead or self._last_stream is not None:
            return
        self._last_stream = self._h2.highest_inbound_stream_id
        self._h2.close_connection(error_code=code, last_stream_id=self._last_stream)
        self._flush()
        self._close_when_done()

    # The protocol's events.

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, _IDLE_EVENTS) or (
            isinstance(event, h2.events.DataReceived) and not event.data
        ):
            self._idle_frame()
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
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                if (stream := self._streams.get(event.stream_id)) is not None:
                    stream.window.set()
            else:
                self._every_window_may_have_opened()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._every_window_may_have_opened()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # The caller is leaving: it begins no more streams, and those under way are
            # answered before the connection closes.
            if self._last_stream is None:
                self._last_stream = self._h2.highest_inbound_stream_id
            self._close_when_done()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        now = asyncio.get_running_loop().time()
        if self._last_stream is not None and stream_id > self._last_stream:
            # Sent before the caller read our GOAWAY: it may send it again, elsewhere.
            self._refuse(stream_id, now)
            return
        if len(self._answering) >= MAX_STREAMS or (
            self._in_progress.count >= self._in_progress.limit
        ):
            self._refuse(stream_id, now)
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
        stream = _Stream(stream_id, CIMultiDictProxy(headers), now)
        self._streams[stream_id] = stream
        method = pseudo.get(":method", "")
        path = pseudo.get(":path", "").partition("?")[0]
        request = Http2Request(self, stream, method, path)
        task = asyncio.get_running_loop().create_task(self._answer(stream, request))
        self._answering.add(task)
        self._in_progress.tasks.add(task)
        task.add_done_callback(self._answered)
        self._begun += 1
        self._begun_lately += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._begun >= MAX_STREAMS_PER_CONNECTION or now - self._opened > MAX_CONNECTION_SECONDS:
            self.close()  # this stream is still answered; the caller's next goes elsewhere

    def _refuse(self, stream_id: int, now: float) -> None:
        """Tell the caller a stream was not begun, so it may send it again."""
        # A stream the caller reset already, in the same read, needs nothing more.
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
        if self._last_stream is not None:
            # Past our GOAWAY only those already on their way may come.
            self._after_goaway += 1
            if self._after_goaway > AFTER_GOAWAY_TOLERATED:
                log.warning("cut off an HTTP/2 caller that kept opening streams after GOAWAY")
                self._cut(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            return
        self._window_from(now)
        self._refused += 1
        if self._refused == 1:
            log.warning(
                "refused an HTTP/2 stream: %d answers in progress on its connection, %d in all",
                len(self._answering),
                self._in_progress.count,
            )
        if self._refused > REFUSALS_TOLERATED:
            log.warning(
                "told an HTTP/2 caller to calm down: %d streams refused in %g s",
                self._refused,
                REFUSALS_SECONDS,
            )
            self._calm()

    def _window_from(self, now: float) -> None:
        """Start counting refusals and idle frames afresh every `REFUSALS_SECONDS`."""
        if now - self._refused_since > REFUSALS_SECONDS:
            self._refused_since = now
            self._refused = 0
            self._idle_frames = 0
            self._begun_lately = 0

    def _idle_frame(self) -> None:
        self._window_from(asyncio.get_running_loop().time())
        self._idle_frames += 1
        # Each stream answered earns its caller a few: its window updates, mostly.
        if self._idle_frames > IDLE_FRAMES_TOLERATED + 4 * self._begun_lately:
            log.warning(
                "cut off an HTTP/2 caller that sent %d frames beginning no work in %g s",
                self._idle_frames,
                REFUSALS_SECONDS,
            )
            self._cut(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _calm(self) -> None:
        """Tell the caller to stop: what it began is answered, unless it was told already."""
        if self._last_stream is None:
            self.close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            self._cut(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        length = event.flow_controlled_length or 0
        if stream is None or stream.discarding:
            # Nobody will read it: its window opens at once, so that the others flow.
            self._h2.acknowledge_received_data(length, event.stream_id)
            return
        data = event.data or b""
        stream.received += len(data)
        if stream.received > self.max_body_bytes:
            stream.too_large = True
            stream.body.clear()
            self._h2.acknowledge_received_data(length + stream.unacknowledged, event.stream_id)
            stream.unacknowledged = 0
        else:
            stream.body += data
            stream.unacknowledged += length
            if stream.reading:
                self.acknowledge(stream)
        stream.changed.set()

    def _on_reset(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        stream.reset = True
        stream.body.clear()
        stream.changed.set()
        stream.window.set()
        self.acknowledge(stream)
        if asyncio.get_running_loop().time() - stream.opened > EARLY_RESET_SECONDS:
            return
        self._early_resets += 1
        if self._early_resets > RESETS_TOLERATED and 2 * self._early_resets > self._begun:
            log.warning(
                "told an HTTP/2 caller to calm down: it reset %d of its %d streams at once",
                self._early_resets,
                self._begun,
            )
            self._calm()

    def acknowledge(self, stream: _Stream) -> None:
        """Open the caller's windows again by what was received of `stream` and not
        acknowledged."""
        if stream.unacknowledged and not self._dead:
            self._h2.acknowledge_received_data(stream.unacknowledged, stream.id)
            stream.unacknowledged = 0
            self._flush_soon()

    def _every_window_may_have_opened(self) -> None:
        for stream in self._streams.values():
            stream.window.set()

    # Answering.

    async def _answer(self, stream: _Stream, request: Http2Request) -> None:
        handler = self._routes.get((request.method, request.path))
        try:
            if handler is not None:
                response = await handler(request)
            elif request.path in self._paths:
                response = _error(405, f"{request.method} is not allowed on {request.path}")
            else:
                response = _error(404, f"no such path: {request.path}")
        except Exception:
            log.exception("answering an HTTP/2 request to %s failed", request.path)
            response = _error(500, "internal error")
        stream.done = True
        stream.body.clear()
        self.acknowledge(stream)
        try:
            async with asyncio.timeout(SEND_SECONDS):
                await self._send(stream, response)
        except TimeoutError:
            log.warning(
                "gave up an HTTP/2 answer to %s: its caller took none of it for %g s",
                request.path,
                SEND_SECONDS,
            )
            self._reset(stream, h2.errors.ErrorCodes.CANCEL)
        finally:
            self._streams.pop(stream.id, None)
        if self._drain.draining:
            self.close()

    async def _send(self, stream: _Stream, response: web.Response) -> None:
        if stream.reset or self._dead:
            return  # nobody to answer (a handler's 499 says as much)
        body = b"" if response.body is None else response.body
        if not isinstance(body, bytes):
            log.error("an HTTP/2 answer must be bytes, not %s", type(body).__name__)
            self._reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
            return
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
            # Headers and the first frames of the body leave in one write.
            self._h2.send_headers(stream.id, headers, end_stream=not body)
            sent = 0
            while sent < len(body):
                await self._writable.wait()
                if stream.reset or self._dead:
                    return
                room = min(
                    self._h2.local_flow_control_window(stream.id),
                    self._h2.max_outbound_frame_size or _SMALLEST_FRAME,
                    len(body) - sent,
                )
                if room <= 0:
                    self._flush()  # what fits goes out meanwhile: the headers at least
                    stream.window.clear()
                    await stream.window.wait()
                    continue
                end = sent + room
                self._h2.send_data(stream.id, body[sent:end], end_stream=end == len(body))
                sent = end
                self._flush()
            self._flush()  # an answer without a body: its headers alone
            if not stream.ended:
                # Answered before the whole body came (a 413): the rest is not wanted.
                self._reset(stream, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.StreamClosedError:
            return  # the caller reset the stream while it was answered
        except h2.exceptions.ProtocolError:
            log.exception("an HTTP/2 answer could not be sent")
            self._reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)

    def _reset(self, stream: _Stream, code: int) -> None:
        if self._dead:
            return
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(stream.id, code)
        self._flush()

    def _answered(self, task: asyncio.Task[None]) -> None:
        self._answering.discard(task)
        self._in_progress.tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("an HTTP/2 answer failed", exc_info=error)
        if self._dead:
            return
        if self._last_stream is not None:
            self._close_when_done()
        elif not self._answering:
            self._idle_from_now()

    # The connection.

    def _flush_soon(self) -> None:
        """Send what h2 has to send once this turn of the event loop ends, with whatever
        else it adds meanwhile: one TLS record, not one per frame."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        data = self._h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _header_block_pending(self) -> int:
        """Bytes of a header block h2 holds until its last CONTINUATION frame."""
        return sum(len(frame.data) for frame in self._h2.incoming_buffer._headers_buffer)

    def _frame_pending(self) -> int:
        """Bytes h2 holds of a frame not whole yet: it checks a frame's announced length
        only once all of it has come."""
        return len(self._h2.incoming_buffer._data)

    def _close_when_done(self) -> None:
        if not self._answering and self.transport is not None:
            self._flush()
            self.transport.close()

    def _cut(self, code: int | None = None) -> None:
        """Close at once, answering nothing more: after a protocol error (h2 has said GOAWAY
        with its reason unless `code` is given)."""
        if self.transport is None or self._dead:
            return
        self._dead = True
        if code is not None:
            self._h2.close_connection(error_code=code, last_stream_id=self._last_stream)
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


# What a frame that begins no work makes h2 say (a SETTINGS frame's acknowledgement, a
# PING's, and a connection WINDOW_UPDATE among them).
_IDLE_EVENTS = (
    h2.events.PingReceived,
    h2.events.PingAckReceived,
    h2.events.RemoteSettingsChanged,
    h2.events.SettingsAcknowledged,
    h2.events.WindowUpdated,
    h2.events.PriorityUpdated,
    h2.events.UnknownFrameReceived,
)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def served_over_http2(transport: asyncio.BaseTransport) -> bool:
    """Whether the caller chose HTTP/2 in the TLS handshake."""
    ssl_object: Any = transport.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == ALPN
