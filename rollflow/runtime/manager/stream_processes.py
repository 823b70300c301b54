"""The manager's stream processes (`processes: N`): N - 1 processes read the engines' token streams.

The manager process keeps everything that decides: the engine fleet, the batches, the queue and the
router, the journal, the HTTP API. It sees samples and merged chunks, not the engines' events: each
attempt's stream is opened on the stream process with the fewest open streams, which reads and
parses the engine's events and sends their tokens back every `stream_flush_ms` (stream_process.py).
An attempt reads the chunks as it would read its engine client's (attempt.py is the same either way).

A stream process that dies is started again; the attempts it was reading end with
`StreamProcessLost`, and their samples resume from the tokens the manager had (what the engines
sent the process in its last two `stream_flush_ms` is generated again).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rollflow.runtime.engines.base import (
    EngineError,
    EngineRejectedError,
    GenerateChunk,
    RequestFailedError,
    SamplingParams,
)
from rollflow.runtime.manager import stream_wire as wire

if TYPE_CHECKING:
    from prometheus_client import Counter

    from rollflow.runtime.manager.config import ManagerConfig

log = logging.getLogger("rollflow.manager")

_LOST = object()  # what a stream's queue gets when its process died

_ERRORS: dict[str, type[Exception]] = {
    wire.REJECTED: EngineRejectedError,
    wire.REQUEST_FAILED: RequestFailedError,
    wire.ENGINE: EngineError,
    wire.INTERNAL: EngineError,
}


class _Process(asyncio.Protocol):
    """One stream process: its OS process, its socket, and the streams open on it."""

    def __init__(self, index: int, pool: StreamProcesses) -> None:
        self.index = index
        self.pool = pool
        self.streams: dict[str, asyncio.Queue] = {}
        self.popen: subprocess.Popen | None = None
        self.transport: asyncio.Transport | None = None
        self._frames = wire.FrameReader()
        self.closed = asyncio.get_running_loop().create_future()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    async def start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = self.pool.config
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rollflow.runtime.manager.stream_process",
                "--fd",
                str(theirs.fileno()),
                "--flush-ms",
                str(config.stream_flush_ms),
                "--connect-timeout-s",
                str(config.connect_timeout_s),
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: self, sock=mine)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        streams = self.streams
        for message in self._frames.feed(data):
            for item in message:
                queue = streams.get(item[1])
                if queue is not None:
                    queue.put_nowait(item)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for queue in self.streams.values():
            queue.put_nowait(_LOST)
        self.streams.clear()
        if not self.closed.done():
            self.closed.set_result(None)
        self.pool.process_lost(self)

    def send(self, message: tuple) -> bool:
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(wire.frame(message))
        return True


class StreamProcesses:
    """The pool of stream processes an attempt's engine stream is opened on."""

    def __init__(self, config: ManagerConfig, count: int, restarts: Counter) -> None:
        """`restarts` counts the processes started again after one died."""
        self.config = config
        self._count = count
        self._processes: list[_Process] = []
        self._closing = False
        self._restarting: set[asyncio.Task] = set()
        self._restarts = restarts

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    async def start(self) -> None:
        for index in range(self._count):
            process = _Process(index, self)
            await process.start()
            self._processes.append(process)
        log.info("stream processes: %s", ", ".join(str(pid) for pid in self.pids))

    async def close(self) -> None:
        self._closing = True
        for task in self._restarting:
            task.cancel()
        for process in self._processes:
            if process.transport is not None:
                process.transport.close()  # the process sees its socket close and exits
        for process in self._processes:
            if process.popen is None:
                continue
            try:
                await asyncio.wait_for(asyncio.to_thread(process.popen.wait), 5.0)
            except TimeoutError:
                process.popen.kill()
                await asyncio.to_thread(process.popen.wait)

    def process_lost(self, process: _Process) -> None:
        """A stream process's socket closed: unless the manager is closing, it died; start another."""
        if self._closing:
            return
        code = process.popen.poll() if process.popen is not None else None
        log.warning(
            "stream process %s (pid %s) died (exit %s): its streams resume elsewhere; starting another",
            process.index,
            process.pid,
            code,
        )
        task = asyncio.get_running_loop().create_task(self._restart(process))
        self._restarting.add(task)
        task.add_done_callback(self._restarting.discard)

    async def _restart(self, process: _Process) -> None:
        if process.popen is not None:
            await asyncio.to_thread(process.popen.wait)  # reap it
        fresh = _Process(process.index, self)
        await fresh.start()
        self._processes[process.index] = fresh
        self._restarts.inc()

    def open(
        self,
        engine_type: str,
        url: str,
        api_key: str | None,
        rid: str,
        input_ids: list[int],
        sampling: SamplingParams,
    ) -> AsyncIterator[GenerateChunk]:
        """The engine's stream of `rid`, read by the stream process with the fewest streams open."""
        process = min(
            (p for p in self._processes if p.transport is not None),
            key=lambda p: len(p.streams),
            default=None,
        )
        return self._stream(process, engine_type, url, api_key, rid, input_ids, sampling)

    async def _stream(
        self,
        process: _Process | None,
        engine_type: str,
        url: str,
        api_key: str | None,
        rid: str,
        input_ids: list[int],
        sampling: SamplingParams,
    ) -> AsyncIterator[GenerateChunk]:
        queue: asyncio.Queue = asyncio.Queue()
        opened = process is not None and process.send(
            (wire.OPEN, rid, engine_type, url, api_key, input_ids, wire.sampling_fields(sampling))
        )
        if not opened:
            raise wire.StreamProcessLost("no stream process is running (one is being started again)")
        process.streams[rid] = queue
        ended = False
        try:
            while True:
                item = await queue.get()
                if item is _LOST:
                    ended = True
                    raise wire.StreamProcessLost(f"stream process {process.index} died while reading {rid}")
                if item[0] == wire.FAILED:
                    ended = True
                    kind, message = item[2], item[3]
                    if kind == wire.ENDED:
                        return
                    raise _ERRORS[kind](message)
                chunk = wire.chunk_from(item)
                if chunk.finish_reason is not None:
                    ended = True
                    yield chunk
                    return
                yield chunk
        finally:
            process.streams.pop(rid, None)
            if not ended:
                process.send((wire.CLOSE, rid))
