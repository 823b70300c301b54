"""The one error body every rollflow server answers with: `{"error": {"message": ...}}`."""

from __future__ import annotations

import json

from aiohttp import web


def error_body(message: str) -> str:
    return json.dumps({"error": {"message": message}})


def http_error(cls: type[web.HTTPException], message: str, **kwargs) -> web.HTTPException:
    """An aiohttp HTTP exception (raise it) carrying the shared JSON error body."""
    return cls(text=error_body(message), content_type="application/json", **kwargs)


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
