"""Clients facing engines that misbehave: a fault-injecting HTTP server on 127.0.0.1 plays the engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from rollflow.errors import UserError
from rollflow.runtime.engines.base import EngineError, EngineRejectedError, EngineResponseError, GenerateChunk
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.engines.sglang import parse_sglang_event
from rollflow.runtime.engines.vllm import parse_vllm_event
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.engines.helpers import run

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAMPLING = SamplingParams(max_new_tokens=4, temperature=0)


@contextlib.asynccontextmanager
async def fault_server(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def sse(*payloads: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for payload in payloads:
            await response.write(payload)
        await response.write_eof()
        return response

    return handler


def event(output_ids, logprobs, completion_tokens, finish=None, version="2") -> bytes:
    meta = {
        "completion_tokens": completion_tokens,
        "finish_reason": finish,
        "weight_version": version,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, output_ids, strict=True)],
    }
    return (
        b"data: " + json.dumps({"text": "", "output_ids": output_ids, "meta_info": meta}).encode() + b"\n\n"
    )


async def _generate(kind: str, handler: Handler, **client_args) -> list[GenerateChunk]:
    async with fault_server(handler) as url:
        client = make_client(kind, url, **client_args)
        try:
            return [c async for c in client.generate("r", [1, 2], SAMPLING)]
        finally:
            await client.close()


def test_cumulative_and_incremental_sglang_streams_give_the_same_new_tokens():
    cumulative = sse(
        event([5], [-0.5], 1),
        event([5, 6], [-0.5, -0.6], 2),
        event([5, 6, 7], [-0.5, -0.6, -0.7], 3, {"type": "length", "length": 3}),
        b"data: [DONE]\n\n",
    )
    incremental = sse(
        event([5], [-0.5], 1),
        event([6, 7], [-0.6, -0.7], 3, {"type": "length", "length": 3}),
        b"data: [DONE]\n\n",
    )
    for handler in (cumulative, incremental):
        chunks = run(_generate("sglang", handler))
        assert [t for c in chunks for t in c.token_ids] == [5, 6, 7]
        assert [lp for c in chunks for lp in c.logprobs] == [-0.5, -0.6, -0.7]
        assert chunks[-1].finish_reason == "length" and chunks[-1].weight_version == 2


@pytest.mark.parametrize(
    ("payloads", "problem"),
    [
        ((b"data: {not json\n\n",), "non-JSON"),
        ((b"hello\n\n",), "not an SSE data line"),
        ((event([5], [-0.5], 1), b"data: [DONE]\n\n"), "ended without a finish_reason"),
        ((event([5], [-0.5], 3),), "reports 3 tokens"),
        ((event([5], [-0.5], 1, {"type": "exploded"}),), "unknown finish_reason"),
        ((b'data: {"error": {"message": "boom"}}\n\n',), "boom"),
    ],
)
def test_garbage_from_an_sglang_engine_is_a_clear_response_error(payloads, problem):
    with pytest.raises(EngineResponseError, match=problem):
        run(_generate("sglang", sse(*payloads)))


def test_http_errors_are_typed_by_who_is_at_fault():
    def status(code: int) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response({"error": {"message": f"status {code}"}}, status=code)

        return handler

    with pytest.raises(EngineRejectedError, match="HTTP 400: status 400"):
        run(_generate("sglang", status(400)))
    with pytest.raises(EngineResponseError, match="HTTP 503: status 503"):
        run(_generate("builtin", status(503)))


def test_an_engine_that_stops_sending_times_out_and_a_closed_port_is_an_engine_error():
    async def hang(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(event([5], [-0.5], 1))
        await asyncio.sleep(30)
        return response

    with pytest.raises(EngineError, match="broke off"):
        run(_generate("sglang", hang, read_timeout_s=0.3))

    async def refused():
        async with fault_server(sse()) as url:
            pass  # the server is gone: nothing listens on the port any more
        client = make_client("vllm", url)
        try:
            healthy = await client.health()
            with pytest.raises(EngineError):
                [c async for c in client.generate("r", [1], SAMPLING)]
            return healthy
        finally:
            await client.close()

    assert run(refused()) is False


def test_vllm_events_without_matching_token_ids_and_logprobs_are_refused():
    good = {
        "choices": [{"token_ids": [4], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "length"}]
    }
    assert parse_vllm_event(good) == GenerateChunk([4], [-1.0], "length", None)
    assert parse_vllm_event({"choices": []}) is None
    with pytest.raises(EngineResponseError, match="1 token_ids and 0 logprobs"):
        parse_vllm_event({"choices": [{"token_ids": [4], "logprobs": None}]})
    with pytest.raises(EngineResponseError, match="without choices"):
        parse_vllm_event({"object": "error"})


def test_a_vllm_stream_ends_with_its_finishing_chunk_and_the_cached_tokens_of_its_usage_event():
    def choice(token_ids: list[int], finish: str | None) -> bytes:
        logprobs = {"token_logprobs": [-0.5] * len(token_ids)}
        payload = {
            "choices": [{"token_ids": token_ids, "logprobs": logprobs, "finish_reason": finish, "text": "x"}]
        }
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    usage = {"choices": [], "usage": {"prompt_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}}
    stream = sse(choice([5], None), choice([6], "length"), b"data: " + json.dumps(usage).encode() + b"\n\n")

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "tiny"}]})
        return await stream(request)

    chunks = run(_generate("vllm", handler))
    assert [t for c in chunks for t in c.token_ids] == [5, 6]
    assert chunks[-1].finish_reason == "length" and chunks[-1].cached_tokens == 16


def test_sglang_string_weight_versions_that_are_not_numbers_read_as_none():
    payload = json.loads(event([5], [-0.5], 1, version="default")[6:])
    assert parse_sglang_event(payload, 0).weight_version is None


@pytest.mark.parametrize("entry", [{"logprob": -0.5, "id": 5}, [-0.5], 7, ["x", 5]])
def test_sglang_malformed_logprob_entries_are_a_response_error(entry):
    """Whatever shape an engine sends in place of [logprob, id, text], the manager is told its answer
    is malformed (it retires the engine) rather than meeting a bare KeyError or TypeError."""
    payload = {"output_ids": [5], "meta_info": {"completion_tokens": 1, "output_token_logprobs": [entry]}}
    with pytest.raises(EngineResponseError, match="malformed output_token_logprobs"):
        parse_sglang_event(payload, 0)


def test_sglang_logprob_entries_of_other_number_types_are_converted_as_python_converts_them():
    """An integer logprob (0 for a certain token) and an id sent as a float or a bool read as float
    and int: the types engines send are taken as they are, anything else goes through float/int."""
    entries = [[0, 5, None], [-0.25, 6.0, "x"], [-1.5, True, None]]
    payload = {
        "output_ids": [5, 6, 1],
        "meta_info": {"completion_tokens": 3, "output_token_logprobs": entries},
    }
    chunk = parse_sglang_event(payload, 0)
    assert chunk.logprobs == [0.0, -0.25, -1.5] and type(chunk.logprobs[0]) is float
    assert chunk.token_ids == [5, 6, 1] and all(type(t) is int for t in chunk.token_ids)


def test_unknown_engine_kind_names_the_choices():
    with pytest.raises(
        UserError, match=r"unknown engine kind 'tgi'; choose one of \['builtin', 'sglang', 'vllm'\]"
    ):
        make_client("tgi", "http://127.0.0.1:1")


def test_every_sampling_field_reaches_sglang_and_vllm_under_their_names():
    """The bodies the clients send over HTTP, field by field, as SGLang and vLLM name them."""
    params = SamplingParams(
        max_new_tokens=9,
        stop=("END",),
        stop_token_ids=(7,),
        min_new_tokens=2,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        repetition_penalty=1.5,
        min_p=0.1,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        no_stop_trim=True,
        seed=3,
    )
    sent: dict[str, dict] = {}

    async def record(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m"}]})
        sent[request.path] = await request.json()
        if request.path == "/generate":
            return await sse(event([5], [-0.5], 1, {"type": "length"}))(request)
        choice = {
            "text": "x",
            "token_ids": [5],
            "logprobs": {"token_logprobs": [-0.5]},
            "finish_reason": "length",
        }
        return await sse(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\ndata: [DONE]\n\n")(
            request
        )

    async def main() -> None:
        async with fault_server(record) as url:
            for kind in ("sglang", "vllm"):
                client = make_client(kind, url)
                try:
                    assert [c.token_ids async for c in client.generate("r", [1], params)] == [[5]]
                finally:
                    await client.close()

    run(main())
    alike = {  # the fields both name the same
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "ignore_eos": False,
        "stop": ["END"],
        "stop_token_ids": [7],
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "repetition_penalty": 1.5,
        "min_p": 0.1,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    assert sent["/generate"]["sampling_params"] == {
        **alike,
        "max_new_tokens": 9,
        "sampling_seed": 3,
        "min_new_tokens": 2,
        "no_stop_trim": True,
    }
    assert sent["/v1/completions"] == {
        "model": "m",
        "prompt": [1],
        "request_id": "r",
        "stream": True,
        "logprobs": 0,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
        **alike,
        "max_tokens": 9,
        "seed": 3,
        "min_tokens": 2,
        "include_stop_str_in_output": True,
    }


def test_each_request_sends_its_own_sampling_params():
    """The SGLang client keeps SGLang's form of the last sampling params it sent (requests alike
    share one object): a request with other params sends those."""
    sent: list[dict] = []

    async def record(request: web.Request) -> web.StreamResponse:
        sent.append((await request.json())["sampling_params"])
        return await sse(event([5], [-0.5], 1, {"type": "length"}))(request)

    async def main() -> None:
        async with fault_server(record) as url:
            client = make_client("sglang", url)
            try:
                for sampling in (SAMPLING, SAMPLING, SamplingParams(max_new_tokens=4, temperature=0.5)):
                    assert [c.token_ids async for c in client.generate("r", [1], sampling)] == [[5]]
            finally:
                await client.close()

    run(main())
    assert [s["temperature"] for s in sent] == [0, 0, 0.5]
