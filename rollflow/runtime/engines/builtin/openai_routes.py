"""The built-in engine's OpenAI routes and the SGLang info/admin routes a router fans out to.

POST /v1/completions, /v1/chat/completions   OpenAI's, streaming or not (rollflow.runtime.openai)
GET  /v1/models                              the one model served, named by its folder
GET  /get_server_info                        how the engine was started and what it holds now
POST /flush_cache                            SGLang's: empties the prefix cache
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

import rollflow
from rollflow.runtime.engines.builtin.worker import Sequence, TokenEvent
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.openai.serve import Delta, Tokenizer, handle
from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.openai import OpenAIError

if TYPE_CHECKING:
    from rollflow.runtime.engines.builtin.server import EngineServer

STARTED_AT = int(time.time())


class EngineTokens:
    """Token source of the OpenAI routes: one sequence on the engine's generation thread."""

    def __init__(self, server: EngineServer) -> None:
        self._server = server

    def open(
        self, prompt_ids: list[int], sampling: SamplingParams, incremental: bool
    ) -> AsyncIterator[Delta]:
        served = self._server.served
        bad = next((i for i in [*prompt_ids, *sampling.stop_token_ids] if i >= served.vocab_size), None)
        if bad is not None:
            raise OpenAIError(
                400, f"token id {bad} is outside the vocabulary [0, {served.vocab_size})", "prompt"
            )
        total = len(prompt_ids) + sampling.max_new_tokens
        if total > served.max_context_length:
            raise OpenAIError(
                400,
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_new_tokens}) = {total} exceeds "
                f"the model's context length {served.max_context_length}",
                "max_tokens",
            )
        return self._run(prompt_ids, sampling)

    async def _run(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        rid = f"openai-{uuid.uuid4().hex}"
        emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)  # noqa: E731
        worker = self._server.worker
        worker.submit(Sequence(rid=rid, token_ids=list(prompt_ids), sampling=sampling, emit=emit))
        finished = False
        try:
            while not finished:
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                ids = [e.token_id for e in batch if e.token_id is not None]
                logprobs = [e.logprob for e in batch if e.token_id is not None]
                finish = batch[-1].finish_reason
                finished = finish is not None
                if finished and finish.get("status_code", 200) >= 400:
                    raise OpenAIError(finish["status_code"], str(finish.get("message")))
                yield Delta(ids, logprobs, finish["type"] if finished else None)
        finally:
            if not finished:
                worker.abort(rid, "client went away")


def openai_routes(server: EngineServer) -> list[web.RouteDef]:
    source = EngineTokens(server)
    tokenizer = Tokenizer(server.served.tokenizer, server.served.path)

    async def completions(request: web.Request) -> web.StreamResponse:
        data = await read_json_object(request, server.max_body_bytes)
        return await handle(request, False, data, source, tokenizer)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        data = await read_json_object(request, server.max_body_bytes)
        return await handle(request, True, data, source, tokenizer)

    async def models(request: web.Request) -> web.Response:
        served = server.served
        card = {
            "id": served.path,
            "object": "model",
            "created": STARTED_AT,
            "owned_by": "rollflow",
            "root": served.path,
            "max_model_len": served.max_context_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def server_info(request: web.Request) -> web.Response:
        served, worker = server.served, server.worker
        return web.json_response(
            {
                "model_path": served.path,
                "tokenizer_path": served.path,
                "served_model_name": served.path,
                "context_length": served.max_context_length,
                "vocab_size": served.vocab_size,
                "weight_version": worker.weight_version,
                "version": rollflow.__version__,
                "engine": "rollflow-builtin",
                "internal_states": [{"num_running_requests": worker.num_running, "paused": worker.paused}],
            }
        )

    async def flush_cache(request: web.Request) -> web.Response:
        await asyncio.wrap_future(server.worker.flush_prefix_cache())
        return web.json_response({"success": True, "message": "Cache flushed."})

    return [
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
        web.get("/v1/models", models),
        web.get("/get_server_info", server_info),
        web.post("/flush_cache", flush_cache),
    ]
