"""The one error body every rollflow server answers with: `{"error": {"message": ...}}`."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web


def error_body(message: str) -> str:
    return json.dumps({"error": {"message": message}})


def http_error(cls: type[web.HTTPException], message: str, **kwargs) -> web.HTTPException:
    """An aiohttp HTTP exception (raise it) carrying the shared JSON error body."""
    return cls(text=error_body(message), content_type="application/json", **kwargs)


def too_large(what: str, size: int, limit: int, hint: str = "") -> web.HTTPException:
    """A 413 (raise it): `what` ("the body", "the upload") is `size` bytes or more, above this server's
    `limit`; `hint` names the option that sets the limit. Carries aiohttp's `max_size`/`actual_size`."""
    return http_error(
        web.HTTPRequestEntityTooLarge,
        f"{what} is {size} bytes or more, above this server's limit of {limit} bytes{hint}",
        max_size=limit,
        actual_size=size,
    )


class BadRequest(web.HTTPBadRequest):
    """A 400 carrying `message` in the shared error body: raise it where input is wrong, at any depth
    of a handler, and aiohttp answers it (no middleware needed); str() is the message."""

    def __init__(self, message: str) -> None:
        super().__init__(text=error_body(message), content_type="application/json")
        self.message = message

    def __str__(self) -> str:
        return self.message


def error_response(status: int, message: str) -> web.Response:
    """A response (return it) carrying the shared JSON error body."""
    return web.Response(status=status, text=error_body(message), content_type="application/json")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def errors_as_json(statuses: dict[type[Exception], int]):
    """A middleware answering the exceptions a server's own code raises with their status and the
    shared error body: `statuses` maps each class to its status, the first that matches wins (so a
    subclass goes before its base)."""
    caught = tuple(statuses)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except caught as exc:
            status = next(code for cls, code in statuses.items() if isinstance(exc, cls))
            return error_response(status, str(exc))

    return middleware
