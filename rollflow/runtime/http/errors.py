"""The one error body every rollflow server answers with: `{"error": {"message": ...}}`."""

from __future__ import annotations

import json

from aiohttp import web


def error_body(message: str) -> str:
    return json.dumps({"error": {"message": message}})


def http_error(cls: type[web.HTTPException], message: str, **kwargs) -> web.HTTPException:
    """An aiohttp HTTP exception (raise it) carrying the shared JSON error body."""
    return cls(text=error_body(message), content_type="application/json", **kwargs)


def error_response(status: int, message: str) -> web.Response:
    """A response (return it) carrying the shared JSON error body."""
    return web.Response(status=status, text=error_body(message), content_type="application/json")
