"""An engine with no model: `/generate` streams canned tokens as SGLang does, and vLLM's routes as vLLM does.

    python benchmarks/canned_engine.py --port 30000 [--tokens-per-event 1] [--events-per-write 1]
        [--incremental-streaming-output] [--token-delay-ms 0]

A backend fast enough never to be the bound, so a benchmark measures what a router in front of
it adds. It runs in a process of its own (not a thread of the load generator, whose GIL it would
share), serves the routes a router calls (health, model info, weight version, abort, SGLang's load
routes) and answers `/generate` with `max_new_tokens` tokens (ids 1..n, logprob -0.5).

Streamed, it sends one server-sent event per `--tokens-per-event` tokens (1 by default: one event
per token, the per-token work a router meets in front of a real engine; N is SGLang's
`--stream-interval N`; 0 sends the whole output in one event), each event its own write, or
`--events-per-write` events to a write (as a busy engine's events reach its socket together). Each
event holds the output so far, as SGLang streams by default, or only its new tokens with
`--incremental-streaming-output` (SGLang's flag of the same name): `output_ids`, and with
`return_logprob` `meta_info.output_token_logprobs`, hold the same span, while
`meta_info.completion_tokens` is always the count so far. Not streamed, it answers one JSON body.
`--token-delay-ms` waits between events (0: none). Prints `serving on http://HOST:PORT` when ready.

The same process answers as a vLLM server too (vLLM 0.32's shapes), so a benchmark can put
vllm-router and the manager in front of the same engines: `/inference/v1/generate` (the token-in/
token-out generate RL clients send through vllm-router; one JSON body, or with `stream: true` one
event per `--tokens-per-event` tokens holding only its new tokens, as vLLM streams it),
`/v1/completions` streamed (what the manager's vLLM client reads: `token_ids` and the sampled
tokens' logprobs per event, then a usage event), `/v1/models` and the `/metrics` gauges the manager
polls for load. `sampling_params.max_tokens` (`max_tokens` on /v1/completions) sets the count, 16
when left out, as vLLM's default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

TOKENS_PER_EVENT = web.AppKey("tokens_per_event", int)
INCREMENTAL = web.AppKey("incremental", bool)
TOKEN_DELAY_S = web.AppKey("token_delay_s", float)
EVENTS_PER_WRITE = web.AppKey("events_per_write", int)


def _answer(body: dict[str, Any], ids: list[int], start: int, end: int) -> dict[str, Any]:
    """SGLang's answer once `end` tokens are out, holding those from `start` on."""
    n = len(ids)
    meta: dict[str, Any] = {
        "id": body.get("rid") or "canned",
        "prompt_tokens": len(body.get("input_ids") or []),
        "completion_tokens": end,
        "finish_reason": {"type": "length", "length": n} if end == n else None,
        "weight_version": 0,
    }
    if body.get("return_logprob"):
        meta["output_token_logprobs"] = [[-0.5, t, None] for t in ids[start:end]]
    return {"text": "", "output_ids": ids[start:end], "meta_info": meta}


async def _generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = int(body.get("sampling_params", {}).get("max_new_tokens", 8))
    ids = list(range(1, n + 1))
    if not body.get("stream"):
        return web.json_response(_answer(body, ids, 0, n))
    incremental = request.app[INCREMENTAL]
    events = (
        b"data: " + orjson.dumps(_answer(body, ids, start if incremental else 0, end)) + b"\n\n"
        for start, end in _spans(request.app, n)
    )
    return await _stream(request, events)


def _spans(app: web.Application, n: int) -> list[tuple[int, int]]:
    """The (start, end) token span of each streamed event of an `n`-token answer."""
    step = app[TOKENS_PER_EVENT] or max(n, 1)
    ends = [*range(step, n, step), n]
    return list(zip([0, *ends[:-1]], ends, strict=True))


async def _stream(request: web.Request, events: Iterable[bytes]) -> web.StreamResponse:
    """`events` as server-sent events, `--events-per-write` to a write, then `data: [DONE]`."""
    delay_s, per_write = request.app[TOKEN_DELAY_S], request.app[EVENTS_PER_WRITE]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):  # the router went away (aborted, or killed)
        pending = []
        for event in events:
            pending.append(event)
            if len(pending) == per_write:
                await response.write(b"".join(pending))
                pending.clear()
            if delay_s:
                await asyncio.sleep(delay_s)
        await response.write(b"".join(pending) + b"data: [DONE]\n\n")
        await response.write_eof()
    return response


def _vllm_logprobs(ids: list[int], wanted: bool) -> dict[str, Any] | None:
    """vLLM's tokens-mode logprobs of `ids` (each -0.5), None when the request asked for none."""
    if not wanted:
        return None
    return {"content": [{"token_id": t, "logprob": -0.5, "rank": 1, "top_logprobs": []} for t in ids]}


