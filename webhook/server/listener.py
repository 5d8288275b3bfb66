"""Listening: the HTTPS site of one replica, bounded in connections, until it is told to stop.

aiohttp's `run_app` would do the rest of this, but not bound what connections cost: a
thousand idle TLS sessions cost about 50 MiB, and nothing stops a caller from opening
thousands. The site here closes any connection over `MAX_CONNECTIONS` as it arrives, ends
handshakes that take longer than `HANDSHAKE_SECONDS`, and never inflates a compressed body
(the handlers refuse one unread). It logs that it serves only once it listens, so a port
in use is a clear error, not a traceback after "serving on".

It serves HTTP/1.1 only (aiohttp's), and the TLS context offers nothing else by ALPN
(`certs.server_ssl_context`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from webhook.server.appkeys import DRAIN

log = logging.getLogger("gpuadm.serve")

# The apiserver keeps one connection per concurrent call from a small pool, and a replica
# serves one or a few apiservers: hundreds are plenty.
MAX_CONNECTIONS = 1024
# The apiserver's handshake takes milliseconds; asyncio's default would let a silent caller
# keep a half-open session for a minute.
HANDSHAKE_SECONDS = 10.0
# How often the handshakes under way are counted afresh, when under the limit.
PRUNE_SECONDS = 1.0
# The apiserver's webhook client (client-go's transport) closes a connection idle for 90 s
# (Go's http.DefaultTransport IdleConnTimeout). A replica keeps one open longer, so that the
# client always closes first: a server closing at the same moment as the client reuses the
# connection would fail that call.
APISERVER_IDLE_SECONDS = 90.0
KEEPALIVE_SECONDS = 120.0
# As aiohttp's run_app: a stop waits this long for the answers in flight.
SHUTDOWN_SECONDS = 60.0
# How the runner serves every connection. A compressed body is never inflated: the handlers
# refuse it with 415 unread.
RUNNER_OPTIONS: dict[str, Any] = {
    "access_log": None,
    "keepalive_timeout": KEEPALIVE_SECONDS,
    "shutdown_timeout": SHUTDOWN_SECONDS,
    "auto_decompress": False,
}


class LimitedSite(web.BaseSite):
    """A TCP site that serves at most `max_connections` at once and closes any above them.

    A connection counts from the moment it is accepted: while its TLS handshake runs (which
    has `HANDSHAKE_SECONDS` to finish), then in aiohttp's own list of open connections
    until its handler is done. `on_refused` is called for each connection closed, and
    `on_opened` for each served.
    """

    __slots__ = ("_handshaking", "_host", "_max_connections", "_on_opened", "_on_refused", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        on_refused: Callable[[], None] = lambda: None,
        on_opened: Callable[[], None] = lambda: None,
        backlog: int = 128,
    ) -> None:
        """Listen on `host`:`port`, with TLS from `ssl_context` when given."""
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._on_refused = on_refused
        self._on_opened = on_opened
        # Handlers accepted whose handshake has not ended yet, with when it must have ended.
        self._handshaking: dict[asyncio.BaseProtocol, float] = {}

    @property
    def name(self) -> str:
        """Return the site's URL, as aiohttp's own sites do."""
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen; from now on connections are served, up to the limit."""
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol_factory(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            ssl_handshake_timeout=HANDSHAKE_SECONDS if self._ssl_context else None,
        )

    def _protocol_factory(self, server: web.Server) -> Callable[[], asyncio.BaseProtocol]:
        loop = asyncio.get_running_loop()

        pruned = [loop.time()]

        def ended(handshake: asyncio.BaseProtocol) -> None:
            self._handshaking.pop(handshake, None)

        def protocol() -> asyncio.BaseProtocol:
            now = loop.time()
            at_limit = len(server.connections) + len(self._handshaking) >= self._max_connections
            # Once a second, and whenever the count reaches the limit: not at each of a
            # burst's connections, which made the pass quadratic in the handshakes under way.
            # A handshake that ended leaves the count itself (`ended`); this drops those that
            # never will, given up on at the deadline without a word to the protocol.
            if self._handshaking and (at_limit or now - pruned[0] >= PRUNE_SECONDS):
                pruned[0] = now
                self._handshaking = {
                    handshake: deadline
                    for handshake, deadline in self._handshaking.items()
                    if deadline > now
                }
            if len(server.connections) + len(self._handshaking) >= self._max_connections:
                self._on_refused()
                return _Closing()
            self._on_opened()
            handshake = _Handshake(server(), ended)
            self._handshaking[handshake] = now + HANDSHAKE_SECONDS + 1
            return handshake

        return protocol


class _Handshake(asyncio.Protocol):
    """A connection's protocol until its TLS handshake ends, counted as a handshake under way.

    Once the handshake ends, it hands the transport to aiohttp's handler, which from then on
    is the connection's protocol and counts in the server's list of open connections. Counted
    so until the connection closed instead, a burst's short connections (the apiserver
    closes what it opened past the 25 it keeps idle) stayed counted for the handshake's
    deadline after they were gone, and a replica took its own limit as reached: it closed new
    connections on arrival, and the apiserver's calls on them failed with EOF.
    """

    __slots__ = ("_ended", "_handler")

    def __init__(
        self, handler: asyncio.Protocol, ended: Callable[[asyncio.BaseProtocol], None]
    ) -> None:
        self._handler = handler
        self._ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._ended(self)
        transport.set_protocol(self._handler)
        self._handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(self)


class _Closing(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made, nothing read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    on_refused: Callable[[], None] = lambda: None,
    on_opened: Callable[[], None] = lambda: None,
    max_connections: int = MAX_CONNECTIONS,
    drain_seconds: float = 0.0,
) -> None:
    """Serve `app` until SIGINT or SIGTERM, then stop gracefully; raise `OSError` when the
    address cannot be listened on.

    After SIGTERM the app drains for `drain_seconds` first (see `drain.py`), if it has a
    `Drain`; SIGINT or a second signal stops at once.
    """
    asyncio.run(
        _serve(
            app,
            host,
            port,
            ssl_context,
            on_refused,
            on_opened,
            max_connections,
            drain_seconds,
        )
    )


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    on_refused: Callable[[], None],
    on_opened: Callable[[], None],
    max_connections: int,
    drain_seconds: float,
) -> None:
    stop = asyncio.Event()
    at_once = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        if stop.is_set() or signum == signal.SIGINT:
            at_once.set()
        stop.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    runner = web.AppRunner(app, **RUNNER_OPTIONS)
    await runner.setup()
    try:
        site = LimitedSite(
            runner,
            host,
            port,
            ssl_context=ssl_context,
            max_connections=max_connections,
            on_refused=on_refused,
            on_opened=on_opened,
        )
        await site.start()
        log.info("serving on %s", site.name)
        await stop.wait()
        drain = app.get(DRAIN)
        if drain is not None and drain_seconds > 0 and not at_once.is_set():
            drain.begin()
            log.info(
                "draining for %.0f s: /readyz fails and each connection closes after its answer",
                drain_seconds,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(at_once.wait(), drain_seconds)
        log.info("stopping: answering the reviews in flight, then leaving")
    finally:
        await runner.cleanup()
