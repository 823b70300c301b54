"""An AppRunner that closes half-open and slow connections. aiohttp has no header or body read
timeout of its own; without one, each slow or abandoned client holds a socket (and a file
descriptor) forever, and a body sent a byte every few seconds holds it as well.

A connection that has not sent a whole request head within `read_timeout_s` of connecting is
closed; `iter_body` cuts off a body under the rule of `limits.BodyLimits`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from rollflow.runtime.http.limits import DEFAULT_LIMITS, BodyLimits

logger = logging.getLogger(__name__)

BODY_LIMITS_KEY = web.AppKey("rollflow_body_limits", BodyLimits)


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` whose connections must deliver a request head within `read_timeout_s`, and
    whose bodies are read under `limits` (by `iter_body`)."""

    def __init__(self, app: web.Application, limits: BodyLimits = DEFAULT_LIMITS, **kwargs: Any) -> None:
        app[BODY_LIMITS_KEY] = limits
        read_timeout_s = limits.read_timeout_s
        kwargs.setdefault("keepalive_timeout", read_timeout_s)  # an idle kept-alive connection too
        super().__init__(app, **kwargs)
        self.limits = limits
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


def body_limits(request: web.Request) -> BodyLimits:
    return request.app.get(BODY_LIMITS_KEY) or DEFAULT_LIMITS


def close_slow(request: web.Request, why: str) -> web.HTTPException:
    """Close the connection of a request whose body came too slowly; the returned 408 is for the log
    (the client, which stopped sending in time, is not waiting for an answer)."""
    logger.info("closing a connection whose body came too slowly: %s", why)
    if request.transport is not None:
        request.transport.close()
    return web.HTTPRequestTimeout(text=why)
