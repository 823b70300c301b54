"""Engines that hang, queue, answer garbage, join mid-batch, or register with the wrong token."""

from __future__ import annotations

import functools
import time

import pytest
from aiohttp import web

from rollflow.runtime.launch import servers
from rollflow.runtime.manager.client import ManagerClient
from rollflow.runtime.manager.token import TOKEN_ENV
from tests.runtime.manager.helpers import (
    EngineProxy,
    assert_finished_as_undisturbed,
    assert_spans_tile_the_output,
    drain,
    greedy_reference,
    metric,
    wait_until,
    workers,
)
from tests.runtime.processes import Process, http

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


def _waiting(engine) -> int:
    """Requests in the engine's own queue, by its SGLang-shaped load report."""
    status, body = http("GET", engine.url + "/v1/loads")
    assert status == 200, body
    return sum(rank["num_waiting_reqs"] for rank in body["loads"])


def test_engines_that_queue_past_their_running_limit_are_not_taken_for_hung(processes):
    """The manager lets the engines queue (capacity 256 over engines that run 64 at a time): 200
    samples of 128 tokens leave requests in both engines' queues, with no token, for longer than a
    stall window and a sweep period. The engines produce for the requests they run throughout, so
    neither leaves the pool and no sample resumes."""
    stall_timeout_s = 10.0
    engines = [processes.engine(extra_args=("--max-running-requests", "64")) for _ in range(2)]
    manager = processes.manager(
        stall_timeout_s=stall_timeout_s, engines=[{"url": e.url, "capacity": 256} for e in engines]
    )
    ids_before = {url: worker["id"] for url, worker in workers(manager).items()}
    prompts = [[11 + i % 40, 3, 60 + i % 50, 7 + i % 13] for i in range(200)]
    batch = ManagerClient(manager.url).submit(prompts, n=1, max_new_tokens=128, ignore_eos=True)
    wait_until(lambda: all(_waiting(e) > 0 for e in engines), what="requests queued in both engines")
    # the premise: a request still waits, untouched, a whole window and a sweep period later (no
    # request joins the queues after the burst, so one waiting then has waited that long)
    queued_at = time.monotonic()
    while time.monotonic() - queued_at < stall_timeout_s * 1.25 and any(_waiting(e) for e in engines):
        time.sleep(0.5)
    waited_past_a_window = any(_waiting(e) for e in engines)
    samples = drain(batch)
    assert all(s["state"] == "finished" and len(s["output_ids"]) == 128 for s in samples)
    assert all(s["attempts"] == 1 and s["resumes"] == 0 and len(s["spans"]) == 1 for s in samples)
    after = workers(manager)
    assert {url: worker["id"] for url, worker in after.items()} == ids_before  # none left and rejoined
    assert all(worker["state"] == "healthy" for worker in after.values())
    assert metric(manager, "rollflow_engine_failures_total") == 0
    assert metric(manager, "rollflow_resumed_samples_total") == 0
    if not waited_past_a_window:  # (an engine taken for hung empties its queue early too: asserted above)
        pytest.skip("this machine decodes so fast that the queues drained within a stall window: no test")


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
    assert_finished_as_undisturbed(samples, healthy, 40)
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


def test_the_token_in_the_environment_guards_the_admin_routes_as_the_flag_does(processes, tmp_path):
    """`rollflow manager serve` with no `--token` reads `$ROLLFLOW_MANAGER_TOKEN`, as the launcher
    hands it over (a token in a flag would show in `ps`)."""
    engine = processes.engine()
    env = {**servers.ENV, TOKEN_ENV: "from-env"}
    manager = servers.start_manager({}, tmp_path, process=functools.partial(Process, env=env))
    processes.started.append(manager)
    assert "from-env" not in " ".join(manager.proc.args)
    status, _ = http("POST", manager.url + "/workers", {"url": engine.url})
    assert status == 401
    status, _ = http("POST", manager.url + "/workers", {"url": engine.url}, token="from-env")
    assert status == 201 and workers(manager)[engine.url]["state"] == "healthy"


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
