"""Small readers of the manager's API shared by the manager tests."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from rollflow.runtime.launch.servers import metric, wait_until, workers  # noqa: F401 - the tests take them from here
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.batches import Batch
from rollflow.runtime.manager.core.service import RolloutManager
from tests.runtime.processes import (
    Process,
    descendants,
    free_port,
    http,
    start_manager,
)

_SEEN = contextvars.ContextVar("seen")

T = TypeVar("T")


def journaled_config(
    engine_urls: list[str], folder: Path, max_unflushed_tokens: int = 100_000, **config: Any
) -> dict:
    """A manager config over built-in engines, journaling to `folder/manager.journal`, whose journal
    commits nothing on its own for a minute: only `max_unflushed_tokens` unflushed tokens, and what
    the test makes it commit (a stream line, a caller's answer, the close at SIGTERM), write to disk;
    plus `config`'s other keys."""
    return {
        "engines": [{"url": url, "engine_type": "builtin"} for url in engine_urls],
        "journal": str(folder / "manager.journal"),
        "journal_flush_interval_ms": 60_000,
        "journal_max_unflushed_tokens": max_unflushed_tokens,
        **config,
    }


def manager_on_journal(tmp_path: Path, config: dict, port: int, wait: bool = True) -> Process:
    """The manager as a user (re)starts it on its journal: its config file, the journal given on the
    command line; on `port`, so that its clients find it again after a restart."""
    life = len(list(tmp_path.glob("manager-*.log")))  # each start its own log, a restart's included
    served = {k: v for k, v in config.items() if k != "journal"}
    extra_args = ("--journal", config["journal"])
    return start_manager(
        tmp_path, served, port=port, name=f"manager-{life}", wait=wait, extra_args=extra_args
    )


def stream_processes(manager) -> list[int]:
    """The manager's stream processes (its only children)."""
    return sorted(descendants(manager.proc.pid) - {manager.proc.pid})


def prompts(count: int) -> list[list[int]]:
    """`count` distinct four-token prompts, all within the tiny model's vocabulary: a batch of
    different samples whose greedy outputs `greedy_reference` can check one by one."""
    return [[5 + i, 40 + 3 * i, 7, 90 + i] for i in range(count)]


def wait_streaming(manager, engine, min_tokens: int = 8) -> None:
    """Wait until `engine` runs samples for `manager` and has streamed `min_tokens`: the moment a test
    kills or releases it mid-stream, so that its samples must finish elsewhere from their tokens."""
    wait_until(
        lambda: (
            (w := workers(manager).get(engine.url))
            and w["running"] > 0
            and w["tokens_generated"] >= min_tokens
        ),
        what=f"{engine.url} to stream tokens",
    )


def greedy_reference(engine, prompt: list[int], max_new_tokens: int) -> list[int]:
    """What one engine generates for `prompt` uninterrupted, at temperature 0."""
    status, body = http(
        "POST",
        engine.url + "/generate",
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        },
    )
    assert status == 200, body
    return body["output_ids"]


def assert_spans_tile_the_output(sample: dict) -> None:
    """Spans cover [0, len(output)) in order with no gap and no overlap."""
    position = 0
    for span in sample["spans"]:
        assert span["start"] == position, sample["spans"]
        assert span["end"] > span["start"]
        position = span["end"]
    assert position == len(sample["output_ids"]) == len(sample["output_logprobs"])


def assert_finished_as_undisturbed(samples: list[dict], engine, max_new_tokens: int) -> None:
    """Every sample finished with what `engine` generates for its prompt uninterrupted, its spans
    tiling the output: whatever happened on the way (kills, moves, restarts) lost and repeated nothing."""
    for sample in samples:
        assert sample["state"] == "finished", sample
        assert sample["output_ids"] == greedy_reference(engine, sample["prompt_ids"], max_new_tokens)
        assert_spans_tile_the_output(sample)


def run_manager(
    scenario: Callable[[RolloutManager], Awaitable[T]], config: ManagerConfig | None = None, **options: Any
) -> T:
    """`scenario(manager)` on a RolloutManager in this process (`config`, and its constructor's
    `options` such as a router), started before and closed after."""

    async def main() -> T:
        manager = RolloutManager(config or ManagerConfig(), **options)
        await manager.start()
        try:
            return await scenario(manager)
        finally:
            await manager.close()

    return asyncio.run(main())


async def finished(batch: Batch) -> None:
    """Returns once every sample of an in-process manager's `batch` has ended."""
    while not batch.done:
        await batch.changed()


def drain(batch, timeout_s: float = 240.0) -> list[dict]:
    """Every sample of a batch, failing (not hanging) if nothing finishes for `timeout_s`."""
    samples = []
    for micro_batch in batch.micro_batches(timeout_s=timeout_s):
        if not micro_batch:
            raise AssertionError(f"no group finished in {timeout_s}s; batch status: {batch.status()}")
        samples.extend(sample for group in micro_batch for sample in group)
    return samples


class EngineProxy:
    """A real HTTP server, on a thread of its own, in front of a real engine: it relays every route,
    and subclasses change what `/generate` streams (`forward_line`) or answer it themselves
    (`handle`), to show failures a real engine cannot be made to show on demand."""

    def __init__(self, backend_url: str) -> None:
        self.backend_url = backend_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        started.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, await request.read())

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Relay the request; a `/generate` stream goes through `forward_line` line by line."""
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, self.backend_url + request.path, data=body) as upstream,
        ):
            if request.path != "/generate":
                return web.Response(
                    body=await upstream.read(), status=upstream.status, content_type="application/json"
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            index = 0
            async for line in upstream.content:
                if not await self.forward_line(response, line, index):
                    break
                index += 1
            return response

    async def forward_line(self, response: web.StreamResponse, line: bytes, index: int) -> bool:
        """Write one line of the engine's stream; False ends the stream here."""
        await response.write(line)
        return True

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


class CountingProxy(EngineProxy):
    """Relays an engine, counts the tokens it streamed to the manager (all of them, kept or lost),
    notes the request ids the manager aborted, and holds its streams while `flowing` is clear."""

    def __init__(self, backend_url: str) -> None:
        super().__init__(backend_url)
        self.relayed = 0
        self.aborted: list[str] = []
        self.flowing = threading.Event()
        self.flowing.set()

    async def handle(self, request, body):
        if request.path == "/abort_request":
            self.aborted.append(json.loads(body)["rid"])
        _SEEN.set([0])  # this request's own count (each request runs in a task of its own)
        return await super().handle(request, body)

    async def forward_line(self, response, line: bytes, index: int) -> bool:
        if line.startswith(b"data: {"):
            seen = _SEEN.get()
            total = json.loads(line[len(b"data: ") :])["meta_info"]["completion_tokens"]
            self.relayed += total - seen[0]
            seen[0] = total
        while not self.flowing.is_set():
            await asyncio.sleep(0.005)
        await response.write(line)
        return True


def settled(read, interval_s: float = 0.2) -> float:
    """A reading once it stopped changing."""
    last = read()
    while True:
        threading.Event().wait(interval_s)
        value = read()
        if value == last:
            return value
        last = value
