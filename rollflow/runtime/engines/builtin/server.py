"""HTTP front of the built-in engine: the part of SGLang's native API that rollflow's manager uses.

    POST /generate                    SGLang body; JSON answer, or SSE `data: {...}` ... `data: [DONE]`
    POST /abort_request               {"rid": ...} or {"abort_all": true}
    GET  /health, /health_generate    200 when alive / when a one-token generation succeeds
    GET  /get_model_info, /get_weight_version
    POST /update_weights_from_disk    {"model_path", "weight_version", "abort_all_requests"}
    POST /update_weights_from_safetensors?weight_version=N   body: safetensors bytes (all or some tensors)
    POST /update_weights_from_server  {"url", "weight_version", "codec"}: pull from a weight server (rollflow)
    POST /pause_generation {"mode": "abort"|"in_place"|"retract"}, POST /continue_generation
    POST /release_memory_occupation {"tags": [...]|null}: abort running requests, drop the model and
                                      its caches (the process stays up and answers /health)
    POST /resume_memory_occupation  {"tags": [...]|null}: rebuild the model at the version it served
    GET  /is_sleeping               {"is_sleeping", "released_tags", "weights_bytes", "cached_sequences"}

With an api key (`--api-key`, as SGLang's), every route but /health needs
`Authorization: Bearer KEY`. Handlers validate, hand the work to the generation thread and relay its events. A client that
disconnects aborts its request (the server runs with handler cancellation on).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rollflow.errors import UserError
from rollflow.runtime.engines.builtin.io import (
    AbortBody,
    GenerateBody,
    MemoryOccupationBody,
    PauseBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightsFromServerBody,
)
from rollflow.runtime.engines.builtin.sampling import SamplingOptions
from rollflow.runtime.engines.builtin.weights import (
    WeightChecker,
    read_safetensors_bytes,
    read_safetensors_path,
)
from rollflow.runtime.engines.builtin.worker import GenerationWorker, Sequence, TokenEvent
from rollflow.runtime.http.auth import bearer_middleware
from rollflow.runtime.http.body import read_body, read_json_object
from rollflow.runtime.weights import (
    LoadedWeights,
    UnknownVersionError,
    WeightPuller,
    WeightsError,
    WeightTransferError,
)

logger = logging.getLogger(__name__)
ModelT = TypeVar("ModelT", bound=BaseModel)

HEALTH_GENERATE_TIMEOUT_S = 20.0
MAX_BODY_BYTES = 64 << 20
"""Default limit of a JSON request (a 128k-token prompt is about 1 MB)."""
WEIGHTS_BODY_HEADROOM = 16 << 20
"""Safetensors header room above the served model's tensor bytes, for the weights upload route."""


class BadRequest(Exception):
    """Input that gets a 400 with this message."""


