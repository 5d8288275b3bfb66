"""What a handler may ask of a request, whichever protocol carried it.

aiohttp's `web.Request` serves HTTP/1.1; `server.http2` serves the apiserver's HTTP/2 calls
with a request of its own. Both give the handlers this much and no more, so a handler
written against it answers the same over either, and the routes are one table
(`ROUTES` in the app) that both servers read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web
from multidict import CIMultiDictProxy


class Incoming(Protocol):
    """A request as the handlers see it."""

    @property
    def app(self) -> web.Application: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def content_type(self) -> str: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def transport(self) -> asyncio.BaseTransport | None: ...

    async def read(self) -> bytes:
        """The whole body; `web.HTTPRequestEntityTooLarge` when it is over the app's
        `client_max_size`, `ConnectionError` when the caller hung up."""
        ...


Handler = Callable[[Incoming], Awaitable[web.Response]]
# (method, path) to the handler that answers it.
Routes = Mapping[tuple[str, str], Handler]
