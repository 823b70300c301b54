"""Engine streams read once per flush (streams/reading.py), in a stream process's session driven
over its socket as the manager drives it (in marshal, as a stream process speaks, and in JSON, as a
relay does), sleeping between flushes or not, and in this process as a one-process manager reads them:
the streams opened on an SGLang-style engine on 127.0.0.1 (read with no task per stream) come back
as merged chunks, and each way a stream can end badly as the failure the manager maps to an
attempt's outcome."""

from __future__ import annotations

import asyncio
import functools
import socket

import orjson
import pytest
from aiohttp import web

from rollflow.runtime.deadline import within
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.manager.streams import wire
from rollflow.runtime.manager.streams.doze import Doze
from rollflow.runtime.manager.streams.process import StreamSession, http_session
from rollflow.runtime.manager.streams.reading import StreamReading
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.engines.helpers import run

TOKENS = [11, 12, 13, 14, 15, 16]


def _event(rid: str, upto: int, finished: bool) -> bytes:
    """SGLang's default event: the whole output so far."""
    meta = {
        "id": rid,
        "completion_tokens": upto,
        "finish_reason": {"type": "length"} if finished else None,
        "output_token_logprobs": [[-0.25, token, None] for token in TOKENS[:upto]],
        "weight_version": 3,
    }
    return b"data: " + orjson.dumps({"text": "", "output_ids": TOKENS[:upto], "meta_info": meta}) + b"\n\n"


async def _generate(request: web.Request) -> web.StreamResponse:
    """`rid` says how to answer: `ok` streams every token in three writes and finishes, `bad` is a
    request the engine refuses, `cut` ends its body after two tokens, without a finish, and `junk`
    sends two tokens and then garbage."""
    rid = (await request.json())["rid"]
    if rid.startswith("bad"):
        return web.json_response({"error": {"message": "input_ids too long"}}, status=400)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if rid.startswith("cut"):
        await response.write(_event(rid, 2, False))
        await response.write_eof()
        return response
    if rid.startswith("junk"):  # two tokens, then an event that is not JSON, in one write
        await response.write(_event(rid, 2, False) + b"data: {this is not json\n\n")
        await response.write_eof()
        return response
    for upto in (1, 4):
        await response.write(_event(rid, upto, False))
        await asyncio.sleep(0.02)
    await response.write(_event(rid, len(TOKENS), True) + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _engine() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/generate", _generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def _gather(items: dict[str, list], ended: set[str], message: list) -> None:
    for item in message:
        items[item[1]].append(list(item))
        if item[0] == wire.FAILED or item[4] is not None:
            ended.add(item[1])


class _CountedDoze(Doze):
    def __init__(self) -> None:
        super().__init__()
        self.dozed = 0

    def __call__(self, timeout_s: float) -> bool:
        dozing = super().__call__(timeout_s)
        self.dozed += dozing
        return dozing


async def _session_answers(
    rids: list[str], codec: wire.Codec, doze: bool = False, other_readers: int = 0
) -> dict[str, list]:
    """Open `rids` on a stream process's session over a socket pair, as the manager does, and gather
    what each stream sent back until every one ended; `doze`: sleeping between flushes, as a stream
    process does; `other_readers`: sessions of other managers sharing the doze (a relay's), which
    keep it from dozing."""
    runner, url = await _engine()
    ours, theirs = socket.socketpair()
    sampling = wire.sampling_fields(SamplingParams(max_new_tokens=len(TOKENS)))
    items: dict[str, list] = {rid: [] for rid in rids}
    try:
        async with http_session(5.0) as http:
            session_reader, session_writer = await asyncio.open_unix_connection(sock=theirs)
            dozing = _CountedDoze() if doze else None
            others = [socket.socketpair() for _ in range(other_readers)]
            for _, other in others:
                dozing.join(other.fileno())
            session = asyncio.create_task(
                StreamSession(session_reader, session_writer, http, 0.01, codec, doze=dozing).run()
            )
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            for rid in rids:
                writer.write(wire.frame([wire.OPEN, rid, "sglang", url, None, [1, 2, 3], sampling], codec))
            frames = wire.FrameReader(codec=codec)
            ended: set[str] = set()
            while len(ended) < len(rids):
                data = await within(reader.read(1 << 16), 10)
                assert data, "the session closed"
                for message in frames.feed(data):
                    _gather(items, ended, message)
            writer.close()
            await session
            assert dozing is None or (dozing.dozed > 0) == (not others)
            for pair in others:
                for end in pair:
                    end.close()
    finally:
        await runner.cleanup()
        await asyncio.sleep(0.05)  # the engine's handlers of the closed connections end
    return items


async def _reading_answers(rids: list[str]) -> dict[str, list]:
    """The same streams read in this process, as a one-process manager reads its SGLang engines'."""
    runner, url = await _engine()
    items: dict[str, list] = {rid: [] for rid in rids}
    ended: set[str] = set()
    try:
        async with http_session(5.0) as http:
            client = make_client("sglang", url, http)
            all_ended = asyncio.get_running_loop().create_future()

            def send(message: list[tuple]) -> None:
                _gather(items, ended, message)
                if len(ended) == len(rids) and not all_ended.done():
                    all_ended.set_result(None)

            reading = StreamReading(send, flush_s=0.01)
            for rid in rids:
                reading.open(rid, client, [1, 2, 3], SamplingParams(max_new_tokens=len(TOKENS)))
            await within(all_ended, 10)
            await reading.aclose()
    finally:
        await runner.cleanup()
        await asyncio.sleep(0.05)  # the engine's handlers of the closed connections end
    return items


READERS = {
    "stream process": functools.partial(_session_answers, codec=wire.MARSHAL),
    "stream process, dozing between flushes": functools.partial(
        _session_answers, codec=wire.MARSHAL, doze=True
    ),
    "relay serving another manager too (no doze)": functools.partial(
        _session_answers, codec=wire.JSON, doze=True, other_readers=1
    ),
    "relay": functools.partial(_session_answers, codec=wire.JSON),
    "this process": _reading_answers,
}


@pytest.mark.parametrize("where", READERS)
def test_streams_come_back_merged_and_each_bad_end_as_its_failure(where):
    answers = READERS[where]
    items = run(answers(["ok-1", "ok-2", "bad-1", "cut-1", "junk-1"]))
    for rid in ("ok-1", "ok-2"):
        chunks = [wire.chunk_from(item) for item in items[rid]]
        assert all(item[0] == wire.CHUNK for item in items[rid])
        assert [token for chunk in chunks for token in chunk.token_ids] == TOKENS
        assert [lp for chunk in chunks for lp in chunk.logprobs] == [-0.25] * len(TOKENS)
        assert chunks[-1].finish_reason == "length" and {chunk.weight_version for chunk in chunks} == {3}
        assert len(chunks) < len(TOKENS)  # merged: fewer chunks than events' tokens
    assert [item[:3] for item in items["bad-1"]] == [[wire.FAILED, "bad-1", wire.REJECTED]]
    assert "input_ids too long" in items["bad-1"][0][3]
    *tokens, failed = items["cut-1"]
    assert [t for item in tokens for t in wire.chunk_from(item).token_ids] == TOKENS[:2]
    assert failed[:3] == [wire.FAILED, "cut-1", wire.ENGINE] and "without a finish_reason" in failed[3]
    *tokens, failed = items["junk-1"]  # the tokens before the garbage are kept, then the engine's fault
    assert [t for item in tokens for t in wire.chunk_from(item).token_ids] == TOKENS[:2]
    assert failed[:3] == [wire.FAILED, "junk-1", wire.ENGINE]
