"""Engines pull new weights from a weight server through the manager, while a batch is running:
a transfer cut mid-chunk is retried and the engine rejoins on the new version; an engine killed
mid-transfer is retired, its samples resume elsewhere, and a launcher-started replacement pulls
the new version."""

from __future__ import annotations

import threading

import pytest

from rollflow.runtime.launch.launcher import Launcher
from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.weights import WeightStore
from rollflow.runtime.weights.checkpoint import read_checkpoint
from tests.runtime.launch.helpers import BackgroundWeightServer, launch_config
from tests.runtime.manager.helpers import assert_spans_tile_the_output, drain, prompts, wait_until, workers
from tests.runtime.processes import http
from tests.runtime.weights.proxy import ChunkProxy

PROMPTS = prompts(4)
MAX_NEW_TOKENS = 120


@pytest.fixture
def weight_server(tmp_path, tiny_model):
    """A weight server holding version 1: the tiny model with two matrices changed."""
    store = WeightStore(tmp_path / "store", chunk_bytes=64 * 1024)
    state, files = read_checkpoint(tiny_model)
    changed = ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.o_proj.weight")
    store.publish(1, {name: t * 1.7 if name in changed else t for name, t in state.items()}, files=files)
    server = BackgroundWeightServer(store)
    yield server
    server.close()


