"""Engines take new versions over Mooncake through the manager: a released engine resumes on the
weight server's newest, read over Mooncake; one whose transport dies mid-transfer (the weight
server killed with SIGKILL once the engine holds the manifest and the chunks' Mooncake location)
stays on its old version, out of the pool, and the other engine serves on."""

from __future__ import annotations

import threading

from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.weights import WeightStore
from rollflow.runtime.weights.checkpoint import read_checkpoint
from tests.runtime.manager.helpers import workers
from tests.runtime.processes import http
from tests.runtime.weights.factories import start_server_process
from tests.runtime.weights.proxy import ChunkProxy


def test_a_released_engine_resumes_on_the_newest_version_read_over_mooncake(processes, tiny_model, tmp_path):
    store_dir = tmp_path / "store"
    state, files = read_checkpoint(tiny_model)
    WeightStore(store_dir).publish(3, {n: t * 1.5 for n, t in state.items()}, files=files)
    server, server_url = start_server_process(store_dir, "--mooncake", "tcp")
    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    client = ManagerClient(manager.url)
    try:
        engine_id = workers(manager)[engine.url]["id"]
        client.release_worker(engine_id)
        answer = client.resume_worker(engine_id, weights_url=server_url, transport="mooncake")
    finally:
        server.kill()
        server.wait()
    assert answer["state"] == "healthy" and answer["weight_version"] == 3
    assert http("GET", engine.url + "/get_weight_version")[1]["weight_version"] == 3
    log = next((tmp_path).glob("serve-*.log")).read_text()
    assert "in mooncake memory" in log and "pulling over http" not in engine.log_path.read_text()


def test_the_transport_killed_mid_mooncake_transfer_leaves_the_engine_on_its_old_version_out_of_the_pool(
    processes, tiny_model, tmp_path
):
    store_dir = tmp_path / "store"
    state, files = read_checkpoint(tiny_model)
    WeightStore(store_dir, chunk_bytes=64 * 1024).publish(
        1, {n: t * 1.5 for n, t in state.items()}, files=files
    )
    server, server_url = start_server_process(store_dir, "--mooncake", "tcp")
    target, other = processes.engine(), processes.engine()
    manager = processes.manager(
        engines=[{"url": target.url, "engine_type": "builtin"}, {"url": other.url, "engine_type": "builtin"}]
    )
    client = ManagerClient(manager.url)
    proxy = ChunkProxy(server_url, mode="hold_mooncake")
    answers: list[BaseException | dict] = []

    def update() -> None:
        try:
            target_id = workers(manager)[target.url]["id"]
            answers.append(
                client.update_weights(
                    target_id, weight_version=1, weights_url=proxy.url, transport="mooncake"
                )
            )
        except Exception as exc:  # the test's thread: the assertions below look at it
            answers.append(exc)

    updating = threading.Thread(target=update)
    try:
        updating.start()
        assert proxy.chunk_requested.wait(60), "the engine never asked where the chunks lie"
        assert workers(manager)[target.url]["state"] == "updating"  # out of the pool while it pulls
        server.kill()
        server.wait()
        proxy.release()
        updating.join(120)
    finally:
        proxy.close()
        server.kill()
        server.wait()

    [answer] = answers
    assert isinstance(answer, ManagerError) and answer.status == 502, answer
    assert "weight pull attempt 1/5 failed: mooncake read of chunk" in target.log()
    assert workers(manager)[target.url]["state"] == "failed"  # retired: never routed to again
    assert http("GET", target.url + "/get_weight_version")[1]["weight_version"] == 0
    assert workers(manager)[other.url]["state"] == "healthy"
    request = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
    status, body = http("POST", manager.url + "/generate", request)
    assert status == 200, body
    spans = body["meta_info"]["spans"]
    assert {s["engine_url"] for s in spans} == {other.url} and {s["weight_version"] for s in spans} == {0}