class MemoryReleased(Exception):
    """A request that needs the model while its memory is released: a 503 (come back later)."""


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

    def add(self, event: TokenEvent) -> None:
        if event.token_id is not None:
            self.output_ids.append(event.token_id)
            self.logprobs.append(event.logprob)
        self.weight_version = event.weight_version
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
        checker: WeightChecker,
        pull_cache_dir: str | Path,
        incremental_streaming_output: bool = False,
        pulled: LoadedWeights | None = None,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_weights_body_bytes: int | None = None,
    ) -> None:
        """`pull_cache_dir` keeps partial pulls (resumed by the next pull); `pulled` is the
        version the served weights are, exactly as published, when the model folder came from a
        pull: the base of the next delta."""
        self._served = served
        self._worker = worker
        self._checker = checker
        self._incremental = incremental_streaming_output
        self._active_rids: set[str] = set()
        self._weights_lock = asyncio.Lock()
        self._pull_lock = asyncio.Lock()
        self._pull_cache_dir = Path(pull_cache_dir)
        # the loaded weights as published (the delta base); None once anything else was loaded
        self._pulled = pulled
        self._api_key = api_key
        self._max_body = max_body_bytes
        # the largest valid upload is every tensor of the served model
        self._max_weights_body = max_weights_body_bytes or checker.max_upload_bytes + WEIGHTS_BODY_HEADROOM

    def build_app(self) -> web.Application:
        auth = bearer_middleware(self._api_key, lambda request: request.path != "/health", "this engine")
        app = web.Application(
            client_max_size=max(self._max_body, self._max_weights_body), middlewares=[auth, _errors_as_json]
        )
        app.add_routes(
            [
                web.post("/generate", self.generate),
                web.post("/abort_request", self.abort_request),
                web.get("/health", self.health),
                web.get("/health_generate", self.health_generate),
                web.get("/get_model_info", self.get_model_info),
                web.get("/get_weight_version", self.get_weight_version),
                web.post("/update_weights_from_disk", self.update_weights_from_disk),
                web.post("/update_weights_from_safetensors", self.update_weights_from_safetensors),
                web.post("/update_weights_from_server", self.update_weights_from_server),
                web.post("/pause_generation", self.pause_generation),
                web.post("/continue_generation", self.continue_generation),
                web.post("/release_memory_occupation", self.release_memory_occupation),
                web.post("/resume_memory_occupation", self.resume_memory_occupation),
                web.get("/is_sleeping", self.is_sleeping),
            ]
        )
        return app

    # ---- generation --------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await _parse(request, GenerateBody, self._max_body)
        self._require_memory()
        input_ids = self._prompt_ids(body)
        rid = body.rid or uuid.uuid4().hex
        if rid in self._active_rids:
            raise BadRequest(f"rid {rid!r} is already in use by a running request")
        events, out = self._start(rid, input_ids, body)
        try:
            if body.stream:
                return await self._stream(request, body, events, out)
            while out.finish_reason is None:
                out.add(await events.get())
            if out.finish_reason.get("status_code", 200) >= 400:  # the request failed on its own input
                raise BadRequest(out.finish_reason["message"])
            return web.json_response(self._response(body, out, 0))
        finally:
            if out.finish_reason is None:
                self._worker.abort(rid, "client disconnected")
            self._active_rids.discard(rid)

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
        bad = next((i for i in sampling.stop_token_ids if not 0 <= i < self._served.vocab_size), None)
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
        params = body.sampling_params
        options = SamplingOptions(
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            ignore_eos=params.ignore_eos,
            stop_token_ids=frozenset(params.stop_token_ids),
            seed=params.sampling_seed,
        )
        seq = Sequence(
            rid=rid,
            token_ids=input_ids,
            sampling=options,
            emit=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        )
        self._active_rids.add(rid)
        self._worker.submit(seq)
        return events, _Output(rid, len(input_ids), time.perf_counter())

    async def _stream(
        self, request: web.Request, body: GenerateBody, events: asyncio.Queue, out: _Output
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
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
                    await _send(response, self._response(body, out, sent))
                    sent = len(out.output_ids)
                out.add(event)
            await _send(response, self._response(body, out, sent))
            sent = len(out.output_ids)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _response(self, body: GenerateBody, out: _Output, sent: int) -> dict[str, Any]:
        """SGLang's answer: cumulative output, or only tokens after `sent` with incremental streaming."""
        start = sent if (body.stream and self._incremental) else 0
        ids = out.output_ids[start:]
        skip = body.sampling_params.skip_special_tokens
        text = self._served.tokenizer.decode(out.output_ids, skip_special_tokens=skip)
        if start:
            text = text[
                len(self._served.tokenizer.decode(out.output_ids[:start], skip_special_tokens=skip)) :
            ]
        meta: dict[str, Any] = {
            "id": out.rid,
            "finish_reason": out.finish_reason,
            "prompt_tokens": out.num_prompt_tokens,
            "completion_tokens": len(out.output_ids),
            "cached_tokens": 0,
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

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _parse(request, AbortBody, self._max_body)
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
            return web.json_response({"error": {"message": "generation thread died"}}, status=503)
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
            return web.json_response({"error": {"message": "no token within the health timeout"}}, status=503)
        finally:
            if out.finish_reason is None:
                self._worker.abort(rid)
            self._active_rids.discard(rid)
        if out.finish_reason["type"] == "abort" or not out.output_ids:
            return web.json_response({"error": {"message": out.finish_reason.get("message")}}, status=503)
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
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self._worker.weight_version})

    # ---- weights and pausing ------------------------------------------------------------------
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _parse(request, UpdateWeightsFromDiskBody, self._max_body)
        tensors = await asyncio.to_thread(read_safetensors_path, body.model_path)
        return web.json_response(
            await self._load(tensors, body.weight_version, full=True, abort=body.abort_all_requests)
        )

    async def update_weights_from_safetensors(self, request: web.Request) -> web.Response:
        version_text = request.query.get("weight_version")
        try:
            version = None if version_text is None else int(version_text)
        except ValueError:
            raise BadRequest(f"weight_version must be an integer, got {version_text!r}") from None
        if version is not None and version < 0:
            raise BadRequest(f"weight_version must be >= 0, got {version}")
        tensors = read_safetensors_bytes(await read_body(request, self._max_weights_body))
        abort = request.query.get("abort_all_requests") == "true"
        return web.json_response(await self._load(tensors, version, full=False, abort=abort))

    async def update_weights_from_server(self, request: web.Request) -> web.Response:
        """Pull a version (a delta against the last pulled one when the codec says so), verify
        all of it, then load it like a full checkpoint; a failed pull leaves the weights alone."""
        body = await _parse(request, UpdateWeightsFromServerBody, self._max_body)
        async with self._pull_lock:
            base = self._pulled
            try:
                async with WeightPuller(body.url, self._pull_cache_dir) as puller:
                    result = await puller.pull(body.weight_version, body.codec, base=base)
            except WeightsError as exc:
                status = 404 if isinstance(exc, UnknownVersionError) else 400
                status = 502 if isinstance(exc, WeightTransferError) else status
                message = f"pulling weight version {body.weight_version} from {body.url} failed: {exc}"
                logger.warning("%s", message)
                return web.json_response({"error": {"message": message}, "success": False}, status=status)
            answer = await self._load(
                result.weights.state_dict, body.weight_version, full=True, abort=False, pulled=result.weights
            )
        stats = result.stats
        logger.info(
            "pulled version %d (%s, base %s): %d bytes for %d bytes of weights, %d attempts",
            body.weight_version,
            result.manifest.codec,
            result.manifest.base_version,
            stats.wire_nbytes,
            result.manifest.model_nbytes,
            stats.attempts,
        )
        answer["pull"] = {
            "codec": result.manifest.codec,
            "base_version": result.manifest.base_version,
            "wire_nbytes": stats.wire_nbytes,
            "model_nbytes": result.manifest.model_nbytes,
            "chunks_downloaded": stats.chunks_downloaded,
            "chunks_reused": stats.chunks_reused,
            "attempts": stats.attempts,
            "fallback_reason": stats.fallback_reason,
        }
        return web.json_response(answer)

    async def _load(
        self, tensors: dict, version: int | None, full: bool, abort: bool, pulled: LoadedWeights | None = None
    ) -> dict[str, Any]:
        checked = await asyncio.to_thread(self._checker.check, tensors, full)
        async with self._weights_lock:
            self._require_memory()
            new_version = self._worker.weight_version + 1 if version is None else version
            if abort:
                self._worker.abort_all("aborted for a weight update")
            await asyncio.wrap_future(self._worker.load_weights(checked, new_version))
            self._pulled = pulled
        return {"success": True, "message": f"loaded {len(checked)} tensors", "weight_version": new_version}

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await _parse(request, PauseBody, self._max_body, allow_empty=True)
        await asyncio.wrap_future(self._worker.pause(body.mode))
        return web.json_response({"success": True})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await asyncio.wrap_future(self._worker.resume())
        return web.json_response({"success": True})

    # ---- memory occupation ---------------------------------------------------------------------
    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        body = await _parse(request, MemoryOccupationBody, self._max_body, allow_empty=True)
        if not self._worker.can_release:
            raise BadRequest("this engine cannot release its memory (it has no model folder to reload from)")
        tags = _memory_tags(body)
        async with self._weights_lock:
            await asyncio.wrap_future(self._worker.release_memory(tags, self._backup_path))
            if "weights" in tags:
                self._pulled = None  # the delta base is a copy of the weights: it goes too
        return web.json_response({"success": True, "message": f"released {', '.join(sorted(tags))}"})

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        body = await _parse(request, MemoryOccupationBody, self._max_body, allow_empty=True)
        tags = _memory_tags(body)
        async with self._weights_lock:
            await asyncio.wrap_future(self._worker.resume_memory(tags, self._backup_path))
        return web.json_response(
            {
                "success": True,
                "message": f"resumed {', '.join(sorted(tags))}",
                "weight_version": self._worker.weight_version,
            }
        )

    async def is_sleeping(self, request: web.Request) -> web.Response:
        released = self._worker.released
        return web.json_response(
            {
                "is_sleeping": bool(released),
                "released_tags": sorted(released),
                "weights_bytes": self._worker.weights_bytes(),
                "cached_sequences": self._worker.num_cached_sequences(),
            }
        )

    @property
    def _backup_path(self) -> Path:
        return self._pull_cache_dir / "released-weights.safetensors"

    def _require_memory(self) -> None:
        if self._worker.released:
            raise MemoryReleased(
                "the engine has released its memory; POST /resume_memory_occupation before using it"
            )


def _memory_tags(body: MemoryOccupationBody) -> frozenset[str]:
    tags = frozenset(body.tags) if body.tags is not None else frozenset({"weights", "kv_cache"})
    return tags - {"cuda_graph"}


async def _parse(request: web.Request, model: type[ModelT], limit: int, allow_empty: bool = False) -> ModelT:
    """The validated body; bad bytes (rollflow.runtime.http.body) and bad fields are a 400."""

    def validate(data: dict[str, Any]) -> ModelT:
        if not data and allow_empty:
            return model()
        if (
            isinstance(data.get("input_ids"), list)
            and data["input_ids"]
            and isinstance(data["input_ids"][0], list)
        ):
            raise BadRequest("batched input_ids are not supported: send one request per sample")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise BadRequest(_describe(exc)) from None

    return await read_json_object(request, limit, validate)


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except (BadRequest, UserError) as exc:
        return web.json_response({"error": {"message": str(exc)}, "success": False}, status=400)
    except MemoryReleased as exc:
        return web.json_response({"error": {"message": str(exc)}, "success": False}, status=503)
