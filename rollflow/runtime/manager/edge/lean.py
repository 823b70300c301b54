"""A lean HTTP/1.1 path for the manager's hottest requests, with aiohttp's server behind it.

`POST /generate` with one prompt, answered as one JSON body or streamed, is what a router in front
of engines serves thousands of times a second (SGLang-style rollout clients send little else).
Profiled under that load against an engine answering at once (benchmarks/manager_overhead.py),
aiohttp's request machinery (the request and its payload stream, the handler task, the middleware,
the response and its writer) took about a fifth of the manager's CPU per request, and a streamed
answer paid a task wake-up and a trip through aiohttp's writer per event. Here a connection's
requests are parsed by one asyncio protocol: the head's request line and its framing, the body,
and an answer written in one write, or a stream's events each written as they come. No task waits
on the request: the connection is the sample's watcher (the manager tells it of every update),
and writes in a callback: the answer once the sample is final, or a stream's next event.

Only requests this path answers exactly as aiohttp's route would are served here. The first request
of a connection that is anything else (another route or method, a batched or session `/generate`,
a body that is malformed or would be refused, a chunked or `Expect:` body, HTTP/1.0, a head that is
too big) hands the connection, with every byte it has buffered, to aiohttp's request handler for
good, which answers that request and the ones after it as before: one error shape, one set of
routes. What the lean path keeps from aiohttp's server as the manager runs it: keep-alive,
`Connection: close`, the read timeouts (a head must come whole within `read_timeout_s` of the
connection's start or its last answer, and a body is cut off under `BodyLimits`' rule, as
`iter_body` cuts off aiohttp's), a request released
when its client goes away (the sample is cancelled, and its engine request aborted), 4xx counted
in `rollflow_requests_rejected_total`, and a graceful shutdown. A stream opens with its first
tokens (so a request an engine refuses is still answered with its 4xx), and each event holds the
whole output so far, as SGLang's and the aiohttp route's do; a client that reads more slowly than
tokens come gets fewer events rather than a growing buffer (the next event holds what a skipped
one would have), and always the last.
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import re

from aiohttp import web

from rollflow.runtime.http.body import THREAD_PARSE_BYTES
from rollflow.runtime.http.errors import error_body
from rollflow.runtime.http.head import header_value, split_content_length
from rollflow.runtime.http.limits import BodyLimits
from rollflow.runtime.http.serve import GuardedRunner
from rollflow.runtime.http.sse import DONE
from rollflow.runtime.manager.edge import sglang_api
from rollflow.runtime.manager.edge.shared import MANAGER_KEY, body_limit_of

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8190  # aiohttp's own limit on a request line and on each header line
# unsent bytes of a stream's events past which a mid-stream event is skipped (the next one holds it)
STREAM_BACKLOG_BYTES = 1 << 20
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n"
)


def _chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_STREAM_END = _chunk(DONE) + b"0\r\n\r\n"
_REQUEST_LINE = b"POST /generate HTTP/1.1"
_HANDED_OVER = re.compile(rb"\r\n(?:transfer-encoding|expect|upgrade):")  # bodies framed otherwise
# header lines as RFC 9110 spells them (a token, a colon, a value), lower-cased, each after its CRLF
_HEADER_LINES = re.compile(rb"(?:\r\n[-!#$%&'*+.^_`|~0-9a-z]+:[^\r\n]*)*")


def _framing(head: bytes) -> tuple[int, bool] | None:
    """The body length and whether the connection stays open, for a head this path serves; None
    for any other head (aiohttp parses it then, and refuses what it must)."""
    line_end = head.find(b"\r\n")
    if line_end < 0 or head[:line_end] != _REQUEST_LINE:
        return None
    raw_length, others = split_content_length(head[line_end:].lower())
    length = (raw_length or b"").strip(b" \t")
    if not length.isdigit():  # none, or not a plain number
        return None
    keep_alive = _other_fields(others)
    return None if keep_alive is None else (int(length), keep_alive)


@functools.lru_cache(maxsize=256)
def _other_fields(fields: bytes) -> bool | None:
    """Whether the connection stays open, for a head whose header lines but its Content-Length
    this path serves; None for any other. A client sends the same few heads again and again but
    for the length, so each is checked once rather than per request."""
    if _HEADER_LINES.fullmatch(fields) is None or _HANDED_OVER.search(fields) is not None:
        return None  # a line aiohttp would not take as it is, or a body framed otherwise
    if b"\r\ncontent-length:" in fields:
        return None  # a second length
    connection = header_value(fields, b"connection")
    return connection is None or b"close" not in connection


@functools.lru_cache(maxsize=64)
def _status_lines(status: int, content_type: str) -> bytes:
    """An answer's head up to its length, made once per status and type (a few of each)."""
    reason = http.HTTPStatus(status).phrase
    return f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: ".encode()


