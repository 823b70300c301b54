"""The `openai` package against the built-in engine: completions and chat, streamed and not, and
the SGLang info routes a router relays."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.runtime.engines.helpers import PROMPT, reference_greedy

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def client(engine) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_token_id_completion_is_transformers_greedy_with_its_logprobs_and_usage(client, model, tiny_model):
    answer = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    tokens, logprobs = reference_greedy(tiny_model, PROMPT, MAX_TOKENS)
    choice = answer.choices[0]
    assert choice.model_extra["token_ids"] == tokens
    assert choice.logprobs.token_logprobs == pytest.approx(logprobs, abs=1e-4)
    assert choice.finish_reason == "length"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(PROMPT), MAX_TOKENS)
    assert answer.object == "text_completion" and answer.model == model


def test_streamed_completion_adds_up_to_the_whole_one(client, model):
    args = dict(model=model, prompt="The event loop", max_tokens=MAX_TOKENS, temperature=0)
    whole = client.completions.create(**args, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            **args, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert len(chunks) >= 3  # streamed as it goes


def test_chat_applies_the_tokenizers_template_streamed_or_not(client, model, tiny_model):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    whole = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True
    )
    templated = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert whole.usage.prompt_tokens == len(AutoTokenizer.from_pretrained(tiny_model).encode(templated))
    assert whole.choices[0].message.role == "assistant"
    assert len(whole.choices[0].logprobs.content) == whole.usage.completion_tokens
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_bad_input_is_an_openai_shaped_400(client, model):
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model=model, prompt=[5, 100000], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="only n=1") as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], n=3)
    assert caught.value.body["param"] == "n"


def test_info_routes_name_the_model_and_flush_cache_succeeds(engine, model):
    info = _get(engine.url + "/get_server_info")
    assert info["model_path"] == model and info["weight_version"] == 0
    assert info["internal_states"][0]["paused"] is False
    request = urllib.request.Request(engine.url + "/flush_cache", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["success"] is True
