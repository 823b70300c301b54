"""An AppRunner that closes half-open connections: one that has not sent a whole request head
within `read_timeout_s` of connecting is closed, and `read_body` closes one whose body stalls for
as long. aiohttp has no header or body read timeout of its own; without one, each slow or
abandoned client holds a socket (and a file descriptor) forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 30.0
READ_TIMEOUT_KEY = web.AppKey("rollflow_read_timeout_s", float)


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` whose connections must deliver a request head within `read_timeout_s`."""

    def __init__(
        self, app: web.Application, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, **kwargs: Any
    ) -> None:
        app[READ_TIMEOUT_KEY] = read_timeout_s  # read_body's limit between two body chunks
        kwargs.setdefault("keepalive_timeout", read_timeout_s)  # an idle kept-alive connection too
        super().__init__(app, **kwargs)
        self._read_timeout_s = read_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        timeout = self._read_timeout_s
        started: set = set()  # open connections' handlers that parsed a request head
        make_request = server.request_factory
        track_connection = server.connection_made
        untrack_connection = server.connection_lost

        def request_factory(message, payload, protocol, writer, task, *args: Any, **kwargs: Any):
            started.add(protocol)
            return make_request(message, payload, protocol, writer, task, *args, **kwargs)

        def connection_made(handler, transport: asyncio.Transport) -> None:
            track_connection(handler, transport)
            asyncio.get_running_loop().call_later(timeout, _close_if_headless, handler, transport)

        def _close_if_headless(handler, transport: asyncio.Transport) -> None:
            if handler not in started and not transport.is_closing():
                logger.info("closing a connection that sent no whole request head in %.0fs", timeout)
                transport.close()

        def connection_lost(handler, exc: BaseException | None = None) -> None:
            started.discard(handler)
            untrack_connection(handler, exc)

        server.request_factory = request_factory
        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]
        return server


def read_timeout(request: web.Request) -> float:
    return request.app.get(READ_TIMEOUT_KEY, DEFAULT_READ_TIMEOUT_S)


def close_stalled(request: web.Request) -> web.HTTPException:
    """Close the connection of a request whose body stalled; the returned 408 is for the log."""
    if request.transport is not None:
        request.transport.close()
    return web.HTTPRequestTimeout(text=f"no body bytes for {read_timeout(request):.0f}s")
