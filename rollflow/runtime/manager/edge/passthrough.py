"""SGLang's info and admin routes on the manager, answered as sgl-router answers them.

    GET  /get_model_info, /get_server_info, /v1/models   the first live engine's answer, relayed
    GET  /health_generate                                every live engine must generate a token
    POST /flush_cache, /pause_generation, /continue_generation, /update_weights_from_disk
                                                         sent to every live engine with the body given;
                                                         success only if every engine succeeded

The admin answer names every engine's outcome, so a failure says which engine failed and why.
After `/update_weights_from_disk` the manager reads each engine's weight version back and routes
by it at once (samples pinned to a version go only to engines on it). The admin routes take the
manager's bearer token when one is configured (see `ADMIN_PATHS`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineError
from rollflow.runtime.engines.http import ENGINE_ERRORS, HttpEngine
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.http.errors import error_body
from rollflow.runtime.manager.core.registry import EngineRecord
from rollflow.runtime.manager.core.service import RolloutManager

log = logging.getLogger(__name__)

INFO_PATHS = ("/get_model_info", "/get_server_info", "/v1/models")
ADMIN_PATHS = frozenset(
    {"/flush_cache", "/pause_generation", "/continue_generation", "/update_weights_from_disk"}
)
INFO_TIMEOUT_S = 30.0
HEALTH_GENERATE_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 600.0
"""Loading a checkpoint from disk takes minutes on big models."""


@dataclass
class EngineAnswer:
    """One engine's answer to a fanned-out call; `status` None when it could not be reached."""

    engine: EngineRecord
    status: int | None
    body: Any

    @property
    def success(self) -> bool:
        ok = self.status is not None and self.status < 300
        return ok and not (isinstance(self.body, dict) and self.body.get("success") is False)

    def message(self) -> str:
        if isinstance(self.body, dict):
            error = self.body.get("error")
            found = error.get("message") if isinstance(error, dict) else error or self.body.get("message")
            if found:
                return str(found)[:500]
        return str(self.body)[:500] if self.body not in (None, "") else "no message"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.engine.engine_id,
            "url": self.engine.url,
            "status": self.status,
            "success": self.success,
            "answer": self.body,
        }


async def call_engine(
    engine: EngineRecord, method: str, path: str, body: Any, timeout_s: float
) -> EngineAnswer:
    """The engine's answer to one HTTP call; an engine that cannot be reached answers status None."""
    client = engine.client
    if not isinstance(client, HttpEngine):
        return EngineAnswer(engine, None, f"{type(client).__name__} has no HTTP routes")
    try:
        status, text = await client.call(method, path, body, timeout_s)
    except EngineError as exc:
        return EngineAnswer(engine, None, f"unreachable: {exc}")
    try:
        return EngineAnswer(engine, status, json.loads(text) if text.strip() else None)
    except ValueError:
        return EngineAnswer(engine, status, text[:2000])


def _no_engine() -> web.Response:
    return web.Response(
        status=503,
        text=error_body("no live engine to answer: register one (POST /workers)"),
        content_type="application/json",
    )


async def relay_first(manager: RolloutManager, request: web.Request) -> web.Response:
    """sgl-router's route_to_first: the first live engine's answer, status and body as they are."""
    engines = manager.registry.live()
    if not engines:
        return _no_engine()
    answer = await call_engine(engines[0], "GET", request.path, None, INFO_TIMEOUT_S)
    if answer.status is None:
        return web.Response(
            status=502,
            text=error_body(f"engine {engines[0].engine_id} ({engines[0].url}) {answer.body}"),
            content_type="application/json",
        )
    if isinstance(answer.body, dict | list):
        return web.json_response(answer.body, status=answer.status)
    return web.Response(status=answer.status, text=answer.body or "")


async def health_generate(manager: RolloutManager, request: web.Request) -> web.Response:
    """200 when every live engine generates a token, else 503 naming the ones that did not."""
    engines = manager.registry.live()
    if not engines:
        return _no_engine()
    answers = await asyncio.gather(
        *(call_engine(e, "GET", "/health_generate", None, HEALTH_GENERATE_TIMEOUT_S) for e in engines)
    )
    return combined_answer("health_generate", answers, failure_status=503)


async def fan_out(manager: RolloutManager, request: web.Request) -> web.Response:
    """Send an admin call to every live engine; 200 only if all succeeded."""
    limit = int(manager.config.max_body_mb * (1 << 20))
    body = await read_json_object(request, limit)
    engines = manager.registry.live()
    if not engines:
        return _no_engine()
    path = request.path
    answers = await asyncio.gather(*(call_engine(e, "POST", path, body, ADMIN_TIMEOUT_S) for e in engines))
    extra: dict[str, Any] = {}
    if path == "/update_weights_from_disk":
        extra["weight_versions"] = await _record_versions(manager, [a.engine for a in answers if a.success])
    return combined_answer(path.lstrip("/"), answers, extra=extra)


async def _record_versions(manager: RolloutManager, engines: list[EngineRecord]) -> dict[str, int | None]:
    """Read each updated engine's weight version back and route by it from now on."""

    async def read(engine: EngineRecord) -> int | None:
        try:
            version = await within(engine.client.weight_version(), manager.config.connect_timeout_s)
        except (*ENGINE_ERRORS, TimeoutError) as exc:
            log.warning(
                "engine %d loaded weights but its version could not be read: %s", engine.engine_id, exc
            )
            return engine.weight_version
        manager.fleet.record_weight_version(engine, version)
        return version

    versions = await asyncio.gather(*(read(e) for e in engines))
    return {str(e.engine_id): v for e, v in zip(engines, versions, strict=True)}


def combined_answer(
    what: str, answers: list[EngineAnswer], failure_status: int | None = None, extra: dict | None = None
) -> web.Response:
    """One answer for a call sent to every engine: 200 if all succeeded, else the engines' own 4xx when
    they all refused it, or a 502; each engine's outcome named, with `{"error": {"message"}}`."""
    failed = [a for a in answers if not a.success]
    if failed:
        named = "; ".join(
            f"engine {a.engine.engine_id} ({a.engine.url}): "
            + (f"HTTP {a.status}: " if a.status is not None else "")
            + a.message()
            for a in failed
        )
        message = f"{what} failed on {len(failed)} of {len(answers)} engines: {named}"
        if failure_status is None:
            # the engines all refused the request itself: the caller's 4xx, else a gateway error
            refused = all(a.status is not None and 400 <= a.status < 500 for a in failed)
            failure_status = failed[0].status if refused else 502
    else:
        message = f"{what} succeeded on all {len(answers)} engines"
    payload = {
        "success": not failed,
        "message": message,
        "engines": [a.to_json() for a in answers],
        **(extra or {}),
    }
    if failed:
        payload["error"] = {"message": message}
    return web.json_response(payload, status=failure_status if failed else 200)


def passthrough_routes(manager: RolloutManager) -> list[web.RouteDef]:
    return [
        *(web.get(path, partial(relay_first, manager)) for path in INFO_PATHS),
        web.get("/health_generate", partial(health_generate, manager)),
        *(web.post(path, partial(fan_out, manager)) for path in sorted(ADMIN_PATHS)),
    ]
