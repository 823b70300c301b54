"""The local backend with real processes: manager + engines up, a batch served, a new engine
joining on pulled weights, autoscaling after reported steps, and nothing left running after."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from rollflow.runtime.launch.launcher import Launcher
from rollflow.runtime.weights import WeightStore
from tests.runtime.launch.helpers import BackgroundWeightServer, launch_config, published_state
from tests.runtime.processes import http


def _serve_batch(launch: Launcher) -> list[dict]:
    batch = launch.manager.submit([[5, 6, 7], [8, 9, 10, 11]], n=2, max_new_tokens=6, temperature=1.0)
    return [sample for groups in batch.micro_batches(min_groups=2) for group in groups for sample in group]


def test_two_engines_serve_a_batch_an_exited_one_is_deregistered_and_all_stop(tmp_path, tiny_model):
    config = launch_config(tmp_path, [{"kind": "local", "count": 2, "model": str(tiny_model)}])
    with Launcher(config) as launch:
        workers = launch.manager.workers()
        assert [(w["kind"], w["state"], w["weight_version"]) for w in workers] == [
            ("local", "healthy", 0)
        ] * 2
        samples = _serve_batch(launch)
        assert len(samples) == 4
        assert all(s["state"] == "finished" and len(s["output_ids"]) > 0 for s in samples)
        used = {s["spans"][-1]["engine_id"] for s in samples}
        assert used == {w["id"] for w in launch.manager.workers()}
        processes = [launch.manager_slot] + [e.slot for e in launch.engines.values()]
        urls = [launch.manager_url] + [e.url for e in launch.engines.values()]

        victim_id, victim = next(iter(launch.engines.items()))
        victim.slot.process.proc.kill()
        victim.slot.process.proc.wait()
        launch.check_processes()  # deregistered, not restarted
        assert victim_id not in launch.engines and len(launch.engines) == 1
        states = {w["id"]: w["state"] for w in launch.manager.workers()}
        assert victim_id not in states and len(states) == 1  # deregistered: the record is gone
        assert len(_serve_batch(launch)) == 4
    assert all(p.exit_code() is not None for p in processes)
    for url in urls:
        with pytest.raises(OSError):
            http("GET", url + "/health", timeout=2)


def test_new_engine_pulls_the_newest_weights_and_joins(tmp_path, tiny_model):
    store = WeightStore(tmp_path / "store")
    files = {"config.json": (tiny_model / "config.json").read_text()}
    store.publish(1, published_state(tiny_model, 1.0), files=files)
    newest = published_state(tiny_model, 0.5)
    store.publish(3, newest, files=files)
    server = BackgroundWeightServer(store)
    try:
        pools = [
            {"kind": "local", "count": 1, "model": str(tiny_model)},
            {"kind": "spot", "count": 0, "weights_url": server.url, "tokenizer": str(tiny_model)},
        ]
        config = launch_config(tmp_path / "launch", pools)
        with Launcher(config) as launch:
            joined = launch.add_engine(config.engines[1])
            assert joined.weight_version == 3 and launch.num_joined == 1
            assert launch.manager.weight_versions() == {0: 0, joined.engine_id: 3}
            assert http("GET", joined.url + "/get_weight_version")[1]["weight_version"] == 3
            pulled = safetensors.torch.load_file(
                str(tmp_path / "launch/engine1-spot/model/model.safetensors")
            )
            assert all(torch.equal(pulled[name], tensor) for name, tensor in newest.items())
            answer = launch.manager.generate([5, 6, 7], max_new_tokens=4)
            assert len(answer["output_ids"]) > 0
    finally:
        server.close()


def test_autoscale_adds_engines_after_a_slow_step_and_removes_idle_ones_after_a_fast_one(
    tmp_path, tiny_model
):
    pool = {"kind": "spot", "count": 1, "model": str(tiny_model)}
    autoscale = {"enabled": True, "target_rollout_s": 10.0, "min_engines": 1, "max_engines": 2}
    config = launch_config(tmp_path, [pool], autoscale=autoscale)
    with Launcher(config) as launch:
        assert not launch.autoscale_once()  # no step reported yet
        launch.manager.report_step(step_time_s=40.0, bubble_s=0.0, rollout_s=30.0)
        assert launch.autoscale_once()
        assert len(launch.engines) == 2 and launch.num_joined == 1  # capped by max_engines
        assert not launch.autoscale_once()  # the same step is not acted on twice
        launch.manager.report_step(step_time_s=5.0, bubble_s=0.0, rollout_s=2.0)
        assert launch.autoscale_once()
        live = [w for w in launch.manager.workers() if w["state"] == "healthy"]
        assert len(launch.engines) == 1 and len(live) == 1
        assert live[0]["id"] == next(iter(launch.engines))


def test_a_launched_weight_server_serves_mooncake_when_asked(tmp_path, tiny_model):
    weights = {"enabled": True, "publish": str(tiny_model), "mooncake": "tcp"}
    config = launch_config(tmp_path / "work", [], weights=weights)
    with Launcher(config) as launch:
        manifest = http("GET", launch.weights_url + "/v1/manifest?version=0")[1]
        status, location = http("GET", f"{launch.weights_url}/v1/payloads/{manifest['payload_id']}/mooncake")
    assert status == 200 and location["session"].startswith("127.0.0.1:")
    assert len(location["chunks"]) == len(manifest["chunks"])


def test_a_launched_weight_server_starts_empty_each_launch_with_version_0_published(tmp_path, tiny_model):
    """A second launch in the same work_dir must not find the first one's versions (they only increase)."""
    config = launch_config(tmp_path / "work", [], weights={"enabled": True, "publish": str(tiny_model)})
    for _ in range(2):
        with Launcher(config) as launch:
            status, body = http("GET", launch.weights_url + "/v1/versions")
            assert status == 200 and body["versions"] == [0]
