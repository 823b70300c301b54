"""Where the manager's engine streams are read: its stream processes, the engines' relays, or the
manager's own process.

The manager process keeps everything that decides: the engine fleet, the batches, the queue and the
router, the journal, the HTTP API. With `processes: N` (N > 1) it sees samples and merged chunks,
not the engines' events: each attempt's stream is opened on the stream process with the fewest open
streams, which reads and parses the engine's events and sends their tokens back every
`stream_flush_ms` (process.py). An engine registered with a `relay` (`rollflow manager
relay` on the engine's own node) has its streams read there instead, so its tokens cross the network
once a flush, merged. With neither, an SGLang engine's streams are read the same way on the
manager's own loop (reading.py), and a vLLM engine's by its client. An attempt reads the chunks as it
would read its engine client's (attempt.py is the same either way).

A stream process that dies is started again; a relay that goes away is dialled again every few
seconds, its engines' streams read here meanwhile. Either way, the attempts it was reading end with
`StreamProcessLost`, and their samples resume from the tokens the manager had (what the engines sent
it in its last two `stream_flush_ms` is generated again).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineError, EngineRejectedError, GenerateChunk, RequestFailedError
from rollflow.runtime.engines.sglang import SGLangClient
from rollflow.runtime.manager.streams import wire
from rollflow.runtime.manager.streams.reading import StreamReading
from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from prometheus_client import Counter

    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.core.registry import EngineRecord

log = logging.getLogger("rollflow.manager")

_LOST = object()  # what a stream's queue gets when its reader went away
RELAY_RETRY_S = (1.0, 5.0)  # a lost relay is dialled again after the first, then every second value

_ERRORS: dict[str, type[Exception]] = {
    wire.REJECTED: EngineRejectedError,
    wire.REQUEST_FAILED: RequestFailedError,
    wire.ENGINE: EngineError,
    wire.INTERNAL: EngineError,
}


class _Channel(asyncio.Protocol):
    """Something that reads streams for the manager (a stream process or a relay, over a
    connection; or the manager's own loop, `_Local`), and the streams open on it; `name` is how logs
    and errors call it, and `pool` the readers it serves."""

    def __init__(self, name: str, pool: StreamReaders, codec: wire.Codec = wire.JSON) -> None:
        self.name = name
        self.pool = pool
        self.streams: dict[str, _ChannelStream] = {}
        self.transport: asyncio.Transport | None = None
        self._codec = codec
        self._frames = wire.FrameReader(codec=codec)
        self._outgoing: list[bytes] = []  # frames sent in this loop turn, written at its end

    @property
    def up(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._frames.feed(data)
        except ValueError as exc:  # not a rollflow stream reader: drop it, its streams resume
            log.error("%s sent something unreadable (%s); closing it", self.name, exc)
            self.transport.close()
            return
        for message in messages:
            self.deliver(message)

    def deliver(self, items: list) -> None:
        """Each item to the stream it is of (one closed meanwhile is dropped)."""
        streams = self.streams
        for item in items:
            stream = streams.get(item[1])
            if stream is not None:
                stream.put(item)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for stream in self.streams.values():
            stream.put(_LOST)
        self.streams.clear()
        self.lost()

    def lost(self) -> None:
        """What to do once the connection is gone."""

    def send(self, message: tuple | list) -> bool:
        """Send `message` at the end of this loop turn, in one write with the others sent in it: the
        requests a turn opens (a batch's, or many clients' at once) cost the reader one wake-up and
        one read, not one per request."""
        if not self.up:
            return False
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._write_outgoing)
        self._outgoing.append(wire.frame(message, self._codec))
        return True

    def _write_outgoing(self) -> None:
        frames, self._outgoing = self._outgoing, []
        if self.up:  # else the streams opened were told of the loss, and resume elsewhere
            self.transport.write(b"".join(frames))

    def open(self, rid: str, engine: EngineRecord, input_ids: list[int], sampling: SamplingParams) -> bool:
        """Have the reader open the engine's stream of `rid`; False when it is gone."""
        fields = wire.sampling_fields(sampling)
        return self.send((wire.OPEN, rid, engine.engine_type, engine.url, engine.api_key, input_ids, fields))

    def close_stream(self, rid: str) -> None:
        self.send((wire.CLOSE, rid))


class _Local(_Channel):
    """The manager's own process, for the SGLang streams no stream process or relay reads: read on
    its loop as a stream process reads them (reading.py), once per `stream_flush_ms` with no task
    per stream, and handed to their attempts merged. Profiled against sglang-router with one
    process, reading each engine write as it came (a task's wake-up per write, and the chunk's trip
    through the engine client's generator) took about half of the manager's CPU per token."""

    def __init__(self, pool: StreamReaders) -> None:
        super().__init__("the manager", pool)
        self.reading = StreamReading(self.deliver, pool.config.stream_flush_ms / 1000.0)

    @property
    def up(self) -> bool:
        return True

    def open(self, rid: str, engine: EngineRecord, input_ids: list[int], sampling: SamplingParams) -> bool:
        self.reading.open(rid, engine.client, input_ids, sampling)
        return True

    def close_stream(self, rid: str) -> None:
        self.reading.close(rid)


class _Process(_Channel):
    """A stream process: an OS process this manager started, on the other end of a socket pair."""

    def __init__(self, index: int, pool: StreamReaders) -> None:
        super().__init__(f"stream process {index}", pool, wire.MARSHAL)
        self.index = index
        self.popen: subprocess.Popen | None = None

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
                "rollflow.runtime.manager.streams.process",
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
        await asyncio.get_running_loop().create_unix_connection(lambda: self, sock=mine)

    def lost(self) -> None:
        self.pool.process_lost(self)


class _Relay(_Channel):
    """A relay on an engine's node (`rollflow manager relay`), reached over TCP at `address`."""

    def __init__(self, address: str, pool: StreamReaders) -> None:
        super().__init__(f"relay {address}", pool)
        self.address = address
        self._dialling: asyncio.Task | None = None

    def dial(self, after_s: float = 0.0) -> None:
        """Connect in the background (again, `after_s` from now after a loss), until it answers or
        the pool closes."""
        if self._dialling is None or self._dialling.done():
            self._dialling = asyncio.get_running_loop().create_task(self._dial(after_s))

    async def _dial(self, after_s: float) -> None:
        await asyncio.sleep(after_s)
        host, _, port = self.address.rpartition(":")
        retry_s = 0.0
        while not self.pool.closing:
            try:
                await within(
                    asyncio.get_running_loop().create_connection(lambda: self, host.strip("[]"), int(port)),
                    self.pool.config.connect_timeout_s,
                )
            except (OSError, TimeoutError) as exc:
                if retry_s == 0.0:
                    log.warning(
                        "%s does not answer (%s): its engines' streams are read here meanwhile",
                        self.name,
                        exc,
                    )
                retry_s = RELAY_RETRY_S[0] if retry_s == 0.0 else RELAY_RETRY_S[1]
                await asyncio.sleep(retry_s)
                continue
            self.send((wire.HELLO, self.pool.config.token))
            log.info("%s connected", self.name)
            return

    def lost(self) -> None:
        if not self.pool.closing:
            log.warning("%s went away: its samples resume; dialling it again", self.name)
            self.dial(after_s=RELAY_RETRY_S[0])  # a relay that refuses this manager is not asked in a loop

    def close(self) -> None:
        if self._dialling is not None:
            self._dialling.cancel()
        if self.transport is not None:
            self.transport.close()


class StreamReaders:
    """The stream processes and relays an attempt's engine stream can be opened on."""

    def __init__(self, config: ManagerConfig, processes: int, restarts: Counter) -> None:
        """`processes` stream processes (none: only relays); `restarts` counts the processes
        started again after one died."""
        self.config = config
        self._count = processes
        self._processes: list[_Process] = []
        self._relays: dict[str, _Relay] = {}
        self.closing = False
        self._restarting: set[asyncio.Task] = set()
        self._restarts = restarts
        self._local = _Local(self)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    async def start(self) -> None:
        for index in range(self._count):
            process = _Process(index, self)
            await process.start()
            self._processes.append(process)
        if self._processes:
            log.info("stream processes: %s", ", ".join(str(pid) for pid in self.pids))

    async def close(self) -> None:
        self.closing = True
        await self._local.reading.aclose()
        for task in self._restarting:
            task.cancel()
        for relay in self._relays.values():
            relay.close()
        for process in self._processes:
            if process.transport is not None:
                process.transport.close()  # the process sees its socket close and exits
        for process in self._processes:
            if process.popen is None:
                continue
            try:
                await within(asyncio.to_thread(process.popen.wait), 5.0)
            except TimeoutError:
                process.popen.kill()
                await asyncio.to_thread(process.popen.wait)

    def readers_up(self) -> tuple[int, int]:
        """Stream processes and relays connected now."""
        return sum(p.up for p in self._processes), sum(r.up for r in self._relays.values())

    def use_relay(self, address: str) -> None:
        """Read the streams of the engines registered with this relay through it (dialled now)."""
        if address not in self._relays:
            self._relays[address] = relay = _Relay(address, self)
            relay.dial()

    def process_lost(self, process: _Process) -> None:
        """A stream process's socket closed: unless the manager is closing, it died; start another."""
        if self.closing:
            return
        code = process.popen.poll() if process.popen is not None else None
        log.warning(
            "stream process %s (pid %s) died (exit %s): its streams resume; starting another",
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
        self, engine: EngineRecord, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk] | None:
        """The engine's stream of `rid`, read by its relay when it has one that is connected, else
        by the stream process with the fewest streams open, else (none configured, or none up while
        one is started again) by this process's own reading for an SGLang engine; None for another
        engine's stream there: the attempt reads it from the engine client itself."""
        relay = self._relays.get(engine.relay) if engine.relay else None
        if relay is not None and relay.up:
            channel: _Channel = relay
        else:
            process = min((p for p in self._processes if p.up), key=lambda p: len(p.streams), default=None)
            if process is not None:
                channel = process
            elif isinstance(engine.client, SGLangClient):
                channel = self._local
            else:
                return None
        return _ChannelStream(channel, rid, channel.open(rid, engine, input_ids, sampling))


class _ChannelStream:
    """One attempt's stream as its channel delivers it: the attempt reads it as it reads an engine
    client's chunks, and it ends with the error the reader reported. It is on every chunk's path:
    an asyncio.Queue read through an async generator cost about 1.5 us more per chunk."""

    __slots__ = ("_channel", "_ended", "_items", "_opened", "_rid", "_waiter")

    def __init__(self, channel: _Channel, rid: str, opened: bool) -> None:
        """`opened`: whether the channel took the stream (False: it went away since it was chosen)."""
        self._channel = channel
        self._rid = rid
        self._opened = opened
        self._ended = not opened
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None
        if opened:
            channel.streams[rid] = self

    def put(self, item: object) -> None:
        """What the channel delivered of this stream (`_LOST` when the channel went away)."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __aiter__(self) -> _ChannelStream:
        return self

    async def __anext__(self) -> GenerateChunk:
        if not self._opened:
            raise wire.StreamProcessLost(
                f"{self._channel.name} went away before {self._rid} was opened on it"
            )
        items = self._items
        while not items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = waiter = asyncio.get_running_loop().create_future()
            await waiter
        item = items.popleft()
        if item is _LOST:
            self._end()
            raise wire.StreamProcessLost(f"{self._channel.name} went away while reading {self._rid}")
        if item[0] == wire.FAILED:
            self._end()
            kind, message = item[2], item[3]
            if kind == wire.ENDED:
                raise StopAsyncIteration
            raise _ERRORS[kind](message)
        chunk = wire.chunk_from(item)
        if chunk.finish_reason is not None:
            self._end()
        return chunk

    def _end(self) -> None:
        self._ended = True
        self._channel.streams.pop(self._rid, None)

    async def aclose(self) -> None:
        """Stop reading: a stream that has not ended is closed on its reader (the engine sees its
        client go away)."""
        if not self._ended:
            self._end()
            self._channel.close_stream(self._rid)
