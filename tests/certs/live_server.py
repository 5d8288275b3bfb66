"""An aiohttp HTTPS server on loopback, and a client that records handshakes."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web

from tests.certs.factory import LOOPBACK
from tests.certs.handshake import client_context, peer_certificate


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@asynccontextmanager
async def https_server(context: ssl.SSLContext) -> AsyncIterator[str]:
    """Serve a trivial app over TLS on an ephemeral loopback port; yield its URL."""
    app = web.Application()
    app.router.add_get("/", _ok)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=context)
        await site.start()
        port = runner.addresses[0][1]
        yield f"https://{LOOPBACK}:{port}/"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def recording_session(
    trusted_pem: bytes, *, force_close: bool
) -> AsyncIterator[tuple[aiohttp.ClientSession, list[bytes]]]:
    """Open a client session and the list of certificates its handshakes saw, as PEM.

    With ``force_close`` every request opens a new connection, hence makes a
    new handshake; without it the session keeps its connection alive.
    """
    presented: list[bytes] = []

    class RecordingSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()
            presented.append(peer_certificate(self))

    context = client_context(trusted_pem)
    context.sslobject_class = RecordingSSLObject
    connector = aiohttp.TCPConnector(ssl=context, force_close=force_close)
    async with aiohttp.ClientSession(connector=connector, raise_for_status=True) as session:
        yield session, presented


async def get_over_new_connection(url: str, trusted_pem: bytes) -> bytes:
    """GET ``url`` over a connection of its own; return the certificate it was shown."""
    async with (
        recording_session(trusted_pem, force_close=True) as (session, presented),
        session.get(url) as response,
    ):
        await response.read()
    [certificate] = presented
    return certificate
