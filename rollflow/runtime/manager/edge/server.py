"""The manager's HTTP API (aiohttp). Handlers validate, hand over to `RolloutManager`, and stream.

SGLang's and sgl-router's routes (`sglang_api`, `workers_api`):
POST   /generate, /abort_request; GET /v1/loads, /get_load
POST   /workers, GET /workers, DELETE /workers/{id}, POST /add_worker, /remove_worker, GET /list_workers

rollflow's trainer and admin routes (here):
POST   /batches                   prompts x n samples -> batch id (trainer API)
GET    /batches/{id}              counts by state
POST   /batches/{id}/next         next micro-batch: blocks until min_groups groups are done
POST   /batches/{id}/flush        whatever groups are done, now
GET    /batches/{id}/samples      NDJSON stream of samples, ?order=completion|submission; ?after=N
                                  (or Last-Event-ID: N) starts after the N lines seen already
DELETE /batches/{id}              stop and forget a batch; its waiting /next (410) and sample
                                  streams (a last {"error": ...} line) end with a message; a
                                  /next or stream asked for after it gets the 410
POST   /step_report               trainer's step time and bubble -> next local budget
GET    /step_report               number of steps reported and the last report (the autoscaler reads it)
POST   /workers/{id}/update_weights  load weights from model_path or pull them from weights_url;
                                  held out of the pool meanwhile (token)
POST   /workers/{id}/release      drain (its samples resume elsewhere from their tokens), then the
                                  engine frees its memory and stays out of the pool (token)
POST   /workers/{id}/resume       wake a released engine, load the newest weights, rejoin (token)
POST   /release_memory_occupation release every healthy engine (sgl-router's fan-out) (token)
POST   /resume_memory_occupation  wake every released engine (token)
GET    /weight_versions           engine id -> weight version
GET    /metrics                   Prometheus
GET    /health                    200 {"status": "ok"}; 503 naming the journal's error while it
                                  cannot write (new batches and sessions are refused with it too)
POST   /v1/completions, /v1/chat/completions    OpenAI's, one manager sample each (openai_routes.py)
POST   /v1/sessions, /v1/sessions/{id}/turns; GET, DELETE /v1/sessions/{id} (token): multi-turn
                                  sessions that keep their engine (sessions_api.py)
GET    /get_model_info, /get_server_info, /v1/models, /health_generate; POST /flush_cache,
       /pause_generation, /continue_generation, /update_weights_from_disk: to every engine
                                  (passthrough.py; the POSTs need the token)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from rollflow.runtime.http import answer
from rollflow.runtime.http.auth import require_bearer
from rollflow.runtime.http.errors import BadRequest, error_body, http_error
from rollflow.runtime.http.listen import bind
from rollflow.runtime.long_lived import settle
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core import memory
from rollflow.runtime.manager.core.fleet import EngineUnavailable, WeightUpdateNotSupported
from rollflow.runtime.manager.core.packing import BatchDeleted
from rollflow.runtime.manager.core.samples import SampleState
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.manager.edge import (
    generate_io,
    sessions_api,
    sglang_api,
    vllm_api,
    vllm_control,
    workers_api,
)
from rollflow.runtime.manager.edge.lean import LeanRunner
from rollflow.runtime.manager.edge.openai_routes import openai_routes
from rollflow.runtime.manager.edge.passthrough import ADMIN_PATHS, passthrough_routes
from rollflow.runtime.manager.edge.protocol import (
    BatchBody,
    NextMicroBatchBody,
    ResumeWorkerBody,
    StepReportBody,
    UpdateWeightsBody,
)
from rollflow.runtime.manager.edge.shared import (
    MANAGER_KEY,
    TOKENIZER_KEY,
    journal_writable,
    not_found,
    parse_body,
)

__all__ = ["MANAGER_KEY", "TOKENIZER_KEY", "create_app", "serve"]

log = logging.getLogger("rollflow.manager")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
routes = web.RouteTableDef()


@web.middleware
async def _edge(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token on admin and trainer routes, and every 4xx counted (one middleware: each layer
    costs every request a coroutine)."""
    try:
        if _protected(request):
            require_bearer(request, request.app[MANAGER_KEY].config.token)
        return await handler(request)
    except web.HTTPClientError as exc:
        request.app[MANAGER_KEY].metrics.requests_rejected.labels(str(exc.status)).inc()
        raise


