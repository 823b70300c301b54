"""A real HTTP proxy in front of a weight server that breaks the first chunk transfer through it.

cut:  the first chunk's response announces its full length, sends half, and drops the
      connection (a network that fails mid-transfer); later requests pass untouched.
hold: the first chunk request waits until the test calls `release()` (so the test can kill
      the engine that asked, mid-transfer); then it is answered normally.
`only`: chunk requests whose path lacks this text (another payload, e.g. another tensor-parallel
      rank's `-tp2r0`) pass untouched and are not counted.
hold_mooncake: the first answer to a payload's Mooncake location is fetched, then held until
      `release()` (so the test can kill the server whose memory it names: the engine's Mooncake
      reads then fail mid-transfer); `chunk_requested` is set when it is held.
hold_sharded: the first answer to a sharded version's manifest (GET /v1/sharded/N) is fetched, then
      held until `release()` (so the test can kill a trainer rank whose memory it names);
      `chunk_requested` is set when it is held. PUTs (the trainer's publishes) pass untouched.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import aiohttp
from aiohttp import web


class ChunkProxy:
    def __init__(
        self,
        upstream: str,
        mode: Literal["cut", "hold", "hold_mooncake", "hold_sharded"],
        only: str | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = mode
        self.only = only
        self.num_chunk_requests = 0
        self.num_broken = 0  # chunk responses cut, or held
        self.chunk_requested = threading.Event()  # the first chunk request arrived
        self._released = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _start(self) -> str:
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/{tail:.*}", self._forward)
        app.router.add_put("/{tail:.*}", self._forward_put)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        is_chunk = "/chunks/" in request.path and (self.only is None or self.only in request.path)
        first = is_chunk and self.num_chunk_requests == 0
        self.num_chunk_requests += is_chunk
        if first:
            self.chunk_requested.set()
        if first and self.mode == "hold":
            self.num_broken += 1
            await asyncio.to_thread(self._released.wait)
        async with self._session.get(self.upstream + request.path_qs) as upstream:
            body = await upstream.read()
            status, content_type = upstream.status, upstream.headers.get("Content-Type")
        held = request.path.endswith("/mooncake") if self.mode == "hold_mooncake" else None
        if self.mode == "hold_sharded":
            held = request.path.startswith("/v1/sharded/")
        if held and not self.num_broken:
            self.num_broken += 1
            self.chunk_requested.set()
            await asyncio.to_thread(self._released.wait)
        if not (first and self.mode == "cut"):
            headers = {"Content-Type": content_type} if content_type else {}
            return web.Response(body=body, status=status, headers=headers)
        self.num_broken += 1
        response = web.StreamResponse(status=status)
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        request.transport.close()
        return response

    async def _forward_put(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")}
        async with self._session.put(
            self.upstream + request.path_qs, data=await request.read(), headers=headers
        ) as upstream:
            body = await upstream.read()
            return web.Response(body=body, status=upstream.status, content_type="application/json")
