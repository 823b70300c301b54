"""SkyRL against the manager: its remote inference engine (`generator.remote_inference_engine_urls`,
`host:port`, no registration) sends one batched `/generate` with a list of `input_ids` and reads a
list of answers (`output_ids`, `meta_info.finish_reason.type`), in prompt order.

The body is that of SkyRL's `RemoteInferenceEngine.generate` for the sglang backend, with the
sampling parameters its generator builds for SGLang (`min_p`, `skip_special_tokens`, `no_stop_trim`).
"""

from __future__ import annotations

import pytest

from tests.runtime.processes import http

PROMPTS = [[31, 32], [33, 34, 35], [36]]


def skyrl_sampling_params(max_new_tokens: int, **params) -> dict:
    return {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_new_tokens": max_new_tokens,
        "skip_special_tokens": True,
        "no_stop_trim": True,
    } | params


@pytest.fixture(scope="module")
def manager(operator_registered):
    """SkyRL does not register engines; the manager's operator does."""
    return operator_registered


def test_a_batched_generate_answers_a_list_in_prompt_order(manager):
    body = {
        "input_ids": PROMPTS,
        "sampling_params": skyrl_sampling_params(8, temperature=0.0, ignore_eos=True),
    }
    status, outputs = http("POST", manager.url + "/generate", body)
    assert status == 200, outputs
    assert isinstance(outputs, list) and len(outputs) == len(PROMPTS)
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        assert output["meta_info"]["finish_reason"]["type"] == "length"
        assert output["meta_info"]["prompt_tokens"] == len(prompt)
        single = {"input_ids": prompt, "sampling_params": body["sampling_params"]}
        assert http("POST", manager.url + "/generate", single)[1]["output_ids"] == output["output_ids"]


def test_min_p_of_one_keeps_only_the_likeliest_token(manager):
    """min_p=1 drops every token less likely than the top one: sampling at temperature 1 is greedy."""
    sampled = {"input_ids": PROMPTS, "sampling_params": skyrl_sampling_params(10, min_p=1.0, ignore_eos=True)}
    greedy = {
        "input_ids": PROMPTS,
        "sampling_params": skyrl_sampling_params(10, temperature=0.0, ignore_eos=True),
    }
    got = [o["output_ids"] for o in http("POST", manager.url + "/generate", sampled)[1]]
    assert got == [o["output_ids"] for o in http("POST", manager.url + "/generate", greedy)[1]]


def test_a_batch_with_a_bad_prompt_is_a_400_naming_it(manager):
    body = {"input_ids": [[1, 2], []], "sampling_params": skyrl_sampling_params(4)}
    status, answer = http("POST", manager.url + "/generate", body)
    assert status == 400 and "input_ids is empty" in answer["error"]["message"], answer
    body = {"input_ids": [[1, 2]], "sampling_params": skyrl_sampling_params(4, n=2)}
    status, answer = http("POST", manager.url + "/generate", body)
    assert status == 400 and "n=2" in answer["error"]["message"], answer
