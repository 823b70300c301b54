"""`reference/http.md`: every route of the manager, the built-in engine and the weight server.

The routes are read from each server's aiohttp application as it is built (so a route added or
removed shows here at once), their request and answer shapes from the `ROUTES` table kept beside
each server's routes (`routes_doc.py`); `registered_routes` is what tests/docs checks those tables
against.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from rollflow.runtime.http.route_docs import RouteDoc
from tools.docs_site.markdown import cell, code, table


@dataclass(frozen=True)
class Server:
    title: str
    anchor: str
    intro: str
    build_app: Callable[[], web.Application]
    docs: Callable[[], dict[str, RouteDoc]]


def _manager_app() -> web.Application:
    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.core.service import RolloutManager
    from rollflow.runtime.manager.edge.server import create_app

    async def build() -> web.Application:  # the manager makes its asyncio objects in a loop
        return create_app(RolloutManager(ManagerConfig()))

    return asyncio.run(build())


def _engine_app() -> web.Application:
    from rollflow.runtime.engines.builtin.server import EngineServer, ServedModel
    from rollflow.runtime.engines.builtin.weight_routes import EngineWeights

    # only the route table is read: no model is loaded and nothing generates
    server = EngineServer.__new__(EngineServer)
    server._served = ServedModel(path="", tokenizer=None, vocab_size=1, max_context_length=1)
    server._weights = EngineWeights.__new__(EngineWeights)
    server._api_key, server._max_body, server._weights.max_upload_bytes = None, 1, 1
    return server.build_app()


def _weights_app() -> web.Application:
    from rollflow.runtime.weights.server import WeightServer

    return WeightServer(store=None).build_app()


def _manager_docs() -> dict[str, RouteDoc]:
    from rollflow.runtime.manager.edge.routes_doc import ROUTES

    return ROUTES


def _engine_docs() -> dict[str, RouteDoc]:
    from rollflow.runtime.engines.builtin.routes_doc import ROUTES

    return ROUTES


def _weights_docs() -> dict[str, RouteDoc]:
    from rollflow.runtime.weights.routes_doc import ROUTES

    return ROUTES


SERVERS = (
    Server(
        "Rollout manager",
        "manager",
        "`rollflow manager serve` (default port 30100). It serves SGLang's native API and sgl-router's "
        "worker API, so trainers and frameworks built for SGLang use it unchanged, plus its own "
        "batch, session and engine-management routes.",
        _manager_app,
        _manager_docs,
    ),
    Server(
        "Built-in engine",
        "engine",
        "`rollflow engine serve`: a real model on the CPU behind the part of SGLang's API the manager "
        "uses, with SGLang's bodies and answers, and a few routes of its own.",
        _engine_app,
        _engine_docs,
    ),
    Server(
        "Weight server",
        "weights",
        "`rollflow weights serve`: versioned weights that trainers publish and engines pull in checked, "
        "resumable chunks.",
        _weights_app,
        _weights_docs,
    ),
)


def registered_routes(server: Server) -> list[str]:
    """`"METHOD /path"` of every route the server's application registers (aiohttp's automatic HEAD
    twin of each GET left out), in registration order."""
    routes = []
    for route in server.build_app().router.routes():
        key = f"{route.method} {route.resource.canonical}"
        if route.method != "HEAD" and key not in routes:
            routes.append(key)
    return routes


def page() -> str:
    parts = [
        "# HTTP reference\n",
        "Every route of the three servers, read from their applications at build time. Bodies and "
        "answers are JSON unless a row says otherwise; `?` marks an optional field. Servers bind "
        "127.0.0.1 unless told otherwise.\n",
    ]
    for server in SERVERS:
        docs = server.docs()
        parts.append(f"## {server.title} {{#{server.anchor}}}\n")
        parts.append(server.intro + "\n")
        rows = []
        for key in registered_routes(server):
            doc = docs.get(key, RouteDoc("(undocumented)", "(undocumented)"))
            rows.append((code(key), cell(doc.request), cell(doc.answer)))
        parts.append(table(["route", "request", "answer"], rows))
    return "\n".join(parts)
