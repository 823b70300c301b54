"""AReaL against the manager: its remote SGLang engine talks to the server addresses it is given
(`AREAL_LLM_SERVER_ADDRS`, no registration), sends its generation body (`frequency_penalty`,
`skip_special_tokens`, top-level `image_data`, `stream: false`) and, when a request comes back
aborted, resubmits prompt + the tokens it has with `max_new_tokens` reduced until it finishes.

The bodies are those of AReaL's `SGLangBackend.build_generation_request` with the defaults of its
`GenerationHyperparameters` (top_k 1e8, empty stop_token_ids).
"""

from __future__ import annotations

import pytest

from tests.runtime.compat.clients import in_threads, wait_running
from tests.runtime.processes import http

PROMPT = [21, 22, 23]


def areal_body(input_ids: list[int], max_new_tokens: int, image_data=None, **params) -> dict:
    return {
        "input_ids": list(input_ids),
        "image_data": image_data,
        "sampling_params": {
            "top_p": 1.0,
            "top_k": 100000000,
            "max_new_tokens": max_new_tokens,
            "temperature": 1.0,
            "stop_token_ids": [],
            "ignore_eos": False,
            "skip_special_tokens": True,
            "frequency_penalty": 0.0,
        }
        | params,
        "return_logprob": True,
        "stream": False,
    }


@pytest.fixture(scope="module")
def manager(operator_registered):
    """AReaL does not register engines; the manager's operator does (here from its config's way)."""
    return operator_registered


def test_the_health_check_areal_waits_on_answers(manager):
    assert http("GET", manager.url + "/health")[0] == 200


@pytest.mark.parametrize("image_data", [None, []])
def test_the_generation_body_is_served_as_areal_parses_it(manager, image_data):
    status, output = http("POST", manager.url + "/generate", areal_body(PROMPT, 10, image_data))
    assert status == 200, output
    meta = output["meta_info"]
    tokens = [item[1] for item in meta["output_token_logprobs"]]
    logprobs = [item[0] for item in meta["output_token_logprobs"]]
    assert tokens == output["output_ids"] and len(logprobs) == len(tokens) and 0 < len(tokens) <= 10
    assert meta["finish_reason"]["type"] in ("stop", "length")


def test_a_frequency_penalty_is_honoured_not_refused(manager):
    body = areal_body(PROMPT, 24, frequency_penalty=2.0, ignore_eos=True, temperature=0.0)
    status, output = http("POST", manager.url + "/generate", body)
    assert status == 200, output
    plain = http("POST", manager.url + "/generate", areal_body(PROMPT, 24, ignore_eos=True, temperature=0.0))[
        1
    ]
    # greedy decoding of a random tiny model loops on a few tokens; the penalty breaks the loop
    assert len(set(output["output_ids"])) > len(set(plain["output_ids"]))


def test_an_aborted_request_returns_its_tokens_and_areal_resubmits_the_rest(manager):
    """AReaL's interruption: the abort hands back what was generated (finish_reason abort); AReaL
    sends prompt + those tokens again with max_new_tokens reduced, until the sample finishes."""
    wanted = 400
    body = areal_body(PROMPT, wanted, ignore_eos=True)
    (thread,) = in_threads([lambda: http("POST", manager.url + "/generate", body, timeout=120)])
    wait_running(manager.url, 1)
    status, answer = http("POST", manager.url + "/abort_request", {"abort_all": True})
    assert status == 200 and answer["num_aborted"] == 1, answer
    thread.join(60)
    status, first = thread.result
    assert status == 200 and first["meta_info"]["finish_reason"]["type"] == "abort", first
    accumulated = [item[1] for item in first["meta_info"]["output_token_logprobs"]]
    assert 0 < len(accumulated) < wanted

    body = areal_body(PROMPT + accumulated, wanted - len(accumulated), ignore_eos=True)
    status, rest = http("POST", manager.url + "/generate", body)
    assert status == 200 and rest["meta_info"]["finish_reason"]["type"] == "length", rest
    assert len(accumulated) + len(rest["output_ids"]) == wanted
