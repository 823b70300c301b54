"""Engines that hang, answer garbage, join mid-batch, or register with the wrong token."""

from __future__ import annotations

from aiohttp import web

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import (
    EngineProxy,
    assert_spans_tile_the_output,
    drain,
    greedy_reference,
    metric,
    wait_until,
    workers,
)
from tests.runtime.processes import http

PROMPTS = [[11 + i, 3, 60 + i] for i in range(4)]


def test_a_hung_engine_is_dropped_after_the_stall_timeout_and_its_samples_resume(processes):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        stall_timeout_s=6.0, health_interval_s=30, engines=[{"url": e.url, "capacity": 8} for e in engines]
    )
    client = ManagerClient(manager.url)
    batch = client.submit(PROMPTS, n=2, max_new_tokens=120, temperature=0, ignore_eos=True)
    wait_until(lambda: workers(manager)[engines[0].url]["tokens_generated"] > 5, what="tokens from engine 0")
    engines[0].pause()
    samples = drain(batch)
    assert all(s["state"] == "finished" for s in samples)
    assert workers(manager)[engines[0].url]["state"] == "failed"
    for sample in samples:
        assert sample["output_ids"] == greedy_reference(engines[1], sample["prompt_ids"], 120)
        assert_spans_tile_the_output(sample)
    assert metric(manager, "rollflow_engine_failures_total") >= 1


class GarbageEngine(EngineProxy):
    """A real engine whose `/generate` stream turns to garbage after a few lines.

    Everything else (health, model info, weight version) is relayed, so it registers like a
    healthy engine and fails only where a broken engine would: in the middle of a stream.
    """

    async def forward_line(self, response: web.StreamResponse, line: bytes, index: int) -> bool:
        await response.write(line)
        if index + 1 >= 6:
            await response.write(b"data: {this is not json\n\n")
            return False
        return True


def test_an_engine_that_answers_garbage_leaves_the_pool_and_nothing_is_lost(processes):
    real = processes.engine()
    healthy = processes.engine()
    garbage = GarbageEngine(real.url)
    try:
        manager = processes.manager(
            router="round_robin", engines=[{"url": garbage.url}, {"url": healthy.url}]
        )
        client = ManagerClient(manager.url)
        samples = drain(client.submit(PROMPTS, n=1, max_new_tokens=40, temperature=0, ignore_eos=True))
    finally:
        garbage.stop()
    assert workers(manager)[garbage.url]["state"] == "failed"
    for sample in samples:
        assert sample["state"] == "finished"
        assert sample["output_ids"] == greedy_reference(healthy, sample["prompt_ids"], 40)
        assert_spans_tile_the_output(sample)
    assert any(span["engine_url"] == garbage.url for s in samples for span in s["spans"])


def test_an_engine_that_joins_mid_batch_is_used_at_once(processes):
    first = processes.engine()
    joiner = processes.engine()  # running, but registered only once the batch is under way
    manager = processes.manager(engines=[{"url": first.url, "capacity": 2}])
    client = ManagerClient(manager.url)
    batch = client.submit(
        [[i + 1, 9] for i in range(8)], n=1, max_new_tokens=60, temperature=0, ignore_eos=True
    )
    wait_until(lambda: workers(manager)[first.url]["tokens_generated"] > 0, what="the first engine to start")
    assert batch.status()["states"]["waiting"] > 0
    client.add_worker(joiner.url, kind="remote", capacity=2)
    samples = drain(batch)
    assert all(s["state"] == "finished" for s in samples)
    assert any(span["engine_url"] == joiner.url for s in samples for span in s["spans"])


def test_registration_with_a_wrong_token_is_refused_and_changes_nothing(processes):
    engine = processes.engine()
    manager = processes.manager(token="s3cret")
    status, body = http("POST", manager.url + "/workers", {"url": engine.url}, token="wrong")
    assert status == 401 and "Bearer" in body["error"]["message"]
    status, _ = http("POST", manager.url + "/workers", {"url": engine.url})
    assert status == 401
    assert workers(manager) == {}
    status, record = http(
        "POST", manager.url + "/workers", {"url": engine.url, "kind": "spot"}, token="s3cret"
    )
    assert status == 201 and record["kind"] == "spot"
    status, _ = http("DELETE", manager.url + f"/workers/{record['id']}", token="wrong")
    assert status == 401
    assert workers(manager)[engine.url]["state"] == "healthy"
