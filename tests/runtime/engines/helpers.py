"""Small helpers for engine tests: run a coroutine, collect a stream, compute the reference output."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollflow.runtime.engines.base import EngineClient, GenerateChunk
from rollflow.runtime.wire.base import SamplingParams

PROMPT = [17, 240, 33, 101, 5, 77, 301, 12]


def greedy(max_new_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **kw)


@dataclass
class Collected:
    chunks: list[GenerateChunk]

    @property
    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def logprobs(self) -> list[float]:
        return [lp for c in self.chunks for lp in c.logprobs]

    @property
    def finish_reason(self) -> str | None:
        return self.chunks[-1].finish_reason if self.chunks else None


async def collect(
    client: EngineClient, rid: str, input_ids: list[int], sampling: SamplingParams
) -> Collected:
    chunks = []
    async with contextlib.aclosing(client.generate(rid, input_ids, sampling)) as stream:
        async for chunk in stream:
            assert len(chunk.token_ids) == len(chunk.logprobs)
            chunks.append(chunk)
    return Collected(chunks)


async def drain(stream: AsyncIterator[GenerateChunk]) -> list[GenerateChunk]:
    return [chunk async for chunk in stream]


def assert_continues_as_uninterrupted(
    make_client: Callable[[], EngineClient], cut: int, tolerance: float, max_new_tokens: int = 40
) -> None:
    """A greedy run of PROMPT, then PROMPT + its first `cut` tokens asking for the rest (what a request
    resumed from its tokens sends), on a client `make_client` makes: the rest must go on as if
    uninterrupted, the same tokens and their logprobs within `tolerance` (the engine's numerics)."""

    async def go() -> tuple[Collected, Collected]:
        client = make_client()
        try:
            full = await collect(client, "full", PROMPT, greedy(max_new_tokens))
            rest = await collect(client, "rest", PROMPT + full.token_ids[:cut], greedy(max_new_tokens - cut))
            return full, rest
        finally:
            await client.close()

    full, rest = run(go())
    assert full.token_ids[:cut] + rest.token_ids == full.token_ids
    assert rest.logprobs == pytest.approx(full.logprobs[cut:], abs=tolerance)


async def aborted_after(client: EngineClient, num_chunks: int) -> list[GenerateChunk]:
    """The chunks of a long greedy request of PROMPT, aborted once `num_chunks` chunks have come."""
    chunks = []
    async for chunk in client.generate("long", PROMPT, greedy(1900)):
        chunks.append(chunk)
        if len(chunks) == num_chunks:
            await client.abort("long")
    return chunks


async def paused_mid_stream(
    client: EngineClient, max_new_tokens: int, hold_s: float
) -> tuple[Collected, bool]:
    """A greedy stream of PROMPT, paused in place after its first chunk for `hold_s` and resumed: (all
    it streamed, whether it ended while paused). Paused, nothing arrives but what the client may
    already hold in flight."""
    stream = client.generate("frozen", PROMPT, greedy(max_new_tokens))
    first = await anext(stream)
    await client.pause()
    pending = asyncio.ensure_future(drain(stream))
    await asyncio.sleep(hold_s)
    ended_while_paused = pending.done()
    await client.resume()
    return Collected([first, *await pending]), ended_while_paused


def run(coro):
    return asyncio.run(coro)


def reference_greedy(
    model_dir: Path, input_ids: list[int], max_new_tokens: int
) -> tuple[list[int], list[float]]:
    """Greedy decoding by transformers without a KV cache (the whole sequence every step), and logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(input_ids)
    tokens, logprobs = [], []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            step_logprobs = torch.log_softmax(logits, -1)
            token = int(torch.argmax(step_logprobs))
            tokens.append(token)
            logprobs.append(float(step_logprobs[token]))
            ids.append(token)
    return tokens, logprobs
