"""A request that fails on every engine fails alone: the sample is failed with the engine's error,
every engine stays in the pool, and the next request is served; a fault of the manager's own code
while it reads an engine fails the sample rather than leaving it hanging."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import SampleState
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.manager.helpers import EngineProxy, metric, workers
from tests.runtime.processes import http

POISON_SEED = 4242


class PoisonEngine(EngineProxy):
    """A real engine behind a proxy that ends requests seeded `POISON_SEED` as an engine ends a
    request that raised: a final event with finish_reason abort, a message and a 4xx status_code
    (SGLang's way, and the built-in engine's, of blaming the request rather than a client's abort).

    Everything else is relayed, so the engine registers and serves like any other.
    """

    def __init__(self, backend_url: str) -> None:
        self.poisoned = 0
        super().__init__(backend_url)

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        if (
            request.path != "/generate"
            or json.loads(body)["sampling_params"].get("sampling_seed") != POISON_SEED
        ):
            return await super().handle(request, body)
        self.poisoned += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        meta = {
            "completion_tokens": 0,
            "output_token_logprobs": [],
            "finish_reason": {
                "type": "abort",
                "message": "sampling failed: probability tensor contains nan",
                "status_code": 400,
            },
        }
        await response.write(f"data: {json.dumps({'output_ids': [], 'meta_info': meta})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


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


def test_an_unexpected_error_in_an_attempt_ends_the_sample_instead_of_hanging():
    """A fault in the manager's own code while it reads an engine (here the client raises a
    TypeError) fails the sample with that error after `request_failures_to_fail` engines tried it:
    its caller gets an answer instead of waiting forever on a sample nothing will end."""

    class BrokenClient:
        url = "http://127.0.0.1:9"
        calls = 0

        def generate(self, rid, input_ids, sampling):
            BrokenClient.calls += 1
            raise TypeError("a bug in the client")

        async def health(self) -> bool:
            return True

        async def load(self):
            return None

        async def abort(self, rid) -> None:
            pass

        async def close(self) -> None:
            pass

    async def go():
        manager = RolloutManager(ManagerConfig(engines=[], request_failures_to_fail=2))
        await manager.start()
        try:
            for index in range(2):
                manager.registry.add(
                    url=f"http://127.0.0.1:{9 + index}",
                    kind="local",
                    engine_type="sglang",
                    capacity=4,
                    client=BrokenClient(),
                    weight_version=0,
                )
            sample = manager.submit_sample([1, 2, 3], SamplingParams(max_new_tokens=4))
            async with asyncio.timeout(30):
                while sample.state < SampleState.FINISHED:
                    await manager.wait_for_update(sample)
            return sample
        finally:
            await manager.close()

    sample = asyncio.run(go())
    assert sample.state == SampleState.FAILED and "a bug in the client" in sample.error
    assert BrokenClient.calls == 2