def _protected(request: web.Request) -> bool:
    """Admin and trainer routes: engines, batches (trainer API), step reports, and reading or
    closing a session (sessions_api.py says why). `/generate`, a session's turns and the read-only
    routes (health, metrics, workers list, versions) stay open."""
    path, method = request.path, request.method
    if workers_api.is_admin(path, method):
        return True
    if path.startswith("/batches") or path in ADMIN_PATHS or path in memory.ADMIN_PATHS:
        return True
    if path in vllm_control.ADMIN_PATHS:
        return True
    if path.startswith("/v1/sessions/") and method in ("GET", "DELETE"):
        return True
    return (path == "/step_report" and method == "POST") or path == "/close_session"


# ------------------------------------------------------------------------------ batches


def _batch(request: web.Request):
    manager = request.app[MANAGER_KEY]
    batch_id = request.match_info["batch_id"]
    batch = manager.batches.get(batch_id)
    if batch is None:
        raise not_found(f"unknown batch id {batch_id!r}")
    return manager, batch


def _consumed_batch(request: web.Request):
    """The batch a consumer waits on (`/next`, its sample stream): 410 with the deletion's message
    for a batch deleted a moment before, as a consumer already waiting is answered, so a DELETE
    that races the trainer's own next call reads the same; 404 for an id never known."""
    manager = request.app[MANAGER_KEY]
    deleted = manager.batches.why_deleted(request.match_info["batch_id"])
    if deleted is not None:
        raise http_error(web.HTTPGone, deleted)
    return _batch(request)


