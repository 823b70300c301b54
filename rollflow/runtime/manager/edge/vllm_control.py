"""vLLM's server control routes on the manager, for SkyRL's proxy-only mode: with only
`external_proxy_url` set, SkyRL's `RemoteInferenceClient` sends the control calls it would fan out to
its vLLM servers to the router URL instead, once (and prime-rl's orchestrator sends its pause,
`/update_weights {"weight_dir"}` and resume to its first base URL, a router or a server). The manager answers each for all its engines, in
vLLM's shapes, with its own semantics: no sample is lost to a pause.

    POST /pause?mode=keep|abort|wait&clear_cache=   route nothing until /resume. keep and abort move
                                                    what runs back to the queue with its tokens (it
                                                    goes on from them after /resume: the manager never
                                                    aborts a sample); wait lets it finish first
    POST /resume                                    route again
    GET  /is_paused                                 {"is_paused": bool}
    POST /sleep?level=&tags=, /wake_up?tags=        release every engine's memory / wake them (memory.py)
    POST /reset_prefix_cache                        every engine forgets its cached prefixes
    POST /update_weights {"weight_dir"}             every engine loads the folder (prime-rl's body)
    weight transfer, LoRA adapters, routed experts  501 naming the operation and what to do instead

A pause holds the dispatcher and drains the engines through the manager's drain (the path a released
engine's samples take), so a weight update meanwhile (`/workers/{id}/update_weights`) loads on idle
engines and no token is routed until `/resume`.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from rollflow.errors import UserError
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.manager.core import memory
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.manager.edge.passthrough import ADMIN_TIMEOUT_S, call_engine, combined_answer
from rollflow.runtime.manager.edge.shared import MANAGER_KEY, body_limit
from rollflow.runtime.manager.edge.vllm_api import answers_errors
from rollflow.runtime.wire.openai import OpenAIError

ADMIN_PATHS = frozenset({"/pause", "/resume", "/sleep", "/wake_up", "/reset_prefix_cache", "/update_weights"})
"""Routes that stop, put to sleep, flush or update every engine: admin routes, behind the token."""
PAUSE_MODES = ("keep", "abort", "wait")
PAUSE_REASON = "paused"  # the `reason` label of the samples a pause moves
SLEEP_LEVELS = ("1", "2")
MEMORY_TAGS = frozenset({"weights", "kv_cache"})
BOOLEANS = {"true": True, "false": False, "1": True, "0": False}
routes = web.RouteTableDef()

WEIGHT_TRANSFER = (
    "is not served by the rollflow manager: it does not join a trainer's weight-transfer group (NCCL "
    "or CUDA IPC) for its engines. Give SkyRL the engines too (generator.inference_engine."
    "external_server_urls) so it syncs weights with them directly, or load new weights through the "
    "manager (POST /workers/{id}/update_weights with a model_path or a weight server)"
)
NOT_SERVED = {
    ("GET", "/get_world_size"): f"the weight-transfer world size (GET /get_world_size) {WEIGHT_TRANSFER}",
    ("POST", "/init_weight_transfer_engine"): f"POST /init_weight_transfer_engine {WEIGHT_TRANSFER}",
    ("POST", "/start_weight_update"): f"POST /start_weight_update {WEIGHT_TRANSFER}",
    ("POST", "/finish_weight_update"): f"POST /finish_weight_update {WEIGHT_TRANSFER}",
    ("POST", "/collective_rpc"): f"POST /collective_rpc {WEIGHT_TRANSFER}",
    ("POST", "/init_broadcaster"): f"prime-rl's NCCL broadcast (POST /init_broadcaster) {WEIGHT_TRANSFER}",
    ("POST", "/load_lora_adapter"): "LoRA adapters (POST /load_lora_adapter) are not served by the "
    "rollflow manager: its engines serve one model, with no adapter by name",
    ("POST", "/skyrl/v1/load_lora_adapter"): "LoRA adapters (POST /skyrl/v1/load_lora_adapter) are not "
    "served by the rollflow manager: its engines serve one model, with no adapter by name",
    ("POST", "/v1/load_lora_adapter"): "LoRA adapters (POST /v1/load_lora_adapter) are not served by the "
    "rollflow manager: its engines serve one model, with no adapter by name",
    ("POST", "/v1/unload_lora_adapter"): "LoRA adapters (POST /v1/unload_lora_adapter) are not served by "
    "the rollflow manager: its engines serve one model, with no adapter by name",
    ("POST", "/skyrl/v1/generate"): "routed-expert replay (POST /skyrl/v1/generate) is not served by the "
    "rollflow manager: no engine behind it reports MoE routing decisions; set "
    "generator.inference_engine.enable_return_routed_experts=false",
}


UPDATE_INFO = f"POST /update_weights with update_info (a weight transfer) {WEIGHT_TRANSFER}"


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in BOOLEANS:
        raise OpenAIError(400, f"{name}={raw!r}: give true or false", name)
    return BOOLEANS[raw]


@routes.post("/pause")
@answers_errors
async def pause(request: web.Request) -> web.Response:
    """vLLM's `/pause`, for every engine: nothing is routed until `/resume`; keep (SkyRL's) and abort
    move the running samples back to the queue with their tokens, wait lets them finish. Answered once
    no engine runs any."""
    manager = request.app[MANAGER_KEY]
    mode = request.query.get("mode", "keep").lower()
    if mode not in PAUSE_MODES:
        raise OpenAIError(400, f"mode={mode!r}: give one of {', '.join(PAUSE_MODES)}", "mode")
    clear_cache = _flag(request, "clear_cache")
    manager.dispatcher.pause()
    busy = [engine for engine in manager.registry.all() if engine.running]
    if mode == "wait":
        await manager.attempts_ended([sample_id for engine in busy for sample_id in engine.running])
        moved = 0
    else:
        moved = sum(await asyncio.gather(*(manager.drain_engine(e, PAUSE_REASON) for e in busy)))
    if clear_cache:
        flushed = await _reset_prefix_caches(manager, reset_running_requests=False)
        if flushed.status >= 300:
            return flushed
    return web.json_response({"status": "paused", "mode": mode, "samples_moved": moved})


@routes.post("/resume")
async def resume(request: web.Request) -> web.Response:
    request.app[MANAGER_KEY].dispatcher.resume()
    return web.json_response({"status": "resumed"})


@routes.get("/is_paused")
async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[MANAGER_KEY].dispatcher.paused})


def _tags(request: web.Request) -> list[str]:
    tags = request.query.getall("tags", [])
    unknown = sorted(set(tags) - MEMORY_TAGS)
    if unknown:
        raise OpenAIError(400, f"unknown tags {unknown}: give weights and/or kv_cache", "tags")
    return tags


@routes.post("/sleep")
@answers_errors
async def sleep(request: web.Request) -> web.Response:
    """vLLM's `/sleep`, for every engine: each is drained (its samples wait with their tokens) and
    frees its memory (memory.py). Any level or tags release the whole engine."""
    level = request.query.get("level", "1")
    if level not in SLEEP_LEVELS:
        raise OpenAIError(400, f"level={level!r}: give 1 or 2", "level")
    _tags(request)
    return _moves_answer("sleep", await memory.release_all(request.app[MANAGER_KEY]))


@routes.post("/wake_up")
@answers_errors
async def wake_up(request: web.Request) -> web.Response:
    """vLLM's `/wake_up`, for every released engine: it takes its memory again and rejoins on the
    weights it held. Any tags wake the whole engine, so a second call (SkyRL wakes weights, then the KV
    cache) finds nothing left to wake."""
    _tags(request)
    return _moves_answer("wake_up", await memory.resume_all(request.app[MANAGER_KEY]))


def _moves_answer(what: str, results: list[memory.MemoryMove | str]) -> web.Response:
    errors = [result for result in results if isinstance(result, str)]
    if errors:
        message = f"{what} failed on {len(errors)} of {len(results)} engines: {'; '.join(errors)}"
        raise OpenAIError(502, message)
    return web.json_response({"status": "ok", "moves": [move.to_json() for move in results]})


@routes.post("/reset_prefix_cache")
@answers_errors
async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's `/reset_prefix_cache` (SkyRL's body `{"reset_running_requests"}`), for every engine:
    vLLM engines get it as it is, SGLang and built-in ones `/flush_cache`."""
    body = await read_json_object(request, body_limit(request)) if request.can_read_body else {}
    reset_running = body.get("reset_running_requests", False)
    if not isinstance(reset_running, bool):
        raise OpenAIError(400, "reset_running_requests must be true or false", "reset_running_requests")
    return await _reset_prefix_caches(request.app[MANAGER_KEY], reset_running)


