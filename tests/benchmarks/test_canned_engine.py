"""The canned engine streams as SGLang does: the manager's own client reads every token of it, its
events written one at a time or several to a write; and it answers as vLLM does, to the manager's
vLLM client and to a client of vLLM's token-in/token-out generate."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from benchmarks.canned_engine import build_app
from rollflow.runtime.engines.base import EngineClient, GenerateChunk
from rollflow.runtime.engines.sglang import SGLangClient
from rollflow.runtime.engines.vllm import VLLMClient
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.processes import free_port

TOKENS = 7


@contextlib.asynccontextmanager
async def _served(app: web.Application) -> AsyncIterator[str]:
    """`app` on a free port of 127.0.0.1: its URL, until the block ends."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _parsed(client: EngineClient) -> list[GenerateChunk]:
    """The chunks `client` parsed of one request of TOKENS tokens; the client is closed after."""
    try:
        return [c async for c in client.generate("r1", [1, 2], SamplingParams(max_new_tokens=TOKENS))]
    finally:
        await client.close()


async def _serve_and_read(
    tokens_per_event: int, incremental: bool, events_per_write: int = 1
) -> tuple[list, list[bytes]]:
    """(the chunks SGLangClient parsed, the raw events) of one streamed request of TOKENS tokens."""
    async with _served(build_app(tokens_per_event, incremental, events_per_write=events_per_write)) as url:
        chunks = await _parsed(SGLangClient(url))
        async with aiohttp.ClientSession() as session:
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": TOKENS}, "stream": True}
            async with session.post(url + "/generate", json=body) as response:
                raw = await response.read()
    return chunks, [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize(
    ("tokens_per_event", "incremental", "events_per_write", "events"),
    [
        (1, False, 1, TOKENS),
        (1, True, 1, TOKENS),
        (3, False, 1, 3),
        (3, True, 1, 3),
        (0, False, 1, 1),
        (1, False, 4, TOKENS),
        (1, True, 4, TOKENS),
    ],
)
def test_stream_reads_as_sglang(
    tokens_per_event: int, incremental: bool, events_per_write: int, events: int
) -> None:
    chunks, raw = asyncio.run(_serve_and_read(tokens_per_event, incremental, events_per_write))
    assert [t for c in chunks for t in c.token_ids] == list(range(1, TOKENS + 1))
    assert all(lp == -0.5 for c in chunks for lp in c.logprobs)
    # the client reduces each read (one or more writes) to one chunk: as many as events at most
    assert 1 <= len(chunks) <= events
    assert [c.finish_reason for c in chunks][-1] == "length" and all(
        c.finish_reason is None for c in chunks[:-1]
    )
    assert len(raw) == events + 1 and raw[-1] == b"data: [DONE]"
    # cumulative events repeat the output so far; incremental ones only their new tokens
    assert (b'"output_ids":[7]' if incremental else b'"output_ids":[1,2,3,4,5,6,7]') in raw[-2]


async def _serve_as_vllm(tokens_per_event: int) -> tuple[list, dict, list[bytes]]:
    """(the chunks VLLMClient parsed, a JSON /inference/v1/generate answer, the events of a streamed
    one) of TOKENS tokens each."""
    async with _served(build_app(tokens_per_event)) as url:
        chunks = await _parsed(VLLMClient(url))
        async with aiohttp.ClientSession() as session:
            body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": TOKENS, "logprobs": 0}}
            async with session.post(url + "/inference/v1/generate", json=body) as response:
                answer = await response.json()
            async with session.post(url + "/inference/v1/generate", json=body | {"stream": True}) as response:
                raw = await response.read()
    return chunks, answer, [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize(("tokens_per_event", "events"), [(1, TOKENS), (3, 3)])
def test_it_answers_as_vllm(tokens_per_event: int, events: int) -> None:
    chunks, answer, raw = asyncio.run(_serve_as_vllm(tokens_per_event))
    assert [t for c in chunks for t in c.token_ids] == list(range(1, TOKENS + 1))
    assert all(lp == -0.5 for c in chunks for lp in c.logprobs)
    assert chunks[-1].finish_reason == "length" and all(c.finish_reason is None for c in chunks[:-1])
    (choice,) = answer["choices"]
    assert choice["token_ids"] == list(range(1, TOKENS + 1)) and choice["finish_reason"] == "length"
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == [-0.5] * TOKENS
    # streamed, each event holds only its new tokens; the last one finishes
    assert len(raw) == events + 1 and raw[-1] == b"data: [DONE]"
    streamed = [orjson.loads(e.removeprefix(b"data: "))["choices"][0] for e in raw[:-1]]
    assert [t for c in streamed for t in c["token_ids"]] == list(range(1, TOKENS + 1))
    assert [c["finish_reason"] for c in streamed] == [None] * (events - 1) + ["length"]
