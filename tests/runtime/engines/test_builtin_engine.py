"""The built-in engine as a real process on 127.0.0.1, driven through SGLang's HTTP API."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from rollflow.runtime.engines.sglang import BuiltinEngineClient
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.engines.helpers import (
    PROMPT,
    aborted_after,
    assert_continues_as_uninterrupted,
    collect,
    greedy,
    reference_greedy,
    run,
)


def test_greedy_output_and_logprobs_equal_transformers_without_a_kv_cache(engine, tiny_model):
    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            got = await collect(client, "ref", PROMPT, greedy(24))
        finally:
            await client.close()
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0},
            "stream": True,
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(engine.url + "/generate", json=body) as resp,
        ):
            raw = await resp.read()
        return got, raw

    got, raw = run(go())
    tokens, logprobs = reference_greedy(tiny_model, PROMPT, 24)
    assert got.token_ids == tokens
    assert got.logprobs == pytest.approx(logprobs, abs=1e-4)
    assert got.finish_reason == "length"
    assert all(c.weight_version == 0 for c in got.chunks)
    # streamed as it decodes, not one blob at the end: one event per step on an idle machine, fewer
    # when its reader falls behind (a loaded CI machine gave 10 events for 24 tokens), as SGLang's
    # do. Counted on the wire: the client reduces each read to one chunk, however many events it held
    assert raw.count(b"data: {") > 1


def test_greedy_continuation_from_prompt_plus_prefix_equals_the_uninterrupted_output(engine):
    assert_continues_as_uninterrupted(lambda: BuiltinEngineClient(engine.url), cut=13, tolerance=1e-4)


def test_many_concurrent_requests_each_get_their_solo_output(engine):
    prompts = [[(7 * i + j) % 500 + 3 for j in range(3 + i % 5)] for i in range(12)]

    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            together = await asyncio.gather(
                *(collect(client, f"c{i}", p, greedy(10 + i)) for i, p in enumerate(prompts))
            )
            alone = [await collect(client, f"s{i}", p, greedy(10 + i)) for i, p in enumerate(prompts[:3])]
            return together, alone
        finally:
            await client.close()

    together, alone = run(go())
    assert [len(c.token_ids) for c in together] == [10 + i for i in range(12)]
    assert [c.token_ids for c in together[:3]] == [c.token_ids for c in alone]


def test_sampling_is_reproducible_with_a_seed_and_varies_without(engine):
    sampled = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, ignore_eos=True, seed=7)

    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            a = await collect(client, "a", PROMPT, sampled)
            b = await collect(client, "b", PROMPT, sampled)
            c = await collect(
                client, "c", PROMPT, SamplingParams(max_new_tokens=20, temperature=1.0, ignore_eos=True)
            )
            g = await collect(client, "g", PROMPT, greedy(20))
            return a, b, c, g
        finally:
            await client.close()

    a, b, c, g = run(go())
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids or a.token_ids != g.token_ids
    assert all(lp <= 0 for lp in a.logprobs)


def test_a_stop_token_ends_the_request_with_stop(engine):
    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            free = await collect(client, "free", PROMPT, greedy(8))
            stop_at = free.token_ids[3]
            stopped = await collect(client, "stopped", PROMPT, greedy(8, stop_token_ids=(stop_at,)))
            return free, stopped, stop_at
        finally:
            await client.close()

    free, stopped, stop_at = run(go())
    first = free.token_ids.index(stop_at)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"


def test_abort_ends_a_long_stream_promptly_with_abort(engine):
    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            return await aborted_after(client, 5)
        finally:
            await client.close()

    chunks = run(go())
    assert chunks[-1].finish_reason == "abort"
    assert 5 <= sum(len(c.token_ids) for c in chunks) < 200


def test_a_client_that_disconnects_aborts_its_request(engine):
    async def go():
        async with aiohttp.ClientSession() as session:
            body = {
                "input_ids": PROMPT,
                "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True},
                "stream": True,
            }
            async with session.post(engine.url + "/generate", json=body) as resp:
                await resp.content.readline()
            running = []
            for _ in range(50):
                async with session.get(engine.url + "/get_model_info") as info:
                    running.append((await info.json())["num_running_requests"])
                if running[-1] == 0:
                    break
                await asyncio.sleep(0.05)
            return running

    assert run(go())[-1] == 0


def test_non_stream_answer_has_sglang_shape(engine):
    async def go():
        async with aiohttp.ClientSession() as session:
            body = {
                "text": "the quick brown fox",
                "sampling_params": {"max_new_tokens": 5, "temperature": 0},
                "return_logprob": True,
                "rid": "shape",
            }
            async with session.post(engine.url + "/generate", json=body) as resp:
                return resp.status, await resp.json()

    status, answer = run(go())
    assert status == 200
    meta = answer["meta_info"]
    assert meta["id"] == "shape" and meta["completion_tokens"] == len(answer["output_ids"]) <= 5
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert isinstance(answer["text"], str) and meta["weight_version"] == 0 and meta["prompt_tokens"] > 0


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        (
            {"input_ids": [1, 2], "sampling_params": {"temprature": 0}},
            "sampling_params.temprature: unknown field",
        ),
        ({"input_ids": []}, "input_ids is empty"),
        ({"input_ids": [1, 99999]}, "outside the vocabulary"),
        ({"input_ids": [1], "text": "hi"}, "exactly one of input_ids or text"),
        ({"input_ids": [[1, 2], []]}, "input_ids is empty"),
        ({"input_ids": [[1, 2], [3]], "stream": True}, "stream with a batched /generate"),
        ({"input_ids": [[1, 2], [3]], "rid": ["a"]}, "rid has 1 entries for 2 prompts"),
        (
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**6}},
            "exceeds the model's context length",
        ),
        ("not json", "malformed JSON"),
        # values the sampler cannot honour are refused at the edge, never reach the generation thread
        ({"input_ids": [1], "sampling_params": {"sampling_seed": 2**70}}, "sampling_seed"),
        ({"input_ids": [1], "sampling_params": {"sampling_seed": -(2**63) - 1}}, "sampling_seed"),
        ('{"input_ids": [1], "sampling_params": {"temperature": Infinity}}', "temperature"),
        ('{"input_ids": [1], "sampling_params": {"temperature": NaN}}', "temperature"),
        ('{"input_ids": [1], "sampling_params": {"top_p": NaN}}', "top_p"),
        ('{"input_ids": [1], "sampling_params": {"top_p": 1e400}}', "top_p"),
    ],
)
def test_bad_generate_input_gets_a_400_naming_the_problem(engine, body, problem):
    async def go():
        async with aiohttp.ClientSession() as session:
            data = body if isinstance(body, str) else json.dumps(body)
            async with session.post(engine.url + "/generate", data=data) as resp:
                return resp.status, await resp.json()

    status, answer = run(go())
    assert status == 400
    assert problem in answer["error"]["message"]


def test_a_tiny_temperature_decodes_greedily_and_the_engine_stays_healthy(engine):
    """temperature 1e-38 once killed the generation thread (logits / 1e-38 overflow to NaN)."""

    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            tiny = SamplingParams(max_new_tokens=12, temperature=1e-38, ignore_eos=True)
            got = await collect(client, "tiny-temperature", PROMPT, tiny)
            return got, await collect(client, "greedy-after", PROMPT, greedy(12)), await client.health()
        finally:
            await client.close()

    tiny, after, healthy = run(go())
    assert tiny.token_ids == after.token_ids and healthy


def test_health_endpoints_and_model_info(engine, tiny_model):
    async def go():
        client = BuiltinEngineClient(engine.url)
        try:
            info = await client.get_json("/get_model_info")
            return (
                await client.health(),
                await client.status("/health_generate"),
                info,
                await client.weight_version(),
            )
        finally:
            await client.close()

    healthy, generate_status, info, version = run(go())
    assert healthy and generate_status == 200 and version == 0
    assert info["model_path"] == str(tiny_model.resolve()) and info["is_generation"]