async def _reset_prefix_caches(manager: RolloutManager, reset_running_requests: bool) -> web.Response:
    engines = manager.registry.live()
    if not engines:
        raise OpenAIError(503, "no live engine to reset: register one (POST /workers)")
    vllm_path = f"/reset_prefix_cache?reset_running_requests={str(reset_running_requests).lower()}"
    answers = await asyncio.gather(
        *(
            call_engine(
                e, "POST", vllm_path if e.engine_type == "vllm" else "/flush_cache", None, ADMIN_TIMEOUT_S
            )
            for e in engines
        )
    )
    return combined_answer("reset_prefix_cache", answers)


@routes.post("/update_weights")
@answers_errors
async def update_weights(request: web.Request) -> web.Response:
    """prime-rl's `/update_weights {"weight_dir"}`: every healthy engine loads the checkpoint folder
    through the manager's weight update (held out of the pool while it loads, rejoining on the new
    version: `weight_version`, else one above the newest any engine serves). vLLM's own body, an
    `update_info` for a weight transfer, is a 501."""
    manager = request.app[MANAGER_KEY]
    body = await read_json_object(request, body_limit(request))
    if "update_info" in body:
        raise OpenAIError(501, UPDATE_INFO)
    weight_dir, version = body.get("weight_dir"), body.get("weight_version")
    if not isinstance(weight_dir, str) or not weight_dir:
        raise OpenAIError(400, "give weight_dir: the checkpoint folder every engine loads", "weight_dir")
    engines = [engine for engine in manager.registry.live() if engine.state == "healthy"]
    if not engines:
        raise OpenAIError(503, "no healthy engine to update: register one (POST /workers)")
    if version is None:
        version = 1 + max((e.weight_version or 0 for e in manager.registry.live()), default=0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise OpenAIError(400, "weight_version must be a non-negative integer", "weight_version")
    results = await asyncio.gather(
        *(manager.fleet.update_engine_weights(e.engine_id, version, model_path=weight_dir) for e in engines),
        return_exceptions=True,
    )
    failed = []
    for engine, result in zip(engines, results, strict=True):
        if isinstance(result, KeyError):
            failed.append(f"engine {engine.engine_id}: it left the pool meanwhile")
        elif isinstance(result, UserError):
            failed.append(f"engine {engine.engine_id}: {result}")
        elif isinstance(result, BaseException):
            raise result
    if failed:
        message = f"update_weights failed on {len(failed)} of {len(engines)} engines: {'; '.join(failed)}"
        raise OpenAIError(502, message)
    return web.json_response({"status": "ok", "weight_version": version, "engines": len(engines)})


def _not_served(message: str):
    @answers_errors
    async def route(request: web.Request) -> web.Response:
        raise OpenAIError(501, message)

    return route


def not_served_routes() -> list[web.RouteDef]:
    """vLLM's routes the manager knows but cannot serve: each answers 501 saying why (`NOT_SERVED`)."""
    return [web.route(method, path, _not_served(message)) for (method, path), message in NOT_SERVED.items()]
