"""The one server-sent-events writer: `data: {json}` events ended by `data: [DONE]`, as SGLang,
vLLM and OpenAI stream, used by the manager and the built-in engine alike."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rollflow.runtime.http.answer import dumps

DONE = b"data: [DONE]\n\n"


async def open_sse(request: web.Request) -> web.StreamResponse:
    """Send the headers of an event stream; events follow with `send_event`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


def event(payload: Any) -> bytes:
    """One `data: {json}` event."""
    return b"data: " + dumps(payload) + b"\n\n"


async def send_event(response: web.StreamResponse, payload: Any) -> None:
    await response.write(event(payload))


async def close_sse(response: web.StreamResponse) -> web.StreamResponse:
    """Write the `[DONE]` event and end the body."""
    await response.write(DONE)
    await response.write_eof()
    return response
