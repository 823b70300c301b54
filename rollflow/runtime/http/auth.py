"""Bearer-token checks that answer 401 for a wrong, missing or malformed header, never a 500."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from rollflow.runtime.http.errors import http_error

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def require_bearer(request: web.Request, token: str | None, what: str = "this endpoint") -> None:
    """Raise 401 unless `Authorization: Bearer <token>` was sent; nothing is checked without a token.

    aiohttp hands header bytes that are not UTF-8 over as surrogate escapes, which `str.encode`
    refuses: such a header is malformed (a 401 naming it), never a crash in the comparison.
    """
    if not token:
        return
    given = request.headers.get("Authorization", "")
    try:
        given_bytes = given.encode("utf-8")
    except UnicodeEncodeError:
        raise _unauthorized(
            f"{what} needs 'Authorization: Bearer <token>'; the header sent is not UTF-8"
        ) from None
    if not hmac.compare_digest(given_bytes, f"Bearer {token}".encode()):
        raise _unauthorized(f"{what} needs 'Authorization: Bearer <token>'")


def _unauthorized(message: str) -> web.HTTPException:
    return http_error(web.HTTPUnauthorized, message, headers={"WWW-Authenticate": "Bearer"})


def bearer_middleware(token: str | None, protected: Callable[[web.Request], bool], what: str):
    """Middleware that checks the bearer token on the requests `protected` picks (none without a token)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and protected(request):
            require_bearer(request, token, what)
        return await handler(request)

    return check
