"""Engine streams read once per flush, their tokens merged: the manager's per-token work.

An attempt's engine stream is read here, in the manager's own process (`processes: 1`), in a
stream process (`processes: N`, process.py) or in a relay on the engine's node (relay.py). What the
engine sent is read, parsed and reduced into tokens and log-probs once every `flush_s`, and what
arrived goes to `send` merged: one chunk per request (its tokens since the last flush), the items
of every request that had news in one call. Whoever reads the items then pays per flush and chunk,
not per event.

Each stream is read once per flush: its connection keeps what the engine sent meanwhile, and the
flush parses it in one go (only the newest of a read's cumulative events, engines.sglang says why).
An SGLang stream (SGLang, the built-in engine) is read so with no task of its own: its connection
tells the reading that bytes came, and the flush takes them; a task's wake-up per stream and flush
was a large share of the CPU per token. Other engines' streams are read by a task that waits for
the next flush between reads. Either way a token is sent on at most two `flush_s` after the engine
sent it. A process that does nothing but read streams (a stream process, a relay with one manager)
sleeps between flushes rather than wake for each engine write (doze.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from rollflow.runtime.engines.base import EngineClient, EngineRejectedError, GenerateChunk, RequestFailedError
from rollflow.runtime.engines.http import ENGINE_ERRORS
from rollflow.runtime.engines.sglang import GenerateStream, SGLangClient
from rollflow.runtime.manager.streams import wire
from rollflow.runtime.wire.base import SamplingParams

log = logging.getLogger("rollflow.manager.streams")


class _Pending:
    """A request's chunks since its last message, merged."""

    __slots__ = (
        "cached_tokens",
        "finish_reason",
        "logprobs",
        "message",
        "status_code",
        "text",
        "token_ids",
        "weight_version",
    )

    def __init__(self, chunk: GenerateChunk) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.weight_version = chunk.weight_version
        self.text: str | None = None
        self.cached_tokens: int | None = None
        self.merge(chunk)

    def merge(self, chunk: GenerateChunk) -> None:
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.finish_reason = chunk.finish_reason
        self.message = chunk.message
        self.status_code = chunk.status_code
        if chunk.text is not None:
            self.text = chunk.text
        if chunk.cached_tokens is not None:
            self.cached_tokens = chunk.cached_tokens

    def item(self, rid: str) -> tuple:
        return (
            wire.CHUNK,
            rid,
            self.token_ids,
            self.logprobs,
            self.finish_reason,
            self.weight_version,
            self.message,
            self.status_code,
            self.text,
            self.cached_tokens,
        )


