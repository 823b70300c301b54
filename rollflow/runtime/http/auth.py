"""Bearer-token checks that answer 401 for a wrong, missing or malformed header, never a 500.

The scheme is matched without regard to case (`Bearer`, `bearer`, `BEARER`: RFC 7235 section 2.1
makes auth schemes case-insensitive); the token itself is compared exactly, in constant time."""

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
    scheme, _, credentials = given_bytes.partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(b" "), token.encode()):
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
