"""sgl-router's worker API on the manager, so slime, verl and sgl-router tooling register engines
with the manager unchanged.

POST   /workers                 {"url", "worker_type": "regular", "api_key", ...} (token)
GET    /workers                 live engines (healthy or loading weights); `?include_failed=true` adds
                                failed ones (set aside by the breaker), `?include_removed=true` the
                                last ones removed
DELETE /workers/{id}            deregister; its samples resume elsewhere (token)
POST   /add_worker?url=URL      the older form of POST /workers (token)
POST   /remove_worker?url=URL   the older form of DELETE /workers/{id} (token)
GET    /list_workers            {"urls": [...]} of the live engines (the older listing)
"""

from __future__ import annotations

from collections import deque

from aiohttp import web

from rollflow.runtime.http.errors import BadRequest
from rollflow.runtime.manager.config import EngineEntry
from rollflow.runtime.manager.core.fleet import EngineUnavailable, normalise_url
from rollflow.runtime.manager.core.registry import EngineRecord
from rollflow.runtime.manager.edge.protocol import WorkerBody
from rollflow.runtime.manager.edge.shared import MANAGER_KEY, not_found, parse_body, validate

REMOVED_KEY = web.AppKey("removed_workers", deque)
"""The last engines removed by hand, for `GET /workers?include_removed=true`."""
MAX_REMOVED_SHOWN = 256
TRUE = ("1", "true", "yes")
routes = web.RouteTableDef()


def worker_json(engine: EngineRecord) -> dict:
    """rollflow's record of an engine with sgl-router's fields beside it."""
    return engine.to_json() | {
        "worker_type": "regular",
        "is_healthy": engine.state == "healthy",
        "load": len(engine.running),
    }


async def _register(request: web.Request, body: WorkerBody) -> EngineRecord:
    manager = request.app[MANAGER_KEY]
    try:
        return await manager.fleet.add_engine(
            EngineEntry(**body.model_dump(include=set(EngineEntry.model_fields)))
        )
    except EngineUnavailable as exc:
        raise BadRequest(str(exc)) from None


@routes.post("/workers")
async def add_worker(request: web.Request) -> web.Response:
    engine = await _register(request, await parse_body(request, WorkerBody))
    answer = worker_json(engine) | {
        "status": "accepted",
        "worker_id": engine.engine_id,
        "location": f"/workers/{engine.engine_id}",
    }
    return web.json_response(answer, status=201)


@routes.get("/workers")
async def list_workers(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    flag = {
        name: request.query.get(name, "").lower() in TRUE for name in ("include_failed", "include_removed")
    }
    engines = manager.registry.all() if flag["include_failed"] else manager.registry.live()
    if flag["include_removed"]:
        engines = [*engines, *request.app[REMOVED_KEY]]
    workers = [worker_json(engine) for engine in engines]
    stats = {"regular_count": len(workers), "prefill_count": 0, "decode_count": 0}
    return web.json_response({"workers": workers, "total": len(workers), "stats": stats})


@routes.post("/add_worker")
async def add_worker_by_query(request: web.Request) -> web.Response:
    """`POST /add_worker?url=...` (verl, launchers written for sgl-router or vllm-router); other
    WorkerBody fields may come as query parameters too. Answered as both routers answer it."""
    query = dict(request.query)
    if "capacity" in query:
        query["capacity"] = _int(query["capacity"], "capacity")
    engine = await _register(request, validate(WorkerBody, query))
    return web.Response(text=f"Successfully added worker: {engine.url}")


@routes.get("/list_workers")
async def list_worker_urls(request: web.Request) -> web.Response:
    return web.json_response({"urls": [engine.url for engine in request.app[MANAGER_KEY].registry.live()]})


async def _remove(request: web.Request, engine_id: int) -> web.Response:
    try:
        engine = await request.app[MANAGER_KEY].fleet.remove_engine(engine_id)
    except KeyError:
        raise not_found(f"unknown engine id {engine_id}") from None
    request.app[REMOVED_KEY].append(engine)
    return web.json_response(worker_json(engine))


@routes.delete("/workers/{engine_id}")
async def delete_worker(request: web.Request) -> web.Response:
    return await _remove(request, engine_id(request))


@routes.post("/remove_worker")
async def remove_worker_by_query(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        raise BadRequest("give the engine's url: POST /remove_worker?url=http://HOST:PORT")
    try:
        engine = request.app[MANAGER_KEY].registry.by_url(normalise_url(url))
    except ValueError as exc:
        raise BadRequest(f"bad engine url {url!r}: {exc}") from None
    if engine is None:
        raise not_found(f"no engine with url {url} is registered (see GET /workers)")
    await _remove(request, engine.engine_id)
    return web.Response(text=f"Successfully removed worker: {engine.url}")  # as sgl-router and vllm-router


def engine_id(request: web.Request) -> int:
    raw = request.match_info["engine_id"]
    try:
        return int(raw)
    except ValueError:
        raise not_found(f"unknown engine id {raw!r} (ids are integers; see GET /workers)") from None


def _int(raw: str, name: str) -> int | str:
    try:
        return int(raw)
    except ValueError:
        return raw  # validation names it


def is_admin(path: str, method: str) -> bool:
    """Worker changes need the token; listings stay open."""
    if path.startswith("/workers"):
        return method in ("POST", "DELETE")
    return path in ("/add_worker", "/remove_worker")


def setup(app: web.Application) -> None:
    app[REMOVED_KEY] = deque(maxlen=MAX_REMOVED_SHOWN)
    app.add_routes(routes)
