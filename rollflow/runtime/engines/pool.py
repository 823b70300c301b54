"""A lean HTTP/1.1 client for the manager's hot path: kept-alive connections to one engine.

Why not aiohttp's ClientSession here: profiled against an engine that answers at once, it cost the
manager about 220 us of its 525 us per `/generate` (building a request object, a URL, a timer
and a response object, a stream reader and several tasks and futures per call). A router's
request needs far less: write the request in one write, parse the status line, the three headers
that frame the body (Content-Length, Transfer-Encoding, Connection), and hand the body's bytes to
the caller as they come. One asyncio protocol per connection does that; a future is made only when
the caller must wait for bytes.

A connection goes back to the pool once its response was read to the end. A caller that stops
reading early either closes the connection (the engine sees the disconnect and aborts the request,
as it would with aiohttp), or, once it has all it needs, lets the connection read the rest of the
body in the background and rejoin the pool then (`Response.release`).
"""

from __future__ import annotations

import asyncio
import functools
import ssl as ssl_module
from collections.abc import Callable
from urllib.parse import urlsplit

from rollflow.runtime.engines.chunked import whole_chunks
from rollflow.runtime.http.head import header_value, split_content_length

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE = 256  # idle connections kept per engine; more are closed
PAUSE_AT = 1 << 20  # unread body bytes at which the connection stops reading the socket
# bytes of a listened response after which it is paused while its bytes wait for their taker: a
# short answer (the whole of it in one or two reads) is not held back a flush for it
LISTENED_PAUSE_AFTER = 16 * 1024
DRAIN_S = 5.0  # a released response whose end has not come by then is closed instead
READ_BYTES = 256 * 1024  # the most one read of a socket takes (as uvloop's own reads)

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ProtocolError(ValueError):
    """The engine's bytes are not an HTTP/1.1 response."""