class StreamReading:
    """The streams opened on one reader (a stream process's manager, a relay's, or the manager's
    own), each read once per flush; `send` gets every flush's items (`wire.CHUNK`, `wire.FAILED`)."""

    def __init__(
        self, send: Callable[[list[tuple]], None], flush_s: float, doze: Callable[[float], bool] | None = None
    ) -> None:
        """`doze`: the process's wait between flushes when it does nothing but read streams
        (doze.py); without one, the loop waits, woken by every engine write."""
        self._send = send
        self._flush_s = flush_s
        self._doze = doze
        self._streams: dict[str, asyncio.Task] = {}  # streams opening, or read by a task
        self._reading: dict[str, GenerateStream] = {}  # streams read in the flush, no task
        self._ready: set[str] = set()  # those of `_reading` with something to take
        self._pending: dict[str, _Pending] = {}
        self._outbox: list[tuple] = []  # items ready to go, in order, ahead of `_pending`'s
        self._flush_handle: asyncio.Handle | None = None
        self._flushed: asyncio.Future | None = None  # resolved by the next flush

    def open(self, rid: str, client: EngineClient, input_ids: list[int], sampling: SamplingParams) -> None:
        """Start reading `rid`'s stream from the engine `client` calls."""
        read = self._open if isinstance(client, SGLangClient) else self._read
        self._streams[rid] = asyncio.get_running_loop().create_task(read(client, rid, input_ids, sampling))

    def close(self, rid: str) -> None:
        """Read no more of `rid` (the engine sees its client go away); nothing more is sent of it."""
        stream = self._reading.pop(rid, None)
        if stream is not None:
            stream.close()
            self._pending.pop(rid, None)
        task = self._streams.pop(rid, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        """Read no more of any stream (the reader is gone)."""
        for stream in self._reading.values():
            stream.close()
        self._reading.clear()
        tasks = list(self._streams.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    async def _open(
        self, client: SGLangClient, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> None:
        """Open an SGLang stream and hand it to the flush, which reads it from then on."""
        try:
            stream = await client.open_stream(rid, input_ids, sampling)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(rid, *_failure(rid, exc))
            return
        finally:
            self._streams.pop(rid, None)
        self._reading[rid] = stream
        stream.on_bytes(functools.partial(self._bytes_came, rid))

    def _bytes_came(self, rid: str) -> None:
        self._ready.add(rid)
        self._schedule()

    def _take(self, rid: str, stream: GenerateStream) -> None:
        """What came on a stream since the last flush, parsed into its pending chunk."""
        try:
            while not stream.over:
                pieces = stream.take_pieces()
                if pieces is None:
                    return
                for chunk in stream.chunks(pieces):
                    self._add(rid, chunk)
            del self._reading[rid]
            stream.close()
            stream.check_finished()
        except Exception as exc:
            self._reading.pop(rid, None)
            stream.close()
            self._fail(rid, *_failure(rid, exc))

    async def _read(
        self, client: EngineClient, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> None:
        """Read another engine's stream with a task, once per flush."""
        stream = client.generate(rid, input_ids, sampling)
        try:
            async for chunk in stream:
                self._add(rid, chunk)
                if chunk.finish_reason is not None:
                    return
                await self._next_flush()  # what the engine sends meanwhile is read in one go
            self._fail(rid, wire.ENDED, "the engine closed the stream without a finish_reason")
        except asyncio.CancelledError:
            self._pending.pop(rid, None)  # the manager closed it: it reads no more of it
            raise
        except Exception as exc:
            self._fail(rid, *_failure(rid, exc))
        finally:
            self._streams.pop(rid, None)
            await stream.aclose()

    def _add(self, rid: str, chunk: GenerateChunk) -> None:
        pending = self._pending.get(rid)
        if pending is None:
            self._pending[rid] = _Pending(chunk)
        elif pending.weight_version != chunk.weight_version:
            # tokens keep the version that made them: a new version starts a new chunk
            self._outbox.append(self._pending.pop(rid).item(rid))
            self._pending[rid] = _Pending(chunk)
        else:
            pending.merge(chunk)
        self._schedule()

    def _fail(self, rid: str, kind: str, message: str) -> None:
        pending = self._pending.pop(rid, None)
        if pending is not None:
            self._outbox.append(pending.item(rid))
        self._outbox.append((wire.FAILED, rid, kind, message))
        self._schedule()

    def _next_flush(self) -> asyncio.Future:
        """Resolved at the next flush. A stream read again only then finds every event the engine
        sent meanwhile in one read: the events' parsing, the task's wake-up and the chunk's merge
        are paid once per stream and flush rather than once per event (a process with cores to
        spare would otherwise read each event as it comes, at several times the CPU per token)."""
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
            self._schedule()
        return self._flushed

    def _schedule(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(self._flush_s, self._flush)

    def _flush(self) -> None:
        ready, self._ready = self._ready, set()
        for rid in ready:  # (what they add goes out now: the handle still set arms no other flush)
            stream = self._reading.get(rid)
            if stream is not None:
                self._take(rid, stream)
        self._flush_handle = None
        flushed, self._flushed = self._flushed, None
        if flushed is not None:
            flushed.set_result(None)
        items = self._outbox
        items.extend(pending.item(rid) for rid, pending in self._pending.items())
        self._outbox = []
        self._pending.clear()
        if items:
            self._send(items)
        if self._doze is not None and self._reading:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_soon(self._dozing, loop.time() + self._flush_s)

    def _dozing(self, until: float) -> None:
        """Sleep until the next flush (or the process's other work comes), then let the loop read
        what every engine sent meanwhile, and flush it."""
        loop = asyncio.get_running_loop()
        if self._doze(until - loop.time()):
            self._flush_handle = loop.call_soon(self._after_poll)
        else:  # not dozing now: the next bytes arm the flush, as without a doze
            self._flush_handle = None
            if self._ready or self._pending or self._outbox or self._flushed is not None:
                self._schedule()

    def _after_poll(self) -> None:
        """Flush once the loop has polled its sockets: a callback scheduled now runs before the
        loop's next poll (asyncio's and uvloop's loops alike), one scheduled by that one after it."""
        self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)


def _failure(rid: str, exc: Exception) -> tuple[str, str]:
    """The kind and words of a stream's failure, as the manager is told of it."""
    if isinstance(exc, EngineRejectedError):
        return wire.REJECTED, str(exc)
    if isinstance(exc, RequestFailedError):
        return wire.REQUEST_FAILED, str(exc)
    if isinstance(exc, ENGINE_ERRORS):
        return wire.ENGINE, str(exc)
    # a fault of this process's code: the manager must hear of it
    log.error("reading %s failed unexpectedly", rid, exc_info=exc)
    return wire.INTERNAL, repr(exc)
