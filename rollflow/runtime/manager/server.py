"""The manager's HTTP API (aiohttp). Handlers validate, hand over to `RolloutManager`, and stream.

POST   /generate                  SGLang's /generate (input_ids or text), stream or not
POST   /batches                   prompts x n samples -> batch id (trainer API)
GET    /batches/{id}              counts by state
POST   /batches/{id}/next         next micro-batch: blocks until min_groups groups are done
POST   /batches/{id}/flush        whatever groups are done, now
GET    /batches/{id}/samples      NDJSON stream of samples, ?order=completion|submission
DELETE /batches/{id}              stop and forget a batch; its waiting /next (410) and sample
                                  streams (a last {"error": ...} line) end with a message
POST   /step_report               trainer's step time and bubble -> next local budget
GET    /step_report               number of steps reported and the last report (the autoscaler reads it)
POST   /workers                   register an engine            (bearer token if configured)
GET    /workers                   engines and their state
DELETE /workers/{id}              deregister; its samples resume elsewhere (token)
POST   /workers/{id}/update_weights  load weights from model_path or pull them from weights_url;
                                  held out of the pool meanwhile (token)
POST   /workers/{id}/release      drain (its samples resume elsewhere from their tokens), then the
                                  engine frees its memory and stays out of the pool (token)
POST   /workers/{id}/resume       wake a released engine, load the newest weights, rejoin (token)
POST   /release_memory_occupation release every healthy engine (sgl-router's fan-out) (token)
POST   /resume_memory_occupation  wake every released engine (token)
GET    /weight_versions           engine id -> weight version
GET    /metrics                   Prometheus
GET    /health
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rollflow.config import describe_validation_error
from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.http.auth import require_bearer
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.http.serve import GuardedRunner
from rollflow.runtime.manager import memory
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.packing import BatchDeleted
from rollflow.runtime.manager.protocol import (
    BatchBody,
    GenerateBody,
    NextMicroBatchBody,
    ResumeWorkerBody,
    SamplingBody,
    StepReportBody,
    UpdateWeightsBody,
    WorkerBody,
)
from rollflow.runtime.manager.samples import Sample, SampleState
from rollflow.runtime.manager.service import EngineUnavailable, RolloutManager, WeightUpdateNotSupported

log = logging.getLogger("rollflow.manager")
BodyT = TypeVar("BodyT", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MANAGER_KEY = web.AppKey("manager", RolloutManager)
TOKENIZER_KEY = web.AppKey("tokenizer", object)


class BadRequest(web.HTTPBadRequest):
    def __init__(self, message: str) -> None:
        super().__init__(text=json.dumps({"error": {"message": message}}), content_type="application/json")


def _not_found(message: str) -> web.HTTPNotFound:
    return web.HTTPNotFound(text=json.dumps({"error": {"message": message}}), content_type="application/json")


async def _parse(request: web.Request, model: type[BodyT]) -> BodyT:
    limit = int(request.app[MANAGER_KEY].config.max_body_mb * (1 << 20))

    def validate(data: dict) -> BodyT:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise BadRequest(describe_validation_error(model, exc, prefix="invalid request: ")) from None

    return await read_json_object(request, limit, validate)


def _sampling(body: SamplingBody, config: ManagerConfig) -> SamplingParams:
    if body.max_new_tokens > config.max_new_tokens_limit:
        raise BadRequest(
            f"sampling_params.max_new_tokens={body.max_new_tokens} exceeds this manager's limit "
            f"of {config.max_new_tokens_limit} (max_new_tokens_limit)"
        )
    return SamplingParams(
        max_new_tokens=body.max_new_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids),
        seed=body.sampling_seed,
    )


def _check_prompt(prompt: list[int], config: ManagerConfig, where: str) -> None:
    if len(prompt) > config.max_prompt_tokens:
        raise BadRequest(
            f"{where} has {len(prompt)} tokens, above max_prompt_tokens={config.max_prompt_tokens}"
        )


@web.middleware
async def _count_rejections(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPClientError as exc:
        request.app[MANAGER_KEY].metrics.requests_rejected.labels(str(exc.status)).inc()
        raise


def _protected(request: web.Request) -> bool:
    """Admin and trainer routes: engines, batches (trainer API) and step reports. `/generate`
    and the read-only routes (health, metrics, workers list, versions) stay open."""
    path, method = request.path, request.method
    if path.startswith("/workers"):
        return method in ("POST", "DELETE")
    if path.startswith("/batches") or path in ("/release_memory_occupation", "/resume_memory_occupation"):
        return True
    return path == "/step_report" and method == "POST"


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    if _protected(request):
        require_bearer(request, request.app[MANAGER_KEY].config.token)
    return await handler(request)


def _generate_payload(sample: Sample, return_logprob: bool, rid: str, tokenizer) -> dict:
    meta: dict = {
        "id": rid,
        "prompt_tokens": len(sample.prompt_ids),
        "completion_tokens": len(sample.output_ids),
        "finish_reason": None,
        "weight_version": sample.weight_version,
        "spans": [span.to_json() for span in sample.spans],
        "resumes": sample.resumes,
    }
    if sample.state == SampleState.FINISHED:
        meta["finish_reason"] = {"type": sample.finish_reason}
    elif sample.state == SampleState.FAILED:
        meta["finish_reason"] = {"type": "abort", "message": sample.error}
    if return_logprob:
        meta["output_token_logprobs"] = [
            [logprob, token, None]
            for logprob, token in zip(sample.output_logprobs, sample.output_ids, strict=True)
        ]
    text = tokenizer.decode(sample.output_ids) if tokenizer is not None else ""
    return {"text": text, "output_ids": list(sample.output_ids), "meta_info": meta}


async def generate(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER_KEY]
    tokenizer = request.app[TOKENIZER_KEY]
    body = await _parse(request, GenerateBody)
    if body.text is not None:
        if tokenizer is None:
            raise BadRequest(
                "text prompts need a tokenizer: start the manager with `tokenizer:` set, or send input_ids"
            )
        prompt = tokenizer.encode(body.text).ids
    else:
        prompt = body.input_ids
    _check_prompt(prompt, manager.config, "the prompt")
    sampling = _sampling(body.sampling_params, manager.config)
    sample = manager.submit_sample(prompt, sampling, body.allow_off_policy)
    rid = body.rid or sample.sample_id
    try:
        if not body.stream:
            while sample.state < SampleState.FINISHED:
                await manager.wait_for_update(sample)
            return web.json_response(_generate_payload(sample, body.return_logprob, rid, tokenizer))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent = 0
        while True:
            if len(sample.output_ids) > sent or sample.state >= SampleState.FINISHED:
                sent = len(sample.output_ids)
                payload = _generate_payload(sample, body.return_logprob, rid, tokenizer)
                await response.write(f"data: {json.dumps(payload)}\n\n".encode())
            if sample.state >= SampleState.FINISHED:
                break
            await manager.wait_for_update(sample)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    finally:
        manager.release(sample)


# ------------------------------------------------------------------------------ batches


def _batch(request: web.Request):
    manager = request.app[MANAGER_KEY]
    batch_id = request.match_info["batch_id"]
    batch = manager.batches.get(batch_id)
    if batch is None:
        raise _not_found(f"unknown batch id {batch_id!r}")
    return manager, batch


async def submit_batch(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await _parse(request, BatchBody)
    for index, prompt in enumerate(body.prompts):
        _check_prompt(prompt, manager.config, f"prompts[{index}]")
    batch = manager.submit_batch(
        body.prompts, body.n, _sampling(body.sampling_params, manager.config), body.allow_off_policy
    )
    return web.json_response(batch.status(), status=201)


async def batch_status(request: web.Request) -> web.Response:
    _, batch = _batch(request)
    return web.json_response(batch.status())


def _micro_batch_payload(manager: RolloutManager, batch, groups) -> dict:
    exhausted = batch.packer.exhausted
    if exhausted:
        manager.forget_batch(batch.batch_id)
    return {"groups": [[sample.to_json() for sample in group] for group in groups], "exhausted": exhausted}


async def next_micro_batch(request: web.Request) -> web.Response:
    manager, batch = _batch(request)
    body = await _parse(request, NextMicroBatchBody)
    try:
        groups = await batch.packer.next(body.min_groups, body.max_groups, body.timeout_s)
    except BatchDeleted as exc:
        raise web.HTTPGone(
            text=json.dumps({"error": {"message": str(exc)}}), content_type="application/json"
        ) from None
    return web.json_response(_micro_batch_payload(manager, batch, groups))


async def flush_batch(request: web.Request) -> web.Response:
    manager, batch = _batch(request)
    return web.json_response(_micro_batch_payload(manager, batch, batch.packer.flush()))


async def stream_samples(request: web.Request) -> web.StreamResponse:
    _, batch = _batch(request)
    order = request.query.get("order", "completion")
    if order not in ("completion", "submission"):
        raise BadRequest(f"order must be 'completion' or 'submission', got {order!r}")
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    pending = batch.samples
    sent = 0
    while True:
        changed = batch.changed()  # taken before reading: a change from here on wakes us
        if batch.deleted is not None:
            # the last line says why the stream ends short
            await response.write(json.dumps({"error": {"message": batch.deleted}}).encode() + b"\n")
            break
        if order == "completion":
            ready = batch.completed[sent:]
        else:
            ready = []
            for sample in pending[sent:]:
                if sample.state < SampleState.FINISHED:
                    break
                ready.append(sample)
        for sample in ready:
            await response.write(json.dumps(sample.to_json()).encode() + b"\n")
        sent += len(ready)
        if sent == len(pending):
            break
        await changed
    await response.write_eof()
    return response


async def delete_batch(request: web.Request) -> web.Response:
    manager, batch = _batch(request)
    manager.forget_batch(
        batch.batch_id, deleted=f"batch {batch.batch_id} was deleted (DELETE /batches/{batch.batch_id})"
    )
    return web.json_response({"deleted": batch.batch_id})


async def step_report(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await _parse(request, StepReportBody)
    if body.bubble_s > body.step_time_s:
        raise BadRequest(f"bubble_s ({body.bubble_s}) exceeds step_time_s ({body.step_time_s})")
    budget = manager.report_step(body.step_time_s, body.bubble_s, body.rollout_s)
    return web.json_response({"budget_s": budget})


async def last_step_report(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.json_response({"steps": manager.num_step_reports, "last": manager.last_step_report})


# ------------------------------------------------------------------------------ workers


def _engine_id(request: web.Request) -> int:
    raw = request.match_info["engine_id"]
    try:
        return int(raw)
    except ValueError:
        raise _not_found(f"unknown engine id {raw!r} (ids are integers; see GET /workers)") from None


async def add_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await _parse(request, WorkerBody)
    try:
        engine = await manager.add_engine(body.url, body.kind, body.engine_type, body.capacity, body.api_key)
    except EngineUnavailable as exc:
        raise BadRequest(str(exc)) from None
    return web.json_response(engine.to_json(), status=201)


async def list_workers(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.json_response({"workers": [engine.to_json() for engine in manager.registry.all()]})


async def delete_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = _engine_id(request)
    try:
        engine = await manager.remove_engine(engine_id)
    except KeyError:
        raise _not_found(f"unknown engine id {engine_id}") from None
    return web.json_response(engine.to_json())


async def update_worker_weights(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = _engine_id(request)
    body = await _parse(request, UpdateWeightsBody)
    try:
        engine = await manager.update_engine_weights(
            engine_id,
            body.weight_version,
            model_path=body.model_path,
            weights_url=body.weights_url,
            codec=body.codec,
        )
    except KeyError:
        raise _not_found(f"unknown or failed engine id {engine_id}") from None
    except WeightUpdateNotSupported as exc:
        raise web.HTTPConflict(
            text=json.dumps({"error": {"message": str(exc)}}), content_type="application/json"
        ) from None
    except EngineUnavailable as exc:
        raise web.HTTPBadGateway(
            text=json.dumps({"error": {"message": str(exc)}}), content_type="application/json"
        ) from None
    return web.json_response(engine.to_json())


def _json_error(cls: type[web.HTTPError], message: str) -> web.HTTPError:
    return cls(text=json.dumps({"error": {"message": message}}), content_type="application/json")


async def release_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = _engine_id(request)
    try:
        move = await memory.release_engine(manager, engine_id)
    except KeyError:
        raise _not_found(f"unknown engine id {engine_id}") from None
    except (memory.EngineNotReleasable, memory.EngineWontSleep) as exc:
        raise _json_error(web.HTTPConflict, str(exc)) from None
    except EngineUnavailable as exc:
        raise _json_error(web.HTTPBadGateway, str(exc)) from None
    return web.json_response(manager.registry.get(engine_id).to_json() | {"move": move.to_json()})


async def resume_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = _engine_id(request)
    body = await _parse(request, ResumeWorkerBody) if request.can_read_body else ResumeWorkerBody()
    try:
        move = await memory.resume_engine(manager, engine_id, _weight_source(body))
    except KeyError:
        raise _not_found(f"unknown engine id {engine_id}") from None
    except memory.EngineNotReleasable as exc:
        raise _json_error(web.HTTPConflict, str(exc)) from None
    except WeightUpdateNotSupported as exc:
        raise _json_error(web.HTTPConflict, str(exc)) from None
    except (EngineUnavailable, memory.WeightSourceUnavailable) as exc:
        raise _json_error(web.HTTPBadGateway, str(exc)) from None
    return web.json_response(manager.registry.get(engine_id).to_json() | {"move": move.to_json()})


def _weight_source(body: ResumeWorkerBody) -> memory.WeightSource | None:
    if body.model_path is None and body.weights_url is None:
        return None
    return memory.WeightSource(body.weight_version, body.model_path, body.weights_url, body.codec)


async def release_all(request: web.Request) -> web.Response:
    results = await memory.release_all(request.app[MANAGER_KEY])
    return _fan_out_answer(results)


async def resume_all(request: web.Request) -> web.Response:
    results = await memory.resume_all(request.app[MANAGER_KEY])
    return _fan_out_answer(results)


def _fan_out_answer(results: list) -> web.Response:
    errors = [r for r in results if isinstance(r, str)]
    return web.json_response(
        {
            "success": not errors,
            "message": "; ".join(errors),
            "moves": [r.to_json() for r in results if not isinstance(r, str)],
        }
    )


async def weight_versions(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.json_response({str(e.engine_id): e.weight_version for e in manager.registry.live()})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[MANAGER_KEY].metrics.render(), content_type="text/plain")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _load_tokenizer(path: str | None):
    if path is None:
        return None
    from pathlib import Path

    from tokenizers import Tokenizer

    file = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
    return Tokenizer.from_file(str(file))


def create_app(manager: RolloutManager) -> web.Application:
    limit = int(manager.config.max_body_mb * (1 << 20))
    app = web.Application(middlewares=[_count_rejections, _auth], client_max_size=limit)
    app[MANAGER_KEY] = manager
    app[TOKENIZER_KEY] = _load_tokenizer(manager.config.tokenizer)

    async def lifecycle(app: web.Application):
        await manager.start()
        yield
        await manager.close()

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(
        [
            web.post("/generate", generate),
            web.post("/batches", submit_batch),
            web.get("/batches/{batch_id}", batch_status),
            web.post("/batches/{batch_id}/next", next_micro_batch),
            web.post("/batches/{batch_id}/flush", flush_batch),
            web.get("/batches/{batch_id}/samples", stream_samples),
            web.delete("/batches/{batch_id}", delete_batch),
            web.post("/step_report", step_report),
            web.get("/step_report", last_step_report),
            web.post("/workers", add_worker),
            web.get("/workers", list_workers),
            web.delete("/workers/{engine_id}", delete_worker),
            web.post("/workers/{engine_id}/update_weights", update_worker_weights),
            web.post("/workers/{engine_id}/release", release_worker),
            web.post("/workers/{engine_id}/resume", resume_worker),
            web.post("/release_memory_occupation", release_all),
            web.post("/resume_memory_occupation", resume_all),
            web.get("/weight_versions", weight_versions),
            web.get("/metrics", metrics),
            web.get("/health", health),
        ]
    )
    return app


async def serve(config: ManagerConfig, ready: asyncio.Event | None = None) -> None:
    """Run the manager until cancelled; `ready` is set once it listens."""
    app = create_app(RolloutManager(config))
    runner = GuardedRunner(app, config.read_timeout_s, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    log.info("rollflow manager listening on http://%s:%d", config.host, config.port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
