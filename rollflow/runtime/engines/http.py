"""HTTP plumbing both clients share: one session per client, server-sent events, checked JSON."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from rollflow.runtime.engines.base import EngineError, EngineRejectedError, EngineResponseError


class HttpEngine:
    """Base of the clients: owns (or borrows) one aiohttp session and reports errors by type."""

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
        # a stream that sends nothing for this long is treated as a dead engine
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=read_timeout_s)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

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

    async def _request(
        self, method: str, path: str, body: Any, timeout_s: float, as_json: bool = True
    ) -> Any:
        try:
            async with self.session.request(
                method,
                self.url + path,
                json=body,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                await raise_for_status(resp)
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise EngineError(f"{method} {self.url}{path} failed: {exc!r}") from exc
        if not as_json:
            return text
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise EngineResponseError(f"{self.url}{path} answered non-JSON: {text[:200]!r}") from None


async def raise_for_status(resp: aiohttp.ClientResponse) -> None:
    """4xx -> EngineRejectedError (the request is at fault), other non-2xx -> EngineResponseError."""
    if resp.status < 300:
        return
    text = (await resp.text(errors="replace"))[:500]
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    error = EngineRejectedError if 400 <= resp.status < 500 else EngineResponseError
    raise error(f"{resp.method} {resp.url} -> HTTP {resp.status}: {message}")


async def iter_sse_json(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a `data: {...}` event stream, until `data: [DONE]` or the end of the body."""
    async for raw_line in resp.content:
        line = raw_line.strip()
        if not line or line.startswith(b":"):
            continue
        if not line.startswith(b"data:"):
            raise EngineResponseError(
                f"{resp.url} streamed a line that is not an SSE data line: {line[:200]!r}"
            )
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            raise EngineResponseError(f"{resp.url} streamed non-JSON data: {data[:200]!r}") from None
        if not isinstance(payload, dict):
            raise EngineResponseError(f"{resp.url} streamed {type(payload).__name__}, not an object")
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