class WorkerWatch:
    """Polls one engine's record on the manager on a thread, keeping every distinct snapshot."""

    def __init__(self, manager_url: str, engine_id: int) -> None:
        self.client = ManagerClient(manager_url, timeout_s=10)
        self.engine_id = engine_id
        self.seen: list[tuple[str, int, int]] = []  # (state, running, tokens_generated)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            record = next(w for w in self.client.workers() if w["id"] == self.engine_id)
            self.seen.append((record["state"], record["running"], record["tokens_generated"]))
            self._stop.wait(0.01)

    def stop(self) -> list[tuple[str, int, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def _busy(manager_url: str, engine_url: str) -> bool:
    """The engine is streaming samples and has sent some tokens."""
    record = next(
        w
        for w in http("GET", manager_url + "/workers?include_failed=true")[1]["workers"]
        if w["url"] == engine_url
    )
    return record["running"] > 0 and record["tokens_generated"] >= 8


def test_a_transfer_cut_mid_chunk_is_retried_and_the_engine_rejoins_on_the_new_version(
    processes, weight_server
):
    target, other = processes.engine(), processes.engine()
    # `other` is registered as an SGLang server (the built-in engine speaks its API), which cannot pull
    manager = processes.manager(
        router="least_outstanding",
        engines=[
            {"url": target.url, "capacity": 4, "engine_type": "builtin"},
            {"url": other.url, "capacity": 4, "engine_type": "sglang"},
        ],
    )
    client = ManagerClient(manager.url)
    proxy = ChunkProxy(weight_server.url, mode="cut")
    try:
        batch = client.submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
        wait_until(lambda: _busy(manager.url, target.url), what="the target engine to stream")
        target_id, other_id = workers(manager)[target.url]["id"], workers(manager)[other.url]["id"]
        with pytest.raises(ManagerError) as refused:
            client.update_weights(other_id, weight_version=1, weights_url=weight_server.url)
        assert refused.value.status == 409 and "cannot pull" in str(refused.value)
        assert workers(manager)[other.url]["state"] == "healthy"  # nothing was loaded: not retired
        watch = WorkerWatch(manager.url, target_id)
        record = client.update_weights(target_id, weight_version=1, weights_url=proxy.url)
        seen = watch.stop()
        samples = drain(batch)
    finally:
        proxy.close()

    assert record["state"] == "healthy" and record["weight_version"] == 1
    assert http("GET", target.url + "/get_weight_version")[1]["weight_version"] == 1
    assert proxy.num_broken == 1 and proxy.num_chunk_requests > 1
    assert "weight pull attempt 1/5 failed" in target.log() and "attempt 2/5" not in target.log()
    # held out while it pulled: its samples left (their attempts end as their cancellations land),
    # none was routed to it, and not one token was recorded from it
    updating = [(running, tokens) for state, running, tokens in seen if state == "updating"]
    assert updating, "the watch never saw the engine updating"
    running = [count for count, _ in updating]
    assert running == sorted(running, reverse=True) and running[-1] == 0
    assert len({tokens for _, tokens in updating}) == 1
    # the samples it was running moved to the other engine and finished there, on version 0
    moved = [s for s in samples if s["spans"][0]["engine_url"] == target.url]
    assert moved, "no sample was running on the target engine"
    for sample in samples:
        assert sample["state"] == "finished" and sample["regenerated_tokens"] == 0
        assert {span["weight_version"] for span in sample["spans"]} == {0}
        assert_spans_tile_the_output(sample)
    for sample in moved:
        assert [span["engine_url"] for span in sample["spans"]] == [target.url, other.url]


def test_an_engine_killed_mid_transfer_is_retired_and_a_launched_replacement_pulls_the_new_version(
    tmp_path, tiny_model, weight_server
):
    pools = [
        {"kind": "local", "count": 2, "model": str(tiny_model), "capacity": 4},
        {"kind": "spot", "count": 0, "weights_url": weight_server.url, "tokenizer": str(tiny_model)},
    ]
    config = launch_config(tmp_path / "launch", pools, manager={"port": 0, "router": "least_outstanding"})
    proxy = ChunkProxy(weight_server.url, mode="hold")
    try:
        with Launcher(config) as launch:
            client = launch.manager
            (victim_id, victim), (survivor_id, _) = sorted(launch.engines.items())
            batch = client.submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
            wait_until(lambda: _busy(launch.manager_url, victim.url), what="the victim to stream")
            failure: list[ManagerError] = []

            def update() -> None:
                try:
                    client.update_weights(victim_id, weight_version=1, weights_url=proxy.url)
                except ManagerError as exc:
                    failure.append(exc)

            updater = threading.Thread(target=update)
            updater.start()
            assert proxy.chunk_requested.wait(60), "the victim never asked for a chunk"
            victim.slot.process.proc.kill()
            victim.slot.process.proc.wait()
            proxy.release()
            updater.join(60)
            assert failure and failure[0].status == 502, failure
            assert {w["id"]: w["state"] for w in client.workers()}[victim_id] == "failed"

            old = drain(batch)
            client.update_weights(survivor_id, weight_version=1, weights_url=weight_server.url)
            launch.check_processes()
            replacement = launch.add_engine(config.engines[1])
            assert replacement.weight_version == 1
            assert client.weight_versions() == {survivor_id: 1, replacement.engine_id: 1}
            new = drain(client.submit(PROMPTS, n=2, max_new_tokens=12, temperature=1.0))
            # the folder it was started from holds version 1 as published: its next pull is a delta
            store = weight_server.server.store
            store.publish(2, read_checkpoint(tmp_path / "launch" / "engine2-spot" / "model")[0])
            client.update_weights(replacement.engine_id, weight_version=2, weights_url=weight_server.url)
            assert (store.root / "payloads" / "v2-delta-zstd-from1").is_dir()
    finally:
        proxy.close()

    for sample in old:
        assert sample["state"] == "finished" and sample["regenerated_tokens"] == 0
        assert {span["weight_version"] for span in sample["spans"]} == {0}
        assert_spans_tile_the_output(sample)
    resumed = [s for s in old if s["spans"][0]["engine_id"] == victim_id]
    assert resumed and all(s["spans"][-1]["engine_id"] == survivor_id for s in resumed)
    assert all(s["state"] == "finished" for s in new)
    assert {span["weight_version"] for s in new for span in s["spans"]} == {1}
    assert replacement.engine_id in {span["engine_id"] for s in new for span in s["spans"]}
