"""An HTTP/2 caller over TLS for the tests: h2's own client state machine, asyncio's TLS.

It speaks as the apiserver's Go client does (ALPN `h2`, many streams on one connection) and
also does what no good client does (resets, floods), to test the server's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import orjson

from webhook.server.http2 import streams_outlive_goaway


@dataclass
class Answer:
    """What came back on one stream."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    reset: int | None = None  # the error code of a RST_STREAM, if the server reset it
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def json(self) -> Any:
        return orjson.loads(bytes(self.body))


class H2Client:
    """One HTTP/2 connection to a test server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        # As the apiserver's Go client: the streams under way are answered after a GOAWAY.
        streams_outlive_goaway(self.h2)
        self.answers: dict[int, Answer] = {}
        self.goaways: list[h2.events.ConnectionTerminated] = []
        self.ping_acks = 0
        self.closed = asyncio.Event()
        self.settings_seen = asyncio.Event()
        self.remote_settings: dict[int, int] = {}
        # Bodies not sent yet for want of window: (what is left, whether to end the stream).
        self.unsent: dict[int, tuple[bytes, bool]] = {}
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        port: int,
        context: ssl.SSLContext,
        *,
        window: int | None = None,
        read: bool = True,
    ) -> H2Client:
        """Connect and exchange the prefaces; `window` is the initial window we give the
        server's answers; with `read` false nothing the server sends is read."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="localhost"
        )
        ssl_object = writer.get_extra_info("ssl_object")
        assert ssl_object.selected_alpn_protocol() == "h2"
        client = cls(reader, writer)
        if window is not None:
            client.h2.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        client.h2.initiate_connection()
        client.flush()
        if read:
            client._reading = asyncio.get_running_loop().create_task(client._read())
            await asyncio.wait_for(client.settings_seen.wait(), 10)
        return client

    @property
    def goaway(self) -> h2.events.ConnectionTerminated | None:
        """The first GOAWAY the server sent, if it sent one. A later one may only name the
        same last stream or an earlier one (RFC 9113, section 6.8)."""
        last = [event.last_stream_id or 0 for event in self.goaways]
        assert last == sorted(last, reverse=True), self.goaways
        return self.goaways[0] if self.goaways else None

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def open(
        self,
        path: str,
        body: bytes = b"",
        *,
        method: str = "POST",
        headers: dict[str, str] | None = None,
        end: bool = True,
    ) -> int:
        """Open a stream with headers and `body`, ended unless `end` is false."""
        stream_id = self.h2.get_next_available_stream_id()
        sent = {"content-type": "application/json"} if headers is None else headers
        self.h2.send_headers(
            stream_id,
            [
                (":method", method),
                (":path", path),
                (":scheme", "https"),
                (":authority", "localhost"),
                *sent.items(),
            ],
            end_stream=end and not body,
        )
        self.answers[stream_id] = Answer()
        if body:
            self.unsent[stream_id] = (body, end)
            self.pump()
        self.flush()
        return stream_id

    def pump(self) -> None:
        """Send what the server's windows let through of the bodies not sent yet."""
        for stream_id, (left, end) in list(self.unsent.items()):
            while left:
                try:
                    room = min(
                        self.h2.local_flow_control_window(stream_id),
                        self.h2.max_outbound_frame_size,
                        len(left),
                    )
                    if room <= 0:
                        break
                    last = end and room == len(left)
                    self.h2.send_data(stream_id, left[:room], end_stream=last)
                except h2.exceptions.StreamClosedError:
                    left = b""  # the server is done with it: answered, or reset
                    break
                left = left[room:]
            if left:
                self.unsent[stream_id] = (left, end)
            else:
                del self.unsent[stream_id]
        self.flush()

    async def call(
        self, path: str, body: bytes = b"", *, method: str = "POST", **options: Any
    ) -> Answer:
        answer = self.answers[self.open(path, body, method=method, **options)]
        await asyncio.wait_for(answer.done.wait(), 20)
        return answer

    async def review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await self.call(path, orjson.dumps(body))
        assert answer.status == 200, bytes(answer.body)
        response: dict[str, Any] = answer.json()["response"]
        return response

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for event in self.h2.receive_data(data):
                    self._on(event)
                self.flush()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            self.closed.set()
            for answer in self.answers.values():
                answer.done.set()

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            for code, change in event.changed_settings.items():
                self.remote_settings[int(code)] = change.new_value
            self.settings_seen.set()
        elif isinstance(event, h2.events.ResponseReceived):
            answer = self.answers[event.stream_id]
            for name, value in event.headers or ():
                assert isinstance(name, str)
                assert isinstance(value, str)
                if name == ":status":
                    answer.status = int(value)
                else:
                    answer.headers[name] = value
        elif isinstance(event, h2.events.DataReceived):
            self.answers[event.stream_id].body += event.data or b""
            self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.answers[event.stream_id].done.set()
        elif isinstance(event, h2.events.StreamReset):
            self.unsent.pop(event.stream_id, None)
            if (reset := self.answers.get(event.stream_id)) is not None:
                reset.reset = event.error_code
                reset.done.set()
        elif isinstance(event, h2.events.WindowUpdated):
            self.pump()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaways.append(event)
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_acks += 1


def client_context(ca_file: Any, *, cert: tuple[Any, Any] | None = None) -> ssl.SSLContext:
    """A TLS context that trusts `ca_file` and offers HTTP/2 (and a client certificate)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.set_alpn_protocols(["h2"])
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context