@routes.post("/batches")
async def submit_batch(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await parse_body(request, BatchBody)
    for index, prompt in enumerate(body.prompts):
        generate_io.check_prompt(prompt, manager.config, f"prompts[{index}]")
    known = manager.batches.get(body.batch_id)
    if known is not None:  # a retried submission: the batch it made already
        return web.json_response(known.status())
    journal_writable(manager)
    batch = manager.submit_batch(
        body.prompts,
        body.n,
        generate_io.sampling_params(body.sampling_params, manager.config),
        body.allow_off_policy,
        batch_id=body.batch_id,
    )
    return web.json_response(batch.status(), status=201)


@routes.get("/batches/{batch_id}")
async def batch_status(request: web.Request) -> web.Response:
    _, batch = _batch(request)
    return web.json_response(batch.status())


def _micro_batch_payload(manager: RolloutManager, batch, groups) -> dict:
    exhausted = batch.packer.exhausted
    if exhausted:
        manager.forget_batch(batch.batch_id)
    return {"groups": [[sample.to_json() for sample in group] for group in groups], "exhausted": exhausted}


@routes.post("/batches/{batch_id}/next")
async def next_micro_batch(request: web.Request) -> web.Response:
    manager, batch = _consumed_batch(request)
    body = await parse_body(request, NextMicroBatchBody)
    if body.received is not None:
        try:
            manager.batches.adopt_handouts(batch, body.received)
        except ValueError as exc:
            raise http_error(web.HTTPConflict, str(exc)) from None
    handed_out = len(batch.handouts)
    if body.micro_batch is not None and body.micro_batch < handed_out:  # asked again: the same answer
        groups = [batch.groups[index] for index in batch.handouts[body.micro_batch]]
        last = body.micro_batch == handed_out - 1 and batch.packer.exhausted
        return answer.json_response(
            {"groups": [[s.to_json() for s in group] for group in groups], "exhausted": last}
        )
    if body.micro_batch is not None and body.micro_batch > handed_out:
        message = (
            f"micro_batch {body.micro_batch} asked, but only {handed_out} were handed out of "
            f"batch {batch.batch_id}"
        )
        raise http_error(web.HTTPConflict, message)
    try:
        groups = await batch.packer.next(body.min_groups, body.max_groups, body.timeout_s)
    except BatchDeleted as exc:
        raise http_error(web.HTTPGone, str(exc)) from None
    await manager.batches.hand_out(batch, groups, client_keeps=body.received is not None)
    return answer.json_response(_micro_batch_payload(manager, batch, groups))


@routes.post("/batches/{batch_id}/flush")
async def flush_batch(request: web.Request) -> web.Response:
    manager, batch = _batch(request)
    groups = batch.packer.flush()
    await manager.batches.hand_out(batch, groups)
    return answer.json_response(_micro_batch_payload(manager, batch, groups))


@routes.get("/batches/{batch_id}/samples")
async def stream_samples(request: web.Request) -> web.StreamResponse:
    _, batch = _consumed_batch(request)
    manager = request.app[MANAGER_KEY]
    order = request.query.get("order", "completion")
    if order not in ("completion", "submission"):
        raise BadRequest(f"order must be 'completion' or 'submission', got {order!r}")
    pending = batch.samples
    sent = _stream_cursor(request, len(pending))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    while True:
        changed = batch.changed()  # taken before reading: a change from here on wakes us
        if batch.deleted is not None:
            # the last line says why the stream ends short
            await response.write(error_body(batch.deleted).encode() + b"\n")
            break
        if order == "completion":
            ready = batch.completed[sent:]
        else:
            ready = []
            for sample in pending[sent:]:
                if sample.state < SampleState.FINISHED:
                    break
                ready.append(sample)
        if ready:
            await manager.journal.durable()  # a line the client sees is one a restart keeps in its place
        for sample in ready:
            await response.write(answer.dumps(sample.to_json()) + b"\n")
        sent += len(ready)
        if sent == len(pending):
            break
        await changed
    await response.write_eof()
    return response


def _stream_cursor(request: web.Request, num_samples: int) -> int:
    """Lines of the stream the client has seen already (`?after=N`, or SSE's `Last-Event-ID: N`
    header): a stream resumed after a manager restart starts after them."""
    raw = request.query.get("after", request.headers.get("Last-Event-ID", "0"))
    try:
        after = int(raw)
    except ValueError:
        raise BadRequest(f"after (or Last-Event-ID) must be a number of lines, got {raw!r}") from None
    if not 0 <= after <= num_samples:
        raise BadRequest(f"after={after} is outside 0..{num_samples}, the batch's number of samples")
    return after


@routes.delete("/batches/{batch_id}")
async def delete_batch(request: web.Request) -> web.Response:
    manager, batch = _batch(request)
    manager.forget_batch(
        batch.batch_id, deleted=f"batch {batch.batch_id} was deleted (DELETE /batches/{batch.batch_id})"
    )
    return web.json_response({"deleted": batch.batch_id})


@routes.post("/step_report")
async def step_report(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = await parse_body(request, StepReportBody)
    if body.bubble_s > body.step_time_s:
        raise BadRequest(f"bubble_s ({body.bubble_s}) exceeds step_time_s ({body.step_time_s})")
    budget = manager.offload.report_step(body.step_time_s, body.bubble_s, body.rollout_s)
    return web.json_response({"budget_s": budget})


@routes.get("/step_report")
async def last_step_report(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    offload = manager.offload
    return web.json_response({"steps": offload.num_step_reports, "last": offload.last_step_report})


# ------------------------------------------------------------------------------ workers


@routes.post("/workers/{engine_id}/update_weights")
async def update_worker_weights(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = workers_api.engine_id(request)
    body = await parse_body(request, UpdateWeightsBody)
    try:
        engine = await manager.fleet.update_engine_weights(
            engine_id,
            body.weight_version,
            model_path=body.model_path,
            weights_url=body.weights_url,
            codec=body.codec,
            transport=body.transport,
        )
    except KeyError:
        raise not_found(f"unknown or failed engine id {engine_id}") from None
    except WeightUpdateNotSupported as exc:
        raise http_error(web.HTTPConflict, str(exc)) from None
    except EngineUnavailable as exc:
        raise http_error(web.HTTPBadGateway, str(exc)) from None
    return web.json_response(engine.to_json())


@routes.post("/workers/{engine_id}/release")
async def release_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = workers_api.engine_id(request)
    try:
        move = await memory.release_engine(manager, engine_id)
    except KeyError:
        raise not_found(f"unknown engine id {engine_id}") from None
    except (memory.EngineNotReleasable, memory.EngineWontSleep) as exc:
        raise http_error(web.HTTPConflict, str(exc)) from None
    except EngineUnavailable as exc:
        raise http_error(web.HTTPBadGateway, str(exc)) from None
    return web.json_response(manager.registry.get(engine_id).to_json() | {"move": move.to_json()})


@routes.post("/workers/{engine_id}/resume")
async def resume_worker(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    engine_id = workers_api.engine_id(request)
    body = await parse_body(request, ResumeWorkerBody) if request.can_read_body else ResumeWorkerBody()
    try:
        move = await memory.resume_engine(manager, engine_id, _weight_source(body))
    except KeyError:
        raise not_found(f"unknown engine id {engine_id}") from None
    except memory.EngineNotReleasable as exc:
        raise http_error(web.HTTPConflict, str(exc)) from None
    except WeightUpdateNotSupported as exc:
        raise http_error(web.HTTPConflict, str(exc)) from None
    except (EngineUnavailable, memory.WeightSourceUnavailable) as exc:
        raise http_error(web.HTTPBadGateway, str(exc)) from None
    return web.json_response(manager.registry.get(engine_id).to_json() | {"move": move.to_json()})


def _weight_source(body: ResumeWorkerBody) -> memory.WeightSource | None:
    if body.model_path is None and body.weights_url is None:
        return None
    return memory.WeightSource(
        body.weight_version, body.model_path, body.weights_url, body.codec, body.transport
    )


@routes.post("/release_memory_occupation")
async def release_all(request: web.Request) -> web.Response:
    results = await memory.release_all(request.app[MANAGER_KEY])
    return _fan_out_answer(results)


@routes.post("/resume_memory_occupation")
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


@routes.get("/weight_versions")
async def weight_versions(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.json_response({str(e.engine_id): e.weight_version for e in manager.registry.live()})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[MANAGER_KEY].metrics.render(), content_type="text/plain")


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """200 while the manager can do all it is asked; 503 naming the journal's error while it cannot
    write (the manager serves on: running samples finish, new batches and sessions wait for it)."""
    error = request.app[MANAGER_KEY].journal.error
    if error is not None:
        return web.json_response({"status": "journal_failing", "error": {"message": error}}, status=503)
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
    app = web.Application(middlewares=[_edge], client_max_size=limit)
    app[MANAGER_KEY] = manager
    app[TOKENIZER_KEY] = manager.tokenizer = _load_tokenizer(manager.config.tokenizer)

    async def lifecycle(app: web.Application):
        await manager.start()
        yield
        await manager.close()

    app.cleanup_ctx.append(lifecycle)
    sglang_api.setup(app)
    workers_api.setup(app)
    sessions_api.setup(app)
    app.add_routes(
        [
            *routes,
            *openai_routes(manager),
            *vllm_api.routes,
            *vllm_control.routes,
            *vllm_control.not_served_routes(),
            *passthrough_routes(manager),
        ]
    )
    return app


async def serve(config: ManagerConfig, ready: asyncio.Event | None = None) -> None:
    """Run the manager until cancelled; `ready` is set once it listens."""
    sock = bind(config.host, config.port)  # before the manager contacts its engines
    app = create_app(RolloutManager(config))
    # `POST /generate` of one prompt on a lean path of its own, every other request on aiohttp's
    runner = LeanRunner(app, config.body_limits(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    log.info("rollflow manager listening on http://%s:%d", config.host, config.port)
    settle()
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