def _answer_head(status: int, content_type: str, length: int, keep_alive: bool) -> bytes:
    end = b"\r\n\r\n" if keep_alive else b"\r\nConnection: close\r\n\r\n"
    return _status_lines(status, content_type) + str(length).encode() + end


class _LeanConnection(asyncio.Protocol):
    """One client connection, served here until its first request that aiohttp must answer."""

    def __init__(self, server: LeanServer) -> None:
        self._server = server
        self._loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.request: sglang_api.PromptRequest | None = None  # the request being answered
        self._answer_due = False  # a check of the request's sample is scheduled
        self._answered: asyncio.Future | None = None  # made at shutdown, done at the answer
        self._keep_alive = True
        self._paused = False
        self._closing = False  # the server shuts down: no request after the one in flight
        self._deadline = 0.0  # when a connection still waiting for a whole request is closed
        self._timer: asyncio.TimerHandle | None = None
        self._body: tuple[float, float, int] | None = None  # a partial body's start, last bytes, size
        self._streaming = False  # a stream's head is written

    # ---------------------------------------------------------------- the protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)
        self._wait_for_request()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self.request is not None:
            if len(self._buf) > self._server.body_limit + MAX_HEAD_BYTES and not self._paused:
                self._paused = True  # a client sending on and on while its answer is due
                self.transport.pause_reading()
            return
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._cancel_timer()
        request, self.request = self.request, None
        if request is not None:  # as aiohttp's handler cancellation: the sample is released
            request.release(self._server.manager)
            self._done()

    # ---------------------------------------------------------------- requests

    def _next(self) -> None:
        """Serve the buffer's next request if it is whole, or hand the connection over."""
        if self._closing:
            self.transport.close()
            return
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._hand_over()
            return
        framing = _framing(bytes(buf[:end]))
        if framing is None:
            self._hand_over()
            return
        length, keep_alive = framing
        if length > self._server.body_limit or length > THREAD_PARSE_BYTES:
            self._hand_over()  # aiohttp refuses it (413) or parses it off the loop, as it arrives
            return
        start = end + 4
        if len(buf) < start + length:  # the body is not all here: it may come only so slowly
            now = self._loop.time()
            started = now if self._body is None else self._body[0]
            self._body = (started, now, len(buf) - start)
            self._deadline = self._server.limits.deadline(*self._body)
            return
        self._body = None
        request = sglang_api.lean_request(self._server.app, bytes(buf[start : start + length]))
        if request is None:
            self._hand_over()
            return
        del buf[: start + length]
        self._keep_alive = keep_alive
        self._deadline = float("inf")
        self.request = request
        try:
            request.submit(self._server.manager, watcher=self)
        except Exception as exc:
            self._answer(failure=exc)  # nothing was submitted: the error's answer, now

    def set(self) -> None:
        """The manager's word that the request's sample changed (the sample's watcher): once it is
        final, answer it a loop turn later, as a task waiting on the sample would."""
        if not self._answer_due:
            self._answer_due = True
            self._loop.call_soon(self._check)

    def _check(self) -> None:
        self._answer_due = False
        request = self.request
        if request is None:
            return
        if request.body.stream:
            self._stream(request)
        elif request.finished:
            self._answer()

    def _stream(self, request: sglang_api.PromptRequest) -> None:
        """A streamed request's next event, as `sglang_api`'s route writes them (the request says
        what is due), except that a reader more than STREAM_BACKLOG_BYTES behind is sent no event
        until it catches up or the stream ends."""
        head = b""
        if not self._streaming:
            if not request.stream_can_open():
                return
            if request.refusal() is not None:
                self._answer()  # its 4xx, before any byte of a stream
                return
            keep_alive = self._keep_alive and not self._closing
            head = _STREAM_HEAD + (b"\r\n" if keep_alive else b"Connection: close\r\n\r\n")
            self._streaming = True
        transport = self.transport
        try:
            event = request.next_event(backlogged=transport.get_write_buffer_size() >= STREAM_BACKLOG_BYTES)
        except Exception:
            log.exception("error streaming POST /generate")
            if head:
                transport.write(head)
            transport.close()  # mid-stream: the client sees the stream break off
            return
        # one write (one send to the client) per call: the head goes with the first event, the end
        # with the last
        end = _STREAM_END if request.finished else b""
        if event is not None:
            transport.write(b"%s%x\r\n%s\r\n%s" % (head, len(event), event, end))
        elif head or end:
            transport.write(head + end)
        if end:
            self._finish(request)

    def _answer(self, failure: Exception | None = None) -> None:
        """Write the request's answer (its JSON, or its error in aiohttp's shape: the `failure` that
        kept it from being submitted, if one did) and release it."""
        request, self.request = self.request, None
        manager = self._server.manager
        try:
            if failure is not None:
                raise failure
            body = sglang_api.final_answer(request)
            status, content_type = 200, "application/json"
        except web.HTTPException as exc:
            if 400 <= exc.status < 500:
                manager.metrics.requests_rejected.labels(str(exc.status)).inc()
            status, content_type = exc.status, exc.content_type
            body = (exc.text or "").encode()
        except Exception:
            log.exception("error answering POST /generate")
            status, content_type = 500, "application/json"
            body = error_body("internal error answering /generate; see the manager's log").encode()
        finally:
            if failure is None:
                request.release(manager)
        self._done()
        transport = self.transport
        if transport.is_closing():
            return
        keep_alive = self._keep_alive and not self._closing
        transport.write(_answer_head(status, content_type, len(body), keep_alive) + body)
        self._next_request(keep_alive)

    def _finish(self, request: sglang_api.PromptRequest) -> None:
        """A stream's end was written: release its request and go on to the connection's next."""
        self.request, self._streaming = None, False
        request.release(self._server.manager)
        self._done()
        if not self.transport.is_closing():
            self._next_request(self._keep_alive and not self._closing)

    def _next_request(self, keep_alive: bool) -> None:
        transport = self.transport
        if not keep_alive:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        self._wait_for_request()
        if self._buf:
            self._next()

    def _hand_over(self) -> None:
        """aiohttp's request handler takes the connection, and what it sent so far, from here on."""
        self._server.connections.discard(self)
        self._cancel_timer()
        handler = self._server.aiohttp_server()
        transport = self.transport
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._paused:
            transport.resume_reading()
        data, self._buf = bytes(self._buf), bytearray()
        if data:
            handler.data_received(data)

    # ---------------------------------------------------------------- timeouts and shutdown

    def _wait_for_request(self) -> None:
        """A whole request must come within the read timeout from now."""
        self._deadline = self._loop.time() + self._server.read_timeout_s
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._due)

    def _done(self) -> None:
        answered, self._answered = self._answered, None
        if answered is not None and not answered.done():
            answered.set_result(None)

    def _due(self) -> None:
        self._timer = None
        if self.request is not None or self.transport.is_closing():
            return
        now = self._loop.time()
        if self._deadline > now:  # a later deadline was set meanwhile: wait for it
            if self._deadline != float("inf"):
                self._timer = self._loop.call_at(self._deadline, self._due)
            return
        if self._body is not None:
            log.info(
                "closing a connection whose body came too slowly: %s", self._server.limits.why(*self._body)
            )
        else:
            log.info(
                "closing a connection that sent no whole request head in %.0fs", self._server.read_timeout_s
            )
        self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close_when_idle(self) -> None:
        """Shutdown: close now if no request is in flight, else after its answer."""
        self._closing = True
        if self.request is None:
            self.transport.close()

    def answered(self) -> asyncio.Future | None:
        """Done once the request in flight is answered (or its client gone); None when none is."""
        if self.request is None:
            return None
        if self._answered is None:
            self._answered = self._loop.create_future()
        return self._answered


