"""SkyRL's proxy-only mode against the manager: `RemoteInferenceClient` (skyrl 0.3.0, run as it is by
skyrl_client.py) with only `external_proxy_url` set, so its control plane goes to the manager too,
over two built-in engines. A pause mid-batch (what SkyRL sends around a weight sync) leaves no sample
running and routes nothing through a weight update until the resume, and every sample finishes with
the greedy tokens of an undisturbed run; sleep, wake-up and the prefix-cache reset reach every
engine; what the manager cannot do for its engines (weight transfer, LoRA) is a 501 naming it."""

from __future__ import annotations

import time

import pytest

from tests.runtime.compat.skyrl_runs import SkyRL, answer, greedy, skyrl, skyrl_sampling
from tests.runtime.manager.helpers import metric
from tests.runtime.processes import http


@pytest.fixture(scope="module")
def cluster(module_processes, tiny_model):
    engines = [module_processes.engine(), module_processes.engine()]
    manager = module_processes.manager(
        engines=[{"url": engine.url, "engine_type": "builtin"} for engine in engines],
        tokenizer=str(tiny_model),
    )
    return manager, engines


@pytest.fixture
def control(cluster):
    """A SkyRL client in proxy-only mode, started and answering before the test goes on."""
    manager, _ = cluster
    client = SkyRL(manager.url)
    client.run([{"method": "resume_generation"}])
    yield client
    client.close()


def loads(manager) -> dict:
    return http("GET", manager.url + "/v1/loads")[1]


def body_of(result: dict, manager) -> dict:
    """The manager's answer among the per-server answers of a SkyRL control call."""
    assert list(result) == [manager.url]  # proxy-only: the manager is the one server
    assert result[manager.url]["status"] == 200
    return result[manager.url]["body"]


def test_a_pause_around_a_weight_update_leaves_every_sample_with_its_greedy_tokens(
    cluster, control, tiny_model
):
    manager, engines = cluster
    max_tokens = 128
    prompts = [[50 + i, 60 + i, 70 + i] for i in range(8)]
    expected = [greedy(engines[1].url, prompt, max_tokens) for prompt in prompts]
    batch = {"prompt_token_ids": prompts, "sampling_params": skyrl_sampling(max_tokens, ignore_eos=True)}
    generator = skyrl(manager.url, [], [{"method": "generate", "args": [batch]}])
    deadline = time.monotonic() + 120
    while loads(manager)["num_running_reqs"] == 0:  # pause once the batch is generating
        assert time.monotonic() < deadline and generator.poll() is None, "the batch never started"
        time.sleep(0.02)

    (paused,) = control.run([{"method": "pause_generation"}])["results"]
    paused = body_of(paused, manager)
    assert paused["status"] == "paused" and paused["mode"] == "keep" and paused["samples_moved"] > 0
    held = loads(manager)
    assert held["num_running_reqs"] == 0 and held["num_waiting_reqs"] > 0
    # the trainer's weight update meanwhile: each engine loads on idle, and nothing is routed to it
    for worker in http("GET", manager.url + "/workers")[1]["workers"]:
        status, updated = http(
            "POST",
            f"{manager.url}/workers/{worker['id']}/update_weights",
            {"model_path": str(tiny_model), "weight_version": 1},
        )
        assert status == 200 and updated["weight_version"] == 1, updated
    assert http("GET", manager.url + "/is_paused")[1] == {"is_paused": True}
    assert loads(manager)["num_running_reqs"] == 0 and generator.poll() is None

    (resumed,) = control.run([{"method": "resume_generation"}])["results"]
    assert body_of(resumed, manager) == {"status": "resumed"}
    generated = answer(generator)["results"][0]
    assert generated["response_ids"] == expected
    assert generated["stop_reasons"] == ["length"] * len(prompts)
    assert metric(manager, "rollflow_resumed_samples_total") > 0  # went on after the resume...
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0  # ...from the tokens they had


def test_a_pause_that_waits_lets_the_running_samples_finish_first(cluster, control):
    manager, engines = cluster
    prompts = [[80 + i, 81 + i] for i in range(4)]
    batch = {"prompt_token_ids": prompts, "sampling_params": skyrl_sampling(96, ignore_eos=True)}
    generator = skyrl(manager.url, [], [{"method": "generate", "args": [batch]}])
    deadline = time.monotonic() + 120
    while loads(manager)["num_running_reqs"] < len(prompts):  # every sample on an engine
        assert time.monotonic() < deadline and generator.poll() is None, "the batch never started"
        time.sleep(0.02)
    (paused,) = control.run([{"method": "pause", "args": ["wait"]}])["results"]
    assert body_of(paused, manager) == {"status": "paused", "mode": "wait", "samples_moved": 0}
    generated = answer(generator)["results"][0]  # finished while paused
    assert generated["response_ids"] == [greedy(engines[0].url, prompt, 96) for prompt in prompts]
    assert http("GET", manager.url + "/is_paused")[1] == {"is_paused": True}
    control.run([{"method": "resume"}])
    assert http("GET", manager.url + "/is_paused")[1] == {"is_paused": False}


def test_sleep_wake_up_and_prefix_cache_reset_reach_every_engine(cluster, control):
    manager, engines = cluster
    reset, slept = control.run([{"method": "reset_prefix_cache", "args": [True]}, {"method": "sleep"}])[
        "results"
    ]
    assert body_of(reset, manager)["success"] is True
    assert len(body_of(reset, manager)["engines"]) == len(engines)
    assert [move["kind"] for move in body_of(slept, manager)["moves"]] == ["release"] * len(engines)
    workers = http("GET", manager.url + "/workers?include_failed=true")[1]["workers"]
    assert {w["state"] for w in workers if w["url"] in {e.url for e in engines}} == {"released"}
    # SkyRL wakes the weights, then the KV cache: the first wakes whole engines, the second finds none
    weights, kv_cache = control.run(
        [{"method": "wake_up", "args": [["weights"]]}, {"method": "wake_up", "args": [["kv_cache"]]}]
    )["results"]
    assert [move["kind"] for move in body_of(weights, manager)["moves"]] == ["resume"] * len(engines)
    assert body_of(kv_cache, manager)["moves"] == []
    batch = {"prompt_token_ids": [[90, 91, 92]], "sampling_params": skyrl_sampling(8, ignore_eos=True)}
    (generated,) = control.run([{"method": "generate", "args": [batch]}])["results"]
    assert generated["response_ids"] == [greedy(engines[0].url, [90, 91, 92], 8)]


def test_what_the_manager_cannot_do_for_its_engines_is_a_501_naming_it(cluster, control):
    manager, _ = cluster
    failing = [
        {"method": "get_world_size", "expect_error": True},
        {"method": "update_named_weights", "args": [{"names": ["w"]}], "expect_error": True},
        {"method": "start_weight_update", "expect_error": True},
        {"method": "load_lora_adapter", "args": ["adapter", "/tmp/adapter"], "expect_error": True},
    ]
    world, update, start, lora = control.run(failing)["results"]
    assert world["status"] == 501 and "/get_world_size" in world["message"]
    assert update["status"] == 501 and "POST /update_weights" in update["message"]
    assert start["status"] == 501 and "/collective_rpc" in start["message"]
    assert lora["status"] == 501 and "LoRA" in lora["message"]
    assert "external_server_urls" in world["message"]  # and what to do instead
    status, body = http("POST", manager.url + "/pause?mode=later")
    assert status == 400 and "mode" in body["error"]["message"]
    assert http("GET", manager.url + "/is_paused")[1] == {"is_paused": False}