class Response:
    """One response: its status, and its body read as it arrives."""

    __slots__ = ("_conn", "status")

    def __init__(self, conn: _Connection, status: int) -> None:
        self._conn: _Connection | None = conn
        self.status = status

    async def read_pieces(self) -> list[bytes]:
        """The body bytes that came since the last call, in the pieces they were read in (a caller
        that needs only the newest bytes of a long stream copies none of the others); [] once the
        body is complete (the connection is back in the pool then)."""
        if self._conn is None:
            return []
        pieces = await self._conn.read_pieces()
        if not pieces:
            self.release()
        return pieces

    def take_pieces(self) -> list[bytes] | None:
        """`read_pieces` without waiting: None when no bytes came since the last call and the body
        has not ended. Raises what the read would (the connection's error, its read timeout)."""
        if self._conn is None:
            return []
        pieces = self._conn.take_pieces()
        if pieces == []:
            self.release()
        return pieces

    def on_bytes(self, listener: Callable[[], None]) -> None:
        """Call `listener` (with no arguments) whenever bytes, the body's end or an error come and
        no `read_pieces` waits for them, from the protocol's callback; it then `take_pieces`, in
        that callback or later, until that gives None (nothing more yet) or [] (the end: the last
        bytes and the end may come in one read, and the listener is told once). A reader of many
        streams that collects each one's bytes once in a while reads them this way with no task per
        stream: a task's wake-up per read was much of a stream's CPU. The read timeout holds as it
        does for `read_pieces`: no bytes for `read_timeout_s` is an error the listener is told of."""
        if self._conn is not None:
            self._conn.listen(listener)

    async def read_chunk(self) -> bytes:
        """The body bytes that came since the last call, joined; b"" once the body is complete."""
        pieces = await self.read_pieces()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def read(self) -> bytes:
        parts = []
        while data := await self.read_chunk():
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """The caller has what it needs: the rest of the body is read and dropped, and the
        connection rejoins the pool at its end (or closes, if the end does not come)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release()

    def close(self) -> None:
        """Drop the connection: the engine sees its client go away."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection; parses the response to the request it carries.

    The socket is read into the pool's one read buffer (`get_buffer`), not into a new bytes object
    per read: a long streamed answer comes in reads of up to hundreds of KiB, and allocating (and
    page-faulting) each was a share of the manager's CPU per token. Nothing keeps a view of the
    buffer past `buffer_updated`: what is kept is copied out of it."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._body: list[bytes] = []
        self._unread = 0
        self._paused = False
        self._waiter: asyncio.Future | None = None
        self._deadline = 0.0  # when a wait for bytes times out (`_wait`)
        self._timer: asyncio.TimerHandle | None = None  # the one that looks at the deadline
        self._error: BaseException | None = None
        self.lost = False
        self._reset()

    def _reset(self) -> None:
        self._state = _HEAD
        self._head: int | None = None  # the status, once the head is in
        self._remaining = 0
        self._keep_alive = True
        self._draining = False
        self.in_use = False  # a request is on the connection (idle ones take no bytes)
        self.received = 0  # bytes of the current response so far
        self._listener: Callable[[], None] | None = None  # `Response.on_bytes`

    # ------------------------------------------------------------ the protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._pool.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._pool.read_buffer[:nbytes])

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        elif self._state != _DONE and self._error is None:
            self._error = exc or ConnectionResetError("the engine closed the connection")
        self._pool.forget(self)
        self._wake()

    def data_received(self, data: bytes | memoryview) -> None:
        if not self.in_use:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        waiting = bool(self._body)
        self.received += len(data)
        try:
            data = self._end_of_chunk(data)
            if self._state == _CHUNK_SIZE and not self._buf:
                # a read that starts on a chunk's start: its whole chunks are taken from it as it
                # is, and only what follows them is kept (each byte of a long answer is copied once
                # here rather than twice)
                taken = whole_chunks(data)
                if taken is not None:
                    body, consumed = taken
                    self._keep(body)
                    data = data[consumed:]
            self._buf += data
            self._parse()
        except (ProtocolError, ValueError) as exc:
            self._error = ProtocolError(f"bad HTTP response from the engine: {exc}")
            self.transport.close()
        if self._draining:
            if self._state == _DONE:
                self._body.clear()
                self._rejoin()
            return
        if not self._paused and (
            self._unread >= PAUSE_AT
            or (self._listener is not None and waiting and self.received > LISTENED_PAUSE_AFTER)
        ):
            # a long listened stream whose bytes wait for their taker already: what the engine
            # sends until it takes them stays in the socket, and comes in one read then rather than
            # one per engine write, each a wake-up of the loop and a pass through this callback
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _end_of_chunk(self, data: bytes | memoryview) -> bytes | memoryview:
        """The rest of a chunk an earlier read cut off (its data, then its CRLF) taken from the start
        of `data` as it is, so that the whole chunks after it are too; what is left of `data`. Any
        other case is the state machine's (`_parse`), bytes errors included."""
        end = self._remaining
        if self._state != _CHUNK_DATA or self._buf or len(data) < end + 2 or data[end : end + 2] != b"\r\n":
            return data
        self._keep(bytes(data[:end]))
        self._remaining = 0
        self._state = _CHUNK_SIZE
        return data[end + 2 :]

    def eof_received(self) -> bool:
        return False  # close the transport: an engine that half-closes sends nothing more

    def _parse(self) -> None:
        buf = self._buf
        while buf:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ProtocolError("response head too long")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._start_body(head)
            elif state in (_LENGTH, _CHUNK_DATA):
                take = bytes(buf[: self._remaining])
                del buf[: len(take)]
                self._remaining -= len(take)
                self._keep(take)
                if self._remaining == 0:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
            elif state == _CHUNK_SIZE and self._whole_chunks(buf):
                continue
            elif state in (_CHUNK_SIZE, _TRAILERS):
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[: end + 2]
                if state == _TRAILERS:
                    if not line:
                        self._state = _DONE
                    continue
                size = int(line.split(b";", 1)[0], 16)
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILERS
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    return
                if buf[:2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                del buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                self._keep(bytes(buf))
                buf.clear()
            else:  # bytes past the end of the response: the connection cannot be trusted again
                self._keep_alive = False
                buf.clear()

    def _whole_chunks(self, buf: bytearray) -> bool:
        """Take the whole data chunks at the front of `buf` in one pass, as one piece of body
        (chunked.py says why); whether there was one."""
        taken = whole_chunks(buf)
        if taken is None:
            return False
        body, consumed = taken
        del buf[:consumed]
        self._keep(body)
        return True

    def _start_body(self, head: bytes) -> None:
        end = head.find(b"\r\n")
        status_line = head if end < 0 else head[:end]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
            raise ProtocolError(f"status line {status_line[:100]!r}")
        status = int(status_line[9:12])
        if 100 <= status < 200:
            return  # an interim response: the real one follows
        fields = b"" if end < 0 else head[end:].lower()  # each field line starts with CRLF
        raw_length, others = split_content_length(fields)
        length = None if raw_length is None else int(raw_length)
        self._keep_alive, chunked = _framing(others, status_line[5:8] == b"1.1")
        self._head = status
        if status in (204, 304):
            self._state = _DONE
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH if length else _DONE
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False

    def _keep(self, data: bytes) -> None:
        if data and not self._draining:
            self._body.append(data)
            self._unread += len(data)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif self._listener is not None:
            if self._pool.read_timeout_s is not None:
                self._deadline = self._loop.time() + self._pool.read_timeout_s
            self._listener()

    # ------------------------------------------------------------ the caller's side

    async def _wait(self, timeout_s: float | None) -> None:
        """Wait for the next bytes, at most `timeout_s`. A long stream waits once per read: rather
        than a timer made and cancelled per wait, the wait moves the connection's deadline and one
        timer, armed when none is, looks at it when it fires (and sets itself again for a deadline
        that moved meanwhile)."""
        waiter = self._waiter = self._loop.create_future()
        if timeout_s is not None:
            self._deadline = self._loop.time() + timeout_s
            if self._timer is None:
                self._timer = self._loop.call_at(self._deadline, self._time_out)
        await waiter

    def listen(self, listener: Callable[[], None]) -> None:
        """`Response.on_bytes`: `listener` is told of what comes from now on (and at once, of what
        came already)."""
        self._listener = listener
        timeout_s = self._pool.read_timeout_s
        if timeout_s is not None:
            self._deadline = self._loop.time() + timeout_s
            if self._timer is None:
                self._timer = self._loop.call_at(self._deadline, self._time_out)
        if self._body or self._error is not None or self._state == _DONE or self.lost:
            listener()

    def _time_out(self) -> None:
        self._timer = None
        waiter = self._waiter
        listening = waiter is None and self._listener is not None and self._state != _DONE
        if not listening and (waiter is None or waiter.done()):
            return  # nobody waits: the next wait arms the timer again
        if self._loop.time() < self._deadline:
            self._timer = self._loop.call_at(self._deadline, self._time_out)
            return
        error = TimeoutError(f"no bytes from the engine for {self._pool.read_timeout_s}s")
        if listening:
            self._error = error
            self._listener()
        else:
            waiter.set_exception(error)

    async def head(self) -> Response:
        while self._head is None:
            if self._error is not None:
                raise self._error
            if self.lost:
                raise ConnectionResetError("the engine closed the connection before answering")
            await self._wait(self._pool.read_timeout_s)
        return Response(self, self._head)

    async def read_pieces(self) -> list[bytes]:
        while (pieces := self.take_pieces()) is None:
            await self._wait(self._pool.read_timeout_s)
        return pieces

    def take_pieces(self) -> list[bytes] | None:
        if self._body:
            pieces, self._body = self._body, []
            self._unread = 0
            if self._paused and not self.lost:
                self._paused = False
                self.transport.resume_reading()
            return pieces
        if self._error is not None:
            raise self._error
        if self._state == _DONE:
            return []
        return None

    def release(self) -> None:
        self._listener = None
        if self._error is not None or self.lost or not self._keep_alive:
            self.close()
        elif self._state == _DONE:
            self._rejoin()
        elif not self._draining:
            self._draining = True
            self._body.clear()
            self._unread = 0
            if self._paused:
                self._paused = False
                self.transport.resume_reading()
            self._loop.call_later(DRAIN_S, self._drain_overdue)

    def _drain_overdue(self) -> None:
        if self._draining:
            self.close()

    def _rejoin(self) -> None:
        if self._buf or not self._keep_alive:
            self.close()
            return
        # what its caller left unread (the end of a body that came before the release) is not the
        # next response's
        self._body.clear()
        self._unread = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self._reset()
        self._pool.put(self)

    def close(self) -> None:
        self._draining = False
        self._listener = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._pool.forget(self)


@functools.lru_cache(maxsize=256)
def _framing(fields: bytes, http11: bool) -> tuple[bool, bool]:
    """Whether the connection stays open and whether the body is chunked, for a response head's
    lower-cased fields but its Content-Length. An engine answers with the same few heads (but for
    the length, and a date once a second), so each is read once rather than per response."""
    connection = header_value(fields, b"connection")
    keep_alive = connection != b"close" and (http11 or connection == b"keep-alive")
    return keep_alive, b"chunked" in (header_value(fields, b"transfer-encoding") or b"")


class ConnectionPool:
    """Kept-alive HTTP/1.1 connections to the server at one `http://` or `https://` url."""

    def __init__(
        self, url: str, connect_timeout_s: float = 10.0, read_timeout_s: float | None = None
    ) -> None:
        """`read_timeout_s`: the longest wait for the next bytes of a response (None: no limit)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) url: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl_module.create_default_context() if parts.scheme == "https" else None
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = f"{host}:{self._port}".encode("latin-1")
        self._prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: list[_Connection] = []
        self._closed = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set on first use
        # what every connection's socket is read into, one read at a time (the loop is one thread)
        self.read_buffer = memoryview(bytearray(READ_BYTES))

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Response:
        """Send a request and return once its status and headers are in. A kept-alive connection
        the engine closed while idle (its close still in flight) is retried once on a new one:
        nothing of the request was answered, so the engine never ran it."""
        head = self._head(method, path, body, headers)
        loop = asyncio.get_running_loop()
        if loop is not self.loop:  # connections of another (finished) event loop cannot serve this one
            self.loop, self._idle = loop, []
        while self._idle:
            conn = self._idle.pop()
            if conn.lost or conn.transport.is_closing():
                continue
            conn.in_use = True
            try:
                return await self._send(conn, head, body)
            except (ConnectionError, ProtocolError):
                if conn.received:
                    raise
                break  # closed by the engine while idle: try a fresh connection
        conn = await self._connect()
        conn.in_use = True
        return await self._send(conn, head, body)

    async def _send(self, conn: _Connection, head: bytes, body: bytes) -> Response:
        if len(body) < 65536:
            conn.transport.write(head + body)
        else:  # no copy of a big body
            conn.transport.write(head)
            conn.transport.write(body)
        try:
            return await conn.head()
        except BaseException:
            conn.close()  # cancelled or failed before the answer: the engine sees its client go
            raise

    def _head(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        lines = [
            f"{method} {self._prefix}{path} HTTP/1.1".encode("latin-1"),
            b"Host: " + self._host_header,
            b"Content-Length: " + str(len(body)).encode(),
        ]
        if body:
            lines.append(b"Content-Type: application/json")
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}".encode("latin-1"))
        lines.append(b"\r\n")
        return b"\r\n".join(lines)

    async def _connect(self) -> _Connection:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns a result that came in the
        # turn its caller was cancelled, and a moved attempt would wait on its engine after all
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self),
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl is not None else None,
            )
        return conn

    def put(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.close()
        elif conn not in self._idle:
            self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        """Close the idle connections; ones in use close when their caller is done."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
