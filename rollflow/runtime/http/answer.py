"""JSON answers encoded with orjson: the hot routes (`/generate`, SSE events) answer thousands of
times a second, and the standard library's encoder cost them more than the routing did."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps(payload: Any) -> bytes:
    return orjson.dumps(payload, option=OPTIONS)


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type="application/json")
