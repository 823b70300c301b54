"""A lean-path stream whose client reads more slowly than tokens come: each event repeats the
output so far, so while the connection's unsent bytes pass STREAM_BACKLOG_BYTES the mid-stream
events are skipped (the next one holds what they would have), and the last is always written.

The connection is driven as the manager drives it (one `_stream` call per update) over a transport
that reports the backlog the test sets: a client that reads nothing would need an answer of
thousands of tokens from a real engine before the kernel's buffers (megabytes on loopback) fill."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rollflow.runtime.http.sse import event as sse_event
from rollflow.runtime.manager.core.samples import SampleState
from rollflow.runtime.manager.edge.lean import STREAM_BACKLOG_BYTES, _LeanConnection
from rollflow.runtime.manager.edge.sglang_api import PromptRequest


class Transport:
    """What a connection writes, and the unsent backlog the test says the client left."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.backlog = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return self.backlog

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class StreamedRequest(PromptRequest):
    """A streamed /generate with PromptRequest's own rules for what is due, and no manager behind it."""

    def __init__(self, sample: SimpleNamespace) -> None:
        self.body = SimpleNamespace(stream=True)
        self.sample = sample
        self.rid, self.tokenizer = "r", None
        self._streamed = -1
        self._events = SimpleNamespace(event=lambda *_: sse_event({"output_ids": list(sample.output_ids)}))
        self.released: list[object] = []

    def refusal(self) -> None:
        return None

    def release(self, manager: object) -> None:
        self.released.append(manager)


def test_events_are_skipped_while_the_client_lags_and_the_last_is_always_written():
    loop = asyncio.new_event_loop()
    try:
        server = SimpleNamespace(loop=loop, manager=None, connections=set(), read_timeout_s=30.0)
        conn = _LeanConnection(server)
        conn.transport = Transport()
        sample = SimpleNamespace(state=SampleState.RUNNING, output_ids=[])
        request = StreamedRequest(sample)
        conn.request = request
        for token in range(1, 101):
            sample.output_ids.append(token)
            conn.transport.backlog = STREAM_BACKLOG_BYTES if 10 <= token < 90 else 0
            conn._stream(request)
        sample.state = SampleState.FINISHED
        conn.transport.backlog = STREAM_BACKLOG_BYTES  # the end is written even to a lagging client
        conn._stream(request)
    finally:
        loop.close()
    writes = conn.transport.writes
    # one write per update: the head goes with the first event, the end with the last
    head, first = writes[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked" in head
    assert writes[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    events = [w.split(b"\r\n", 2)[1] for w in [first, *writes[1:]]]
    counts = [event.count(b",") + 1 for event in events]  # tokens in each event's output_ids
    assert counts == [*range(1, 10), *range(90, 101), 100]  # 10-89 skipped; the final event after
    assert request.released == [None] and conn.request is None  # released, the connection ready for the next
