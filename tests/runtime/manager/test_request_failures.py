"""A request that fails on every engine fails alone: the sample is failed with the engine's error,
every engine stays in the pool, and the next request is served."""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import pytest
from aiohttp import web

from tests.runtime.manager.helpers import metric, workers
from tests.runtime.processes import free_port, http

POISON_SEED = 4242


class PoisonEngine:
    """A real HTTP server in front of a real engine that ends requests seeded `POISON_SEED` as an
    engine ends a request that raised: a final event with finish_reason abort and a message.

    Everything else is relayed, so the engine registers and serves like any other.
    """

    def __init__(self, backend_url: str) -> None:
        self.backend_url = backend_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.poisoned = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        started.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if (
            request.path == "/generate"
            and json.loads(body)["sampling_params"].get("sampling_seed") == POISON_SEED
        ):
            self.poisoned += 1
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            meta = {
                "completion_tokens": 0,
                "output_token_logprobs": [],
                "finish_reason": {
                    "type": "abort",
                    "message": "sampling failed: probability tensor contains nan",
                },
            }
            await response.write(f"data: {json.dumps({'output_ids': [], 'meta_info': meta})}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            return response
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, self.backend_url + request.path, data=body) as upstream,
        ):
            if request.path != "/generate":
                return web.Response(
                    body=await upstream.read(), status=upstream.status, content_type="application/json"
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for line in upstream.content:
                await response.write(line)
            return response

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture(scope="module")
def cluster(module_processes):
    proxies = [PoisonEngine(module_processes.engine().url) for _ in range(2)]
    manager = module_processes.manager(engines=[{"url": p.url, "engine_type": "builtin"} for p in proxies])
    yield manager, proxies
    for proxy in proxies:
        proxy.stop()


def _generate(manager, **sampling):
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True} | sampling
    return http("POST", manager.url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": params})


def _assert_served_and_healthy(manager) -> None:
    assert {w["state"] for w in workers(manager).values()} == {"healthy"}
    status, body = _generate(manager)
    assert status == 200, body
    assert body["meta_info"]["finish_reason"] == {"type": "length"}
    assert len(body["output_ids"]) == 6


def test_a_request_failing_on_two_engines_is_failed_with_its_error_and_no_engine_leaves(cluster):
    manager, proxies = cluster
    status, body = _generate(manager, sampling_seed=POISON_SEED)
    assert status == 200, body
    finish = body["meta_info"]["finish_reason"]
    assert finish["type"] == "abort"
    assert "probability tensor contains nan" in finish["message"]
    assert sum(p.poisoned for p in proxies) == 2  # tried twice, then failed: not resumed again
    assert metric(manager, "rollflow_engine_failures_total") == 0
    _assert_served_and_healthy(manager)


def _body(**sampling) -> str:
    return json.dumps({"input_ids": [1], "sampling_params": sampling})


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (_body(sampling_seed=2**70), "sampling_seed"),
        (_body(temperature=float("inf")), "temperature"),
        (_body(temperature=float("nan")), "temperature"),
        (_body(top_p=float("nan")), "top_p"),
        (json.dumps({"input_ids": [2**40]}), "input_ids"),
        (_body(stop_token_ids=[2**70]), "stop_token_ids"),
    ],
)
def test_values_no_engine_can_honour_are_a_400_before_routing(cluster, raw, named):
    manager, proxies = cluster
    before = sum(p.poisoned for p in proxies)
    status, body = http("POST", manager.url + "/generate", raw.encode())
    assert status == 400, body
    assert named in body["error"]["message"]
    assert sum(p.poisoned for p in proxies) == before
    _assert_served_and_healthy(manager)
