"""An SGLang-shaped engine with no model: `/generate` streams canned tokens at once.

    python benchmarks/canned_engine.py --port 30000

A backend fast enough never to be the bound, so a benchmark measures what a router in front of
it adds. It runs in a process of its own (not a thread of the load generator, whose GIL it would
share), serves the routes a router calls (health, model info, weight version, abort, SGLang's load
routes) and answers `/generate` with `max_new_tokens` tokens (ids 1..n, logprob -0.5) in one event,
streamed or not, as SGLang shapes them. Prints `serving on http://HOST:PORT` when ready.
"""

from __future__ import annotations

import argparse
import json
import logging

from aiohttp import web


async def _generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    n = int(body.get("sampling_params", {}).get("max_new_tokens", 8))
    ids = list(range(1, n + 1))
    meta = {
        "id": body.get("rid") or "canned",
        "prompt_tokens": len(body.get("input_ids") or []),
        "completion_tokens": n,
        "finish_reason": {"type": "length", "length": n},
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
        "weight_version": 0,
    }
    payload = {"text": "", "output_ids": ids, "meta_info": meta}
    if not body.get("stream"):
        return web.json_response(payload)
    # the whole event stream in one body of known length: a streamed request costs this engine no
    # more than one that is not (aiohttp's chunked writer would), so both routers' engines do alike
    stream = b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"
    return web.Response(body=stream, content_type="text/event-stream")


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


def build_app() -> web.Application:
    app = web.Application()
    app.add_routes(
        [
            web.post("/generate", _generate),
            web.get("/health", _ok),
            web.get("/health_generate", _ok),
            web.get("/get_model_info", _model_info),
            web.get("/get_weight_version", _version),
            web.post("/abort_request", _ok),
            web.get("/v1/loads", _loads),
        ]
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args = parser.parse_args()
    # sglang-router probes workers with an HTTP/2 preface first; aiohttp logs each as a bad request
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    web.run_app(
        build_app(),
        host=args.host,
        port=args.port,
        access_log=None,
        print=lambda _: print(f"serving on http://{args.host}:{args.port}", flush=True),
    )


if __name__ == "__main__":
    main()
