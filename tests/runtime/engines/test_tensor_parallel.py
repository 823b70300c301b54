"""`rollflow engine serve --tensor-parallel 2`: two real processes, each with half of every split
layer, give the greedy tokens one process gives; a new version reaches each rank as its own
slices (about half the bytes); a rank killed mid-transfer leaves the engine on its old version,
out of the manager's pool, while the other engine serves on."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from safetensors.torch import save_file

from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.weights import WeightStore
from rollflow.runtime.weights.checkpoint import read_checkpoint
from rollflow.runtime.weights.slices import shard_state
from tests.runtime.engines.helpers import PROMPT
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.manager.helpers import workers
from tests.runtime.processes import http
from tests.runtime.weights.factories import start_server_process
from tests.runtime.weights.proxy import ChunkProxy

PROMPTS = [PROMPT, [5, 9, 300, 41], [250, 3, 3, 3, 60, 61, 62, 99, 100, 7, 8]]
# tensors a "training step" changes: one split by rows, one by columns, one replicated
CHANGED = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight")


def _greedy(url: str) -> list[list[int]]:
    """Greedy tokens of every prompt, run as one batch so the requests interleave (each on its own
    KV cache in every rank)."""
    body = {
        "input_ids": PROMPTS,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    }
    status, answers = http("POST", url + "/generate", body)
    assert status == 200, answers
    return [answer["output_ids"] for answer in answers]


def _pull(url: str, weights_url: str, version: int) -> tuple[int, dict]:
    return http("POST", url + "/update_weights_from_server", {"url": weights_url, "weight_version": version})


def test_two_ranks_generate_what_one_does_before_and_after_an_upload(tiny_model: Path, tmp_path):
    state, _ = read_checkpoint(tiny_model)
    stepped = {name: t * 1.5 if name in CHANGED else t for name, t in state.items()}
    save_file(stepped, str(tmp_path / "stepped.safetensors"))
    one, two = EngineProcess(tiny_model), EngineProcess(tiny_model, "--tensor-parallel", "2")
    try:
        info = http("GET", two.url + "/get_model_info")[1]
        before = _greedy(one.url), _greedy(two.url)
        loads = [
            http(
                "POST",
                engine.url + "/update_weights_from_disk",
                {"model_path": str(tmp_path / "stepped.safetensors"), "weight_version": 1},
            )
            for engine in (one, two)
        ]
        after = _greedy(one.url), _greedy(two.url)
    finally:
        one.stop()
        two.stop()
    assert info["tp_size"] == 2 and len(info["tp_pids"]) == 1
    assert before[0] == before[1]
    assert all(status == 200 and answer["weight_version"] == 1 for status, answer in loads), loads
    assert after[0] == after[1]
    assert after[0] != before[0]  # the upload reached every rank: the outputs changed alike


def test_each_rank_pulls_its_own_slices_full_then_delta(tiny_model: Path, weight_server):
    store, server = weight_server
    state, files = read_checkpoint(tiny_model)
    store.publish(1, state, files=files)
    one, two = EngineProcess(tiny_model), EngineProcess(tiny_model, "--tensor-parallel", "2")
    try:
        first = [_pull(engine.url, server.url, 1) for engine in (one, two)]
        store.publish(2, {name: t * 1.5 if name in CHANGED else t for name, t in state.items()}, files=files)
        second = [_pull(engine.url, server.url, 2) for engine in (one, two)]
        outputs = _greedy(one.url), _greedy(two.url)
    finally:
        one.stop()
        two.stop()
    for status, answer in first + second:
        assert status == 200, answer
    whole, rank0 = first[0][1]["pull"], first[1][1]["pull"]
    assert whole["model_nbytes"] == _nbytes(state)
    # rank 0 holds half of every tensor but the norms
    assert rank0["model_nbytes"] == _nbytes(shard_state(state, 2, 0)) < 0.55 * _nbytes(state)
    payloads = {path.name for path in (store.root / "payloads").iterdir()}
    assert {"v1-zstd-tp2r0", "v1-zstd-tp2r1"} <= payloads  # the first pull has no base: full payloads
    delta = second[1][1]["pull"]
    assert delta["base_version"] == 1 and "v2-delta-zstd-from1-tp2r1" in payloads
    assert outputs[0] == outputs[1]


def test_each_rank_reads_its_slices_over_mooncake(tiny_model: Path, tmp_path):
    store = WeightStore(tmp_path / "store", chunk_bytes=16 * 1024)
    state, files = read_checkpoint(tiny_model)
    store.publish(1, {name: t * 1.5 if name in CHANGED else t for name, t in state.items()}, files=files)
    server, server_url = start_server_process(store.root, "--mooncake", "tcp")
    one, two = EngineProcess(tiny_model), EngineProcess(tiny_model, "--tensor-parallel", "2")
    try:
        pulls = [
            http(
                "POST",
                engine.url + "/update_weights_from_server",
                {"url": server_url, "weight_version": 1, "transport": transport},
            )
            for engine, transport in ((one, "http"), (two, "mooncake"))
        ]
        outputs = _greedy(one.url), _greedy(two.url)
    finally:
        one.stop()
        two.stop()
        server.kill()
        server.wait()
    assert [status for status, _ in pulls] == [200, 200], pulls
    assert pulls[1][1]["pull"]["transport"] == "mooncake"
    assert "pulling over http" not in "".join(two.output)  # rank 1 read over Mooncake too
    assert outputs[0] == outputs[1]


def _nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_a_rank_killed_mid_transfer_leaves_the_engine_on_its_old_version_out_of_the_pool(
    processes, tiny_model: Path, weight_server
):
    store, server = weight_server
    state, files = read_checkpoint(tiny_model)
    store.publish(1, {name: t * 1.5 for name, t in state.items()}, files=files)
    target, other = processes.engine(extra_args=("--tensor-parallel", "2")), processes.engine()
    manager = processes.manager(
        engines=[{"url": target.url, "engine_type": "builtin"}, {"url": other.url, "engine_type": "builtin"}]
    )
    client = ManagerClient(manager.url)
    proxy = ChunkProxy(server.url, "hold", only="-tp2r1/")  # rank 0's chunks pass, rank 1's first waits
    answers: list[BaseException | dict] = []

    def update() -> None:
        try:
            target_id = workers(manager)[target.url]["id"]
            answers.append(client.update_weights(target_id, weight_version=1, weights_url=proxy.url))
        except Exception as exc:  # the test's thread: the assertions below look at it
            answers.append(exc)

    rank1 = http("GET", target.url + "/get_model_info")[1]["tp_pids"][0]
    updating = threading.Thread(target=update)
    try:
        updating.start()
        assert proxy.chunk_requested.wait(120), "rank 1 never asked for its slices"
        assert workers(manager)[target.url]["state"] == "updating"  # out of the pool while it pulls
        os.kill(rank1, signal.SIGKILL)
        proxy.release()
        updating.join(300)
    finally:
        proxy.close()
    [answer] = answers
    assert isinstance(answer, ManagerError) and answer.status == 502, answer
    assert workers(manager)[target.url]["state"] == "failed"  # retired: never routed to again
    assert http("GET", target.url + "/get_weight_version")[1]["weight_version"] == 0
    health = http("GET", target.url + "/health")
    assert health[0] == 503 and "tensor-parallel rank 1 exited" in health[1]["error"]["message"]
    assert "keeps version 0" in target.log()
    request = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}
    status, body = http("POST", manager.url + "/generate", request)
    assert status == 200, body
    assert {span["engine_url"] for span in body["meta_info"]["spans"]} == {other.url}
