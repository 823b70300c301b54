"""prime-rl's orchestrator against the manager, by the calls its `InferenceAdmin` sends to its one
admin URL (`src/prime_rl/orchestrator/inference_admin.py` at PrimeIntellect-ai/prime-rl@07858eec,
sent here as it sends them: prime-rl itself is not installed): `GET /health`, `GET /v1/models`, and
at each new policy step `POST /pause?mode=keep&clear_cache=false`, `POST /update_weights
{"weight_dir"}`, `POST /resume`, around OpenAI completions in flight, which finish with the greedy
tokens of an undisturbed run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.runtime.compat.skyrl_runs import greedy
from tests.runtime.manager.helpers import metric, wait_until
from tests.runtime.processes import http


@pytest.fixture(scope="module")
def cluster(module_processes, tiny_model):
    engines = [module_processes.engine(), module_processes.engine()]
    manager = module_processes.manager(
        engines=[{"url": e.url, "engine_type": "builtin"} for e in engines], tokenizer=str(tiny_model)
    )
    return manager, engines


def complete(manager_url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {
        "model": "policy",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    # held through a pause and a weight load on two engines: longer than `http`'s default minute on a
    # loaded machine
    status, answer = http(
        "POST", manager_url + "/v1/completions", body | {"return_token_ids": True}, timeout=600.0
    )
    assert status == 200, answer
    return answer["choices"][0]["token_ids"]


def test_a_policy_step_pauses_loads_the_folder_and_resumes_with_no_token_lost(cluster, tiny_model):
    manager, engines = cluster
    assert http("GET", manager.url + "/health")[0] == 200
    status, models = http("GET", manager.url + "/v1/models")
    assert status == 200 and models["data"]
    prompts = [[20 + i, 30 + i, 40 + i] for i in range(6)]
    expected = [greedy(engines[0].url, prompt, 128) for prompt in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        completions = [pool.submit(complete, manager.url, prompt, 128) for prompt in prompts]

        def generating() -> bool:
            for completion in completions:
                if completion.done():
                    completion.result()  # a completion that failed says why; one that ended is too fast
                    raise AssertionError("a completion ended before the pause")
            return http("GET", manager.url + "/v1/loads")[1]["num_running_reqs"] > 0

        wait_until(generating, what="the completions to run")

        # the engines are held still through the pause, so no completion can end inside its window
        for engine in engines:
            engine.pause()
        try:
            status, paused = http("POST", manager.url + "/pause?mode=keep&clear_cache=false")
        finally:
            for engine in engines:
                engine.resume()
        assert status == 200 and paused["status"] == "paused", paused
        status, updated = http("POST", manager.url + "/update_weights", {"weight_dir": str(tiny_model)})
        assert (status, updated) == (200, {"status": "ok", "weight_version": 1, "engines": 2}), updated
        assert set(http("GET", manager.url + "/weight_versions")[1].values()) == {1}
        ended = [completion for completion in completions if completion.done()]
        for completion in ended:
            completion.result()  # one that failed says why
        assert paused["samples_moved"] > 0 and not ended
        assert http("POST", manager.url + "/resume")[0] == 200

        assert [completion.result(timeout=120) for completion in completions] == expected
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0


def test_update_weights_names_what_it_needs(cluster):
    manager, _ = cluster
    status, body = http("POST", manager.url + "/update_weights", {})
    assert status == 400 and "weight_dir" in body["error"]["message"]
    status, body = http("POST", manager.url + "/update_weights", {"update_info": {"names": []}})
    assert status == 501 and "external_server_urls" in body["error"]["message"]
