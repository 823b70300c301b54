"""Reading and parsing request bodies at the edge: every bad byte is a 4xx naming the problem.

Bodies are read up to a limit (413 above it); they must be UTF-8 JSON objects whose strings hold
no lone surrogates, nested no deeper than the parser's recursion limit. Bodies above
`THREAD_PARSE_BYTES` are parsed in a child process and validated in a worker thread, so a big body
does not hold the event loop (health checks, streams, stall timers) while it is parsed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from aiohttp import web

from rollflow.runtime.http.errors import http_error, too_large
from rollflow.runtime.http.json_object import BodyError, parse_json_object
from rollflow.runtime.http.parse_process import parse_in_child
from rollflow.runtime.http.serve import body_limits, close_slow

T = TypeVar("T")
THREAD_PARSE_BYTES = 1 << 20


Narrow = Callable[[bytes], "tuple[int, str] | None"]
"""A route's tighter limit for a body, from its first `PEEK_BYTES`: (bytes, why) or None."""
PEEK_BYTES = 1 << 16


async def read_body(request: web.Request, limit: int, narrow: Narrow | None = None) -> bytes:
    """The raw body, or 413 when it (or its declared length) exceeds `limit` bytes, or the limit
    that `narrow` sets from the body's start: a body sure to be refused is refused once its first
    `PEEK_BYTES` are here, not once all of it is."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large("the body", declared, limit)
    content = request.content
    if content.is_eof():  # the whole body came with the head (most requests): nothing to wait for
        raw = content.read_nowait()
        if len(raw) > limit:
            raise too_large("the body", len(raw), limit)
        _check_narrow(narrow, raw, max(len(raw), declared or 0))
        return raw
    chunks, size = [], 0
    async for chunk in iter_body(request):
        size += len(chunk)
        if size > limit:
            raise too_large("the body", size, limit)
        chunks.append(chunk)
        if narrow is not None and size >= PEEK_BYTES:
            head = b"".join(chunks)
            chunks = [head]
            limit = _check_narrow(narrow, head, max(size, declared or 0)) or limit
            narrow = None
    # a big join in a worker thread: bytes.join lets go of the GIL while it copies 1 MiB or more
    raw = await asyncio.to_thread(b"".join, chunks) if size > THREAD_PARSE_BYTES else b"".join(chunks)
    _check_narrow(narrow, raw, size)
    return raw


def _check_narrow(narrow: Narrow | None, head: bytes, size: int) -> int | None:
    """The narrower limit `narrow` sets from `head` (None: none); 413 when `size` is above it."""
    if narrow is None:
        return None
    narrowed = narrow(head[:PEEK_BYTES])
    if narrowed is None:
        return None
    bound, why = narrowed
    if size > bound:
        raise http_error(
            web.HTTPRequestEntityTooLarge,
            f"the body is {size} bytes or more: {why}",
            max_size=bound,
            actual_size=size,
        )
    return bound


async def iter_body(request: web.Request, chunk_bytes: int = 1 << 16):
    """The body's chunks; a body that comes too slowly (serve.py's `BodyLimits`: a pause, its total
    time, its average rate) is cut off and its connection closed, so a trickled or half-sent body
    cannot hold a socket for long."""
    limits = body_limits(request)
    loop = asyncio.get_running_loop()
    started = last = loop.time()
    received = 0
    while True:
        wait = limits.deadline(started, last, received) - loop.time()
        try:
            if wait <= 0:
                raise TimeoutError
            async with asyncio.timeout(wait):
                chunk = await request.content.read(chunk_bytes)
        except TimeoutError:
            raise close_slow(request, limits.why(started, last, received)) from None
        if not chunk:
            return
        received += len(chunk)
        last = loop.time()
        yield chunk


async def read_json_object(
    request: web.Request,
    limit: int,
    validate: Callable[[dict[str, Any]], T] = lambda data: data,
    narrow: Narrow | None = None,
) -> T:
    """Read the body (`read_body`), parse it as a JSON object and `validate` it (which may raise
    an HTTP error); 400 (or 413) with a clear message for bad bytes. A body above
    `THREAD_PARSE_BYTES` is parsed in a child process (parse_process.py) and validated in a worker
    thread, so that it does not hold the event loop."""
    raw = await read_body(request, limit, narrow)
    if len(raw) <= THREAD_PARSE_BYTES:
        return validate(_parse_or_400(raw))
    try:
        data = await parse_in_child(raw)
    except BodyError as exc:
        raise http_error(web.HTTPBadRequest, str(exc)) from None
    except BrokenProcessPool:
        message = "the process that parses big bodies died while parsing this one; send it again"
        raise http_error(web.HTTPServiceUnavailable, message) from None
    return await asyncio.get_running_loop().run_in_executor(None, validate, data)


def _parse_or_400(raw: bytes) -> dict[str, Any]:
    try:
        return parse_json_object(raw)
    except BodyError as exc:
        raise http_error(web.HTTPBadRequest, str(exc)) from None
