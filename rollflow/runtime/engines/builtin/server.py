"""HTTP front of the built-in engine: the part of SGLang's native API that rollflow's manager uses.

    POST /generate                    SGLang body; JSON answer, or SSE `data: {...}` ... `data: [DONE]`;
                                      a batch (a list of input_ids or text) answers a list
    POST /abort_request               {"rid": ...} or {"abort_all": true}
    GET  /health, /health_generate    200 when alive / when a one-token generation succeeds
    GET  /v1/loads, /get_load         SGLang's load reports: requests running and waiting, tokens held
    GET  /get_model_info, /get_weight_version
    POST /pause_generation {"mode": "abort"|"in_place"|"retract"}, POST /continue_generation
    POST /v1/completions, /v1/chat/completions, GET /v1/models, GET /get_server_info, POST /flush_cache
                                      (openai_routes.py)
    POST /update_weights_from_{disk,safetensors,server}, /release_memory_occupation,
         /resume_memory_occupation, GET /is_sleeping   (weight_routes.py)

With an api key (`--api-key`, as SGLang's), every route but /health needs
`Authorization: Bearer KEY`. Handlers validate, hand the work to the generation thread and relay its events. A client that
disconnects aborts its request (the server runs with handler cancellation on).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rollflow.runtime.engines.builtin.edge import ERRORS_AS_JSON, parse, require_memory, validate
from rollflow.runtime.engines.builtin.openai_routes import openai_routes
from rollflow.runtime.engines.builtin.tensor_parallel import RankGroup
from rollflow.runtime.engines.builtin.weight_routes import EngineWeights
from rollflow.runtime.engines.builtin.worker import GenerationWorker, Sequence, TokenEvent
from rollflow.runtime.engines.load import sglang_get_load_body, sglang_loads_body
from rollflow.runtime.http.auth import bearer_middleware
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.http.errors import BadRequest, error_response
from rollflow.runtime.http.sse import close_sse, open_sse, send_event
from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.builtin import PauseBody
from rollflow.runtime.wire.sglang import AbortBody, GenerateBody, split_batch

logger = logging.getLogger(__name__)

HEALTH_GENERATE_TIMEOUT_S = 20.0
MAX_BODY_BYTES = 64 << 20
"""Default limit of a JSON request (a 128k-token prompt is about 1 MB)."""


@dataclass
class _Output:
    """What one request has produced so far, in the order the generation thread made it."""

    rid: str
    num_prompt_tokens: int
    started_at: float
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_version: int | None = None
    finish_reason: dict[str, Any] | None = None
    cached_tokens: int = 0

    def add(self, event: TokenEvent) -> None:
        if event.token_id is not None:
            self.output_ids.append(event.token_id)
            self.logprobs.append(event.logprob)
        self.weight_version = event.weight_version
        self.cached_tokens = max(self.cached_tokens, event.cached_tokens)
        self.finish_reason = event.finish_reason


@dataclass(frozen=True)
class ServedModel:
    """The model folder the engine was started on and what the server needs to know about it."""

    path: str
    tokenizer: Any
    vocab_size: int
    max_context_length: int


class EngineServer:
    """Routes HTTP requests to one GenerationWorker."""

    def __init__(
        self,
        served: ServedModel,
        worker: GenerationWorker,
        weights: EngineWeights,
        incremental_streaming_output: bool = False,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        tp: RankGroup | None = None,
    ) -> None:
        """`weights` serves the weight and memory routes; `tp` is the group of tensor-parallel
        ranks rank 0 drives, None with one rank."""
        self._served = served
        self._worker = worker
        self._weights = weights
        self._tp = tp
        self._incremental = incremental_streaming_output
        self._active_rids: set[str] = set()
        self._api_key = api_key
        self._max_body = max_body_bytes

    @property
    def served(self) -> ServedModel:
        return self._served

    @property
    def worker(self) -> GenerationWorker:
        return self._worker

    @property
    def max_body_bytes(self) -> int:
        return self._max_body

    def build_app(self) -> web.Application:
        auth = bearer_middleware(self._api_key, lambda request: request.path != "/health", "this engine")
        app = web.Application(
            client_max_size=max(self._max_body, self._weights.max_upload_bytes),
            middlewares=[auth, ERRORS_AS_JSON],
        )
        app.add_routes(
            [
                web.post("/generate", self.generate),
                web.post("/abort_request", self.abort_request),
                web.get("/health", self.health),
                web.get("/health_generate", self.health_generate),
                web.get("/get_model_info", self.get_model_info),
                web.get("/get_weight_version", self.get_weight_version),
                web.get("/v1/loads", self.loads),
                web.get("/get_load", self.get_load),
                web.post("/pause_generation", self.pause_generation),
                web.post("/continue_generation", self.continue_generation),
                *openai_routes(self),
                *self._weights.routes(),
            ]
        )
        return app

    # ---- generation --------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        items = await _parse_generate(request, self._max_body)
        require_memory(self._worker.released)
        if isinstance(items, list):
            prompts = [self._prompt_ids(item) for item in items]  # every prompt checked before any runs
            answers = await asyncio.gather(*map(self._generate_one, items, prompts))
            return web.json_response(answers)
        body = items
        input_ids = self._prompt_ids(body)
        rid = self._claim_rid(body)
        events, out = self._start(rid, input_ids, body)
        try:
            if body.stream:
                return await self._stream(request, body, events, out)
            return web.json_response(await self._collect(body, events, out))
        finally:
            self._end(out)

    async def _generate_one(self, body: GenerateBody, input_ids: list[int]) -> dict[str, Any]:
        """One prompt of a batch, answered as a whole."""
        events, out = self._start(self._claim_rid(body), input_ids, body)
        try:
            return await self._collect(body, events, out)
        finally:
            self._end(out)

    def _claim_rid(self, body: GenerateBody) -> str:
        rid = body.rid or uuid.uuid4().hex
        if rid in self._active_rids:
            raise BadRequest(f"rid {rid!r} is already in use by a running request")
        return rid

    async def _collect(self, body: GenerateBody, events: asyncio.Queue, out: _Output) -> dict[str, Any]:
        while out.finish_reason is None:
            out.add(await events.get())
        if out.finish_reason.get("status_code", 200) >= 400:  # the request failed on its own input
            raise BadRequest(out.finish_reason["message"])
        return self._response(body, out, 0)

    def _end(self, out: _Output) -> None:
        if out.finish_reason is None:
            self._worker.abort(out.rid, "client disconnected")
        self._active_rids.discard(out.rid)

    def _prompt_ids(self, body: GenerateBody) -> list[int]:
        if body.input_ids is not None:
            ids = body.input_ids
            bad = next((i for i in ids if not 0 <= i < self._served.vocab_size), None)
            if bad is not None:
                raise BadRequest(
                    f"input_ids holds {bad}, outside the vocabulary [0, {self._served.vocab_size})"
                )
        else:
            ids = self._served.tokenizer.encode(body.text, add_special_tokens=False)
        sampling = body.sampling_params
        bad = next((i for i in sampling.stop_token_ids or () if not 0 <= i < self._served.vocab_size), None)
        if bad is not None:
            raise BadRequest(
                f"stop_token_ids holds {bad}, outside the vocabulary [0, {self._served.vocab_size})"
            )
        total = len(ids) + sampling.max_new_tokens
        if total > self._served.max_context_length:
            raise BadRequest(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({sampling.max_new_tokens}) = {total} exceeds "
                f"the model's context length {self._served.max_context_length}"
            )
        return list(ids)

    def _start(self, rid: str, input_ids: list[int], body: GenerateBody) -> tuple[asyncio.Queue, _Output]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        seq = Sequence(
            rid=rid,
            token_ids=input_ids,
            sampling=body.sampling_params.to_params(),
            emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        )
        self._active_rids.add(rid)
        self._worker.submit(seq)
        return events, _Output(rid, len(input_ids), time.perf_counter())

    async def _stream(
        self, request: web.Request, body: GenerateBody, events: asyncio.Queue, out: _Output
    ) -> web.StreamResponse:
        response = await open_sse(request)
        sent = 0
        while out.finish_reason is None:
            # Everything that arrived since the last write goes out together, split where the
            # weight version changes so each chunk names the version that made its tokens.
            batch = [await events.get()]
            while not events.empty():
                batch.append(events.get_nowait())
            for event in batch:
                if (
                    out.output_ids
                    and event.weight_version != out.weight_version
                    and sent < len(out.output_ids)
                ):
                    await send_event(response, self._response(body, out, sent))
                    sent = len(out.output_ids)
                out.add(event)
            await send_event(response, self._response(body, out, sent))
            sent = len(out.output_ids)
        return await close_sse(response)

    def _response(self, body: GenerateBody, out: _Output, sent: int) -> dict[str, Any]:
        """SGLang's answer: cumulative output, or only tokens after `sent` with incremental streaming."""
        start = sent if (body.stream and self._incremental) else 0
        ids = out.output_ids[start:]
        params = body.sampling_params.to_params()
        text = self._text(out.output_ids, params)
        matched = (out.finish_reason or {}).get("matched")
        if isinstance(matched, str) and not params.no_stop_trim and matched in text:
            text = text[: text.index(matched)]  # SGLang leaves the stop string out of the text
        if start:
            text = text[len(self._text(out.output_ids[:start], params)) :]
        meta: dict[str, Any] = {
            "id": out.rid,
            "finish_reason": out.finish_reason,
            "prompt_tokens": out.num_prompt_tokens,
            "completion_tokens": len(out.output_ids),
            "cached_tokens": out.cached_tokens,
            "weight_version": out.weight_version,
            "e2e_latency": time.perf_counter() - out.started_at,
        }
        if body.return_logprob:
            tokenizer = self._served.tokenizer
            meta["output_token_logprobs"] = [
                [lp, tid, tokenizer.decode([tid]) if body.return_text_in_logprobs else None]
                for lp, tid in zip(out.logprobs[start:], ids, strict=True)
            ]
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _text(self, token_ids: list[int], params: SamplingParams) -> str:
        return decode_text(self._served.tokenizer, token_ids, params)

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await parse(request, AbortBody, self._max_body)
        if body.abort_all:
            self._worker.abort_all()
        elif body.rid:
            self._worker.abort(body.rid)
        else:
            raise BadRequest("give rid, or abort_all: true")
        return web.json_response({"success": True})

    # ---- health and info ----------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if not self._worker.is_alive():
            return error_response(503, "generation thread died")
        fault = self._tp.fault() if self._tp is not None else None
        if fault is not None:
            return error_response(503, fault)
        return web.Response(text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        body = GenerateBody(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
        rid = f"health-{uuid.uuid4().hex}"
        events, out = self._start(rid, [0], body)
        try:
            async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
                while out.finish_reason is None:
                    out.add(await events.get())
        except TimeoutError:
            return error_response(503, "no token within the health timeout")
        finally:
            if out.finish_reason is None:
                self._worker.abort(rid)
            self._active_rids.discard(rid)
        if out.finish_reason["type"] == "abort" or not out.output_ids:
            return error_response(503, str(out.finish_reason.get("message")))
        return web.Response(text="")

    async def get_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self._served.path,
                "tokenizer_path": self._served.path,
                "is_generation": True,
                "weight_version": self._worker.weight_version,
                "vocab_size": self._served.vocab_size,
                "max_context_length": self._served.max_context_length,
                "num_running_requests": self._worker.num_running,
                "tp_size": self._tp.tp_size if self._tp is not None else 1,
                # rollflow's own: the processes of ranks 1..N-1
                "tp_pids": self._tp.pids if self._tp is not None else [],
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self._worker.weight_version})

    # ---- load ---------------------------------------------------------------------------------
    def load_report(self) -> tuple[int, int, int, int]:
        """(running, waiting, KV tokens in use, KV token capacity): what SGLang's load routes report.
        The capacity is what the running places can hold at full context length."""
        running, waiting, kv_tokens = self._worker.load()
        return (
            running,
            waiting,
            kv_tokens,
            self._worker.max_running_requests * self._served.max_context_length,
        )

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's `/v1/loads`: one data-parallel rank, with its prefix cache's hit rate (prompt
        tokens served from the cache over those looked up) and, rollflow's own, the prompt tokens
        its prefills computed."""
        body = sglang_loads_body(*self.load_report())
        looked_up, hits, computed = self._worker.cache_stats()
        body["loads"][0] |= {
            "cache_hit_rate": round(hits / looked_up, 6) if looked_up else 0.0,
            "prefill_tokens_computed": computed,
        }
        return web.json_response(body)

    async def get_load(self, request: web.Request) -> web.Response:
        """SGLang's older `/get_load`."""
        return web.json_response(sglang_get_load_body(*self.load_report()[:3]))

    # ---- pausing ---------------------------------------------------------------------------------
    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await parse(request, PauseBody, self._max_body, allow_empty=True)
        await asyncio.wrap_future(self._worker.pause(body.mode))
        return web.json_response({"success": True})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await asyncio.wrap_future(self._worker.resume())
        return web.json_response({"success": True})


async def _parse_generate(request: web.Request, limit: int) -> GenerateBody | list[GenerateBody]:
    """One `/generate` body, or the per-prompt bodies of a batched one."""

    def check(data: dict[str, Any]) -> GenerateBody | list[GenerateBody]:
        try:
            items = split_batch(data)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if items is None:
            return validate(GenerateBody, data)
        return [validate(GenerateBody, item) for item in items]

    return await read_json_object(request, limit, check)


def decode_text(tokenizer: Any, token_ids: list[int], params: SamplingParams) -> str:
    """Token ids as text, decoded as the request asked (special tokens, spaces between them)."""
    return tokenizer.decode(
        token_ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