class LeanServer:
    """The protocol factory the manager's site listens with: every connection starts on the lean
    path; `aiohttp_server` (aiohttp's `web.Server`) takes the ones handed over."""

    def __init__(self, aiohttp_server: web.Server, app: web.Application, limits: BodyLimits) -> None:
        self.aiohttp_server = aiohttp_server
        self.app = app
        self.manager = app[MANAGER_KEY]
        self.limits = limits
        self.read_timeout_s = limits.read_timeout_s
        self.body_limit = body_limit_of(app)
        self.loop = asyncio.get_running_loop()
        self.connections: set[_LeanConnection] = set()

    def __call__(self) -> _LeanConnection:
        return _LeanConnection(self)

    def pre_shutdown(self) -> None:
        for conn in list(self.connections):
            conn.close_when_idle()
        self.aiohttp_server.pre_shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        """Let the requests in flight finish (within `timeout`), then close every connection."""
        for conn in list(self.connections):
            conn.close_when_idle()
        pending = [f for f in (conn.answered() for conn in self.connections) if f is not None]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for conn in list(self.connections):
            conn.transport.close()
        await self.aiohttp_server.shutdown(timeout)


class LeanRunner(GuardedRunner):
    """`GuardedRunner` whose site listens with a `LeanServer` in front of aiohttp's server."""

    async def _make_server(self) -> LeanServer:  # type: ignore[override]
        return LeanServer(await super()._make_server(), self.app, self.limits)
