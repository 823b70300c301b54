"""verl against the manager: its SGLang HTTP adapter registers each server with the router by
`POST /add_worker?url=...`, generates with `{sampling_params, input_ids, return_logprob}` (None
values left out), aborts with `{"rid": "", "abort_all": true}` and unregisters with
`POST /remove_worker?url=...` at shutdown.

The sampling parameters are those verl's SGLang rollout builds (`n: 1`, the three penalties at their
neutral values, temperature, top_p, top_k, ignore_eos).
"""

from __future__ import annotations

import pytest

from tests.runtime.compat.clients import in_threads, wait_running
from tests.runtime.processes import http

PROMPT = [41, 42, 43, 44, 45]


def verl_sampling_params(max_new_tokens: int, **params) -> dict:
    return {
        "n": 1,
        "max_new_tokens": max_new_tokens,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "ignore_eos": False,
    } | params


@pytest.fixture(scope="module")
def manager(cluster):
    for url in cluster.engine_urls:  # answered as sgl-router and vllm-router answer
        status, answer = http("POST", f"{cluster.manager.url}/add_worker?url={url}")
        assert (status, answer) == (200, f"Successfully added worker: {url}")
    yield cluster.manager
    for url in cluster.engine_urls:
        status, answer = http("POST", f"{cluster.manager.url}/remove_worker?url={url}")
        assert (status, answer) == (200, f"Successfully removed worker: {url}")
    assert http("GET", cluster.manager.url + "/list_workers")[1] == {"urls": []}


def test_add_worker_registers_what_list_workers_shows(manager, cluster):
    assert sorted(http("GET", manager.url + "/list_workers")[1]["urls"]) == sorted(cluster.engine_urls)


def test_the_generate_body_is_served(manager):
    body = {"sampling_params": verl_sampling_params(12), "input_ids": PROMPT, "return_logprob": True}
    status, output = http("POST", manager.url + "/generate", body)
    assert status == 200, output
    assert len(output["meta_info"]["output_token_logprobs"]) == len(output["output_ids"]) > 0


def test_a_repetition_penalty_is_honoured(manager):
    greedy = verl_sampling_params(24, temperature=0.0, ignore_eos=True)
    plain = http("POST", manager.url + "/generate", {"sampling_params": greedy, "input_ids": PROMPT})[1]
    body = {"sampling_params": greedy | {"repetition_penalty": 2.0}, "input_ids": PROMPT}
    penalised = http("POST", manager.url + "/generate", body)[1]
    assert len(set(penalised["output_ids"])) > len(set(plain["output_ids"]))


def test_abort_all_ends_the_running_request_with_its_tokens(manager):
    body = {"sampling_params": verl_sampling_params(1500, ignore_eos=True), "input_ids": PROMPT}
    (thread,) = in_threads([lambda: http("POST", manager.url + "/generate", body, timeout=120)])
    wait_running(manager.url, 1)
    assert http("POST", manager.url + "/abort_request", {"rid": "", "abort_all": True})[0] == 200
    thread.join(60)
    status, output = thread.result
    assert status == 200 and output["meta_info"]["finish_reason"]["type"] == "abort", output
    assert 0 < len(output["output_ids"]) < 1500 and output["meta_info"]["resumes"] == 0


def test_remove_worker_of_an_unknown_url_is_a_404(manager):
    status, answer = http("POST", manager.url + "/remove_worker?url=http://127.0.0.1:9")
    assert status == 404 and "no engine with url" in answer["error"]["message"], answer
