"""HTTP plumbing both clients share: one session per client (and kept-alive connections for the hot
path), server-sent events, checked JSON."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar, TypedDict

import aiohttp
import orjson

from rollflow.runtime.engines.base import (
    EngineError,
    EngineRejectedError,
    EngineResponseError,
    NotSupportedError,
)
from rollflow.runtime.engines.pool import ConnectionPool

CONNECT_TIMEOUT_S = 10.0


ENGINE_ERRORS = (EngineError, aiohttp.ClientError, OSError, ValueError)
"""What a call to an engine raises when the engine (not the request) is at fault."""


class ClientOptions(TypedDict, total=False):
    """How a client reaches its engine, beside the url: `HttpEngine`'s options, which every client
    takes (`**options: Unpack[ClientOptions]`) and hands to it."""

    session: aiohttp.ClientSession | None
    read_timeout_s: float | None
    api_key: str | None


class HttpEngine:
    """Base of the clients: owns (or borrows) one aiohttp session and reports errors by type."""

    server_name: ClassVar[str] = "an HTTP engine"
    """What the engine is, in the words of the errors it causes ("an SGLang server")."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession | None = None,
        read_timeout_s: float | None = None,
        api_key: str | None = None,
    ) -> None:
        """With `api_key`, every request carries `Authorization: Bearer <api_key>` (SGLang's --api-key)."""
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None
        self.read_timeout_s = read_timeout_s
        self._pool: ConnectionPool | None = None
        # a stream that sends nothing for this long is treated as a dead engine
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    @property
    def pool(self) -> ConnectionPool:
        """Kept-alive connections for the hot path (`/generate`); aiohttp for everything else."""
        if self._pool is None:
            # a borrowed session's connect timeout is the manager's connect_timeout_s
            timeout = self._session.timeout.sock_connect if self._session is not None else None
            self._pool = ConnectionPool(self.url, timeout or CONNECT_TIMEOUT_S, self.read_timeout_s)
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def health(self) -> bool:
        return await self.status("/health") == 200

    async def update_weights_from_server(
        self, url: str, version: int, codec: str | None = None, transport: str | None = None
    ) -> None:
        """Only the built-in engine pulls from a rollflow weight server; others load from a disk."""
        raise NotSupportedError(
            f"{self.url} is {self.server_name}, which cannot pull from a rollflow weight server; "
            "update it with a model_path on a shared disk"
        )

    async def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        return await self._request("GET", path, None, timeout_s)

    async def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        """The body of a GET as text (a Prometheus exposition, say); errors as `get_json`'s."""
        return await self._request("GET", path, None, timeout_s, as_json=False)

    async def post_json(self, path: str, body: Any, timeout_s: float = 60.0) -> Any:
        return await self._request("POST", path, body, timeout_s)

    async def status(self, path: str, timeout_s: float = 5.0) -> int | None:
        """HTTP status of a GET, None when the engine cannot be reached."""
        try:
            async with self.session.get(
                self.url + path, headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def call(
        self, method: str, path: str, body: Any = None, timeout_s: float = 60.0
    ) -> tuple[int, str]:
        """One HTTP call to the engine: its status and body text, whatever the status (the manager
        relays some answers as the engine gave them); an engine that cannot be reached raises
        EngineError."""
        try:
            async with self.session.request(
                method,
                self.url + path,
                json=body,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                return resp.status, await resp.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EngineError(f"{method} {self.url}{path} failed: {failure_text(exc)}") from exc

    async def _request(
        self, method: str, path: str, body: Any, timeout_s: float, as_json: bool = True
    ) -> Any:
        status, text = await self.call(method, path, body, timeout_s)
        if status >= 300:
            raise status_error(method, self.url + path, status, text)
        if not as_json:
            return text
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise EngineResponseError(f"{self.url}{path} answered non-JSON: {text[:200]!r}") from None


def failure_text(exc: BaseException) -> str:
    """Why a request failed, in the user's words ("connection refused"), from its innermost cause:
    the repr of aiohttp's errors is a screen of connection-key fields."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"cannot resolve host {exc.host}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        exc = exc.os_error
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


async def raise_for_status(resp: aiohttp.ClientResponse) -> None:
    """4xx -> EngineRejectedError (the request is at fault), other non-2xx -> EngineResponseError."""
    if resp.status < 300:
        return
    raise status_error(resp.method, str(resp.url), resp.status, await resp.text(errors="replace"))


def status_error(method: str, url: str, status: int, text: str) -> EngineError:
    """The error for a non-2xx answer, with the engine's message (its `error.message` when JSON)."""
    text = text[:500]
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    error = EngineRejectedError if 400 <= status < 500 else EngineResponseError
    return error(f"{method} {url} -> HTTP {status}: {message}")


SSE_DONE = object()
"""What `sse_line_json` returns for `data: [DONE]`."""


def sse_data(raw_line: bytes, url: str) -> bytes | memoryview | object | None:
    """What one SSE line carries: its data (an event's JSON, not yet parsed), None for a blank or
    comment line, SSE_DONE for `data: [DONE]`. The one place a stream's lines are classified."""
    if raw_line.startswith(b"data: {"):  # an event as servers write it: no copy, no strip
        return memoryview(raw_line)[6:]
    line = raw_line.strip()
    if not line or line.startswith(b":"):
        return None
    if not line.startswith(b"data:"):
        raise EngineResponseError(f"{url} streamed a line that is not an SSE data line: {line[:200]!r}")
    data = line[5:].strip()
    return SSE_DONE if data == b"[DONE]" else data


def sse_json(data: bytes | memoryview, url: str) -> dict[str, Any]:
    """The JSON object an event's data holds."""
    try:
        payload = orjson.loads(data)
    except ValueError:
        try:  # NaN and Infinity, which Python's json writes and orjson refuses to read
            payload = json.loads(bytes(data))
        except ValueError:
            raise EngineResponseError(f"{url} streamed non-JSON data: {bytes(data[:200])!r}") from None
    if not isinstance(payload, dict):
        raise EngineResponseError(f"{url} streamed {type(payload).__name__}, not an object")
    return payload


def sse_line_json(raw_line: bytes, url: str) -> Any:
    """The JSON object of one `data: {...}` line; None for a blank or comment line, SSE_DONE at the end."""
    data = sse_data(raw_line, url)
    return data if data is None or data is SSE_DONE else sse_json(data, url)


class SseBlock:
    """Whole SSE lines: `parts` (the start of a line an earlier read began, then the pieces of this
    read before its last) and then `body[:cut]`, the last piece up to its last newline, kept apart:
    a block read only at its ends is never copied whole (its bytes are an engine's whole output,
    again and again, when events repeat it, and a stream read once per flush holds many pieces)."""

    __slots__ = ("body", "cut", "parts")

    def __init__(self, parts: list[bytes], body: bytes, cut: int) -> None:
        self.parts = parts
        self.body = body
        self.cut = cut

    def __bool__(self) -> bool:
        return self.cut > 0 or bool(self.parts)

    def whole(self) -> bytes:
        return b"".join([*self.parts, self.body[: self.cut]]) if self.parts else self.body[: self.cut]

    def joined(self) -> SseBlock:
        whole = self.whole()
        return SseBlock([], whole, len(whole))

    def first_line(self) -> bytes:
        """The block's first line, joined from the parts it spans only (a stream's first read, once
        per flush, can hold tens of engine writes)."""
        line = []
        for part in (*self.parts, self.body[: self.cut]):
            end = part.find(b"\n")
            if end >= 0:
                line.append(part[:end])
                break
            line.append(part)
        return b"".join(line)

    def startswith(self, prefix: bytes) -> bool:
        """Whether the block starts with `prefix`, read from its first parts only."""
        seen = b""
        for part in (*self.parts, self.body):
            seen += part[: len(prefix) - len(seen)]
            if len(seen) == len(prefix):
                break
        return seen == prefix


class SseLines:
    """Splits a body that arrives in arbitrary pieces into blocks of whole SSE lines, read either
    line by line (`lines`) or from its end only (`newest`): a caller that needs only the newest of
    many events then splits, copies and parses none of the others."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._rest = b""
        self.done = False  # `data: [DONE]` was seen

    def feed(self, pieces: list[bytes]) -> SseBlock:
        """The whole lines that one read's `pieces` (the body's bytes in order) complete, with what
        earlier reads left."""
        last = pieces[-1]
        cut = last.rfind(b"\n") + 1
        if cut == 0 and len(pieces) > 1:  # the read's whole lines end in an earlier piece
            last = b"".join(pieces)
            pieces = [last]
            cut = last.rfind(b"\n") + 1
        if cut == 0:
            self._rest += last
            return SseBlock([], b"", 0)
        parts = [self._rest, *pieces[:-1]] if self._rest else pieces[:-1]
        self._rest = last[cut:]
        return SseBlock(parts, last, cut)

    def end(self) -> SseBlock:
        """The body ended: a last line without its newline still counts."""
        rest, self._rest = self._rest, b""
        return SseBlock([], rest + b"\n", len(rest) + 1) if rest else SseBlock([], b"", 0)

    def lines(self, block: SseBlock) -> list[bytes | memoryview]:
        """The data of the block's events, in order, up to `data: [DONE]` (which sets `done`)."""
        events = []
        for raw_line in block.whole().split(b"\n"):
            if self.done:
                break
            data = sse_data(raw_line, self._url)
            if data is SSE_DONE:
                self.done = True
            elif data is not None:
                events.append(data)
        return events

    def newest(self, block: SseBlock) -> tuple[memoryview, bool] | None:
        """The block's last event (its line, not copied) and whether `data: [DONE]` follows it,
        found without splitting or reading the lines before it (a caller that uses it has no need
        to: they are older states of what the last one holds); None when the block's ends are not
        events as servers write them (then `lines` reads it). A block of one event is read so too:
        it is most reads of a stream whose reader keeps up, and `lines` would hand its whole output
        to the JSON parser again for every token."""
        if not block.startswith(b"data: {"):
            return None
        body, end = block.body, block.cut
        done = False
        while True:
            start = body.rfind(b"\n", 0, end - 1) + 1
            if start == 0 and block.parts:  # the line began in an earlier piece
                return self.newest(block.joined())
            stop = end
            while stop > start and body[stop - 1] in b"\r\n":
                stop -= 1
            if body.startswith(b"data: {", start):
                return memoryview(body)[start:stop], done
            if stop - start == len(b"data: [DONE]") and body.startswith(b"data: [DONE]", start) and not done:
                done = True
            elif stop > start:
                return None
            end = start


async def iter_sse_json(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a `data: {...}` event stream, until `data: [DONE]` or the end of the body."""
    url = str(resp.url)
    async for raw_line in resp.content:
        payload = sse_line_json(raw_line, url)
        if payload is SSE_DONE:
            return
        if payload is not None:
            yield payload


def parse_weight_version(value: Any) -> int | None:
    """SGLang reports versions as strings ("default" until set); rollflow's are integers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