async def _inference_generate(request: web.Request) -> web.StreamResponse:
    """vLLM's `/inference/v1/generate`: one JSON answer, or a stream of new tokens."""
    body = await request.json()
    sampling = body.get("sampling_params") or {}
    n = int(sampling.get("max_tokens") or 16)
    ids, rid = list(range(1, n + 1)), body.get("request_id") or "canned"
    logprobs = sampling.get("logprobs") is not None

    def choice(start: int, end: int) -> dict[str, Any]:
        return {
            "index": 0,
            "finish_reason": "length" if end == n else None,
            "token_ids": ids[start:end],
            "logprobs": _vllm_logprobs(ids[start:end], logprobs),
        }

    if not body.get("stream"):
        answer = {"request_id": rid, "model": body.get("model"), "choices": [choice(0, n)]}
        return web.json_response(answer | {"prompt_logprobs": None, "kv_transfer_params": None})
    events = (
        b"data: " + orjson.dumps({"request_id": rid, "choices": [choice(start, end)]}) + b"\n\n"
        for start, end in _spans(request.app, n)
    )
    return await _stream(request, events)


async def _completions(request: web.Request) -> web.StreamResponse:
    """vLLM's `/v1/completions` with a token-id prompt, streamed with `return_token_ids` and the
    sampled tokens' logprobs, then the usage event (what the manager's vLLM client asks for)."""
    body = await request.json()
    if not body.get("stream"):
        raise web.HTTPBadRequest(text="the canned engine streams /v1/completions only")
    n, rid = int(body.get("max_tokens") or 16), body.get("request_id") or "canned"
    ids = list(range(1, n + 1))

    def event(start: int, end: int) -> bytes:
        logprobs = {"tokens": [""] * (end - start), "token_logprobs": [-0.5] * (end - start)}
        choice = {"index": 0, "text": "", "logprobs": logprobs, "token_ids": ids[start:end]}
        choice["finish_reason"] = "length" if end == n else None
        answer = {"id": rid, "object": "text_completion", "model": "canned", "choices": [choice]}
        return b"data: " + orjson.dumps(answer) + b"\n\n"

    prompt = len(body.get("prompt") or [])
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    last = orjson.dumps({"id": rid, "object": "text_completion", "choices": [], "usage": usage})
    events = [*(event(start, end) for start, end in _spans(request.app, n)), b"data: " + last + b"\n\n"]
    return await _stream(request, events)


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "canned", "object": "model"}]})


async def _vllm_metrics(request: web.Request) -> web.Response:
    # vLLM's load gauges: nothing is ever held, as on /v1/loads
    gauges = 'vllm:num_requests_running{model_name="canned"} 0.0\nvllm:num_requests_waiting{model_name="canned"} 0.0\n'
    return web.Response(text=gauges, content_type="text/plain")


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"success": True})


async def _model_info(request: web.Request) -> web.Response:
    return web.json_response({"model_path": "canned", "is_generation": True, "weight_version": 0})


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": 0})


async def _loads(request: web.Request) -> web.Response:
    # nothing is ever held: every request is answered the moment it arrives
    rank = {"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0}
    return web.json_response({"dp_rank_count": 1, "loads": [rank | {"max_total_num_tokens": 1 << 20}]})


def build_app(
    tokens_per_event: int = 1,
    incremental: bool = False,
    token_delay_s: float = 0.0,
    events_per_write: int = 1,
) -> web.Application:
    app = web.Application()
    app[TOKENS_PER_EVENT] = tokens_per_event
    app[EVENTS_PER_WRITE] = events_per_write
    app[INCREMENTAL] = incremental
    app[TOKEN_DELAY_S] = token_delay_s
    app.add_routes(
        [
            web.post("/generate", _generate),
            web.get("/health", _ok),
            web.get("/health_generate", _ok),
            web.get("/get_model_info", _model_info),
            web.get("/get_weight_version", _version),
            web.post("/abort_request", _ok),
            web.get("/v1/loads", _loads),
            web.post("/inference/v1/generate", _inference_generate),
            web.post("/v1/completions", _completions),
            web.get("/v1/models", _models),
            web.get("/metrics", _vllm_metrics),
        ]
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--tokens-per-event", type=int, default=1, help="tokens per streamed event (0: all in one event)"
    )
    parser.add_argument(
        "--events-per-write", type=int, default=1, help="streamed events sent together in one write"
    )
    parser.add_argument(
        "--incremental-streaming-output", action="store_true", help="each event holds only its new tokens"
    )
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="wait between streamed events")
    args = parser.parse_args()
    if args.tokens_per_event < 0 or args.token_delay_ms < 0 or args.events_per_write < 1:
        parser.error(
            "--tokens-per-event and --token-delay-ms cannot be negative, --events-per-write is at least 1"
        )
    # sglang-router probes workers with an HTTP/2 preface first; aiohttp logs each as a bad request
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    web.run_app(
        build_app(
            args.tokens_per_event,
            args.incremental_streaming_output,
            args.token_delay_ms / 1000,
            args.events_per_write,
        ),
        host=args.host,
        port=args.port,
        access_log=None,
        print=lambda _: print(f"serving on http://{args.host}:{args.port}", flush=True),
    )


if __name__ == "__main__":
    main()
