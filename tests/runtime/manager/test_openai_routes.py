"""The `openai` package against the manager: completions and chat, streamed and not, every token a
tracked manager sample, and a sample whose engine is killed mid-stream finished elsewhere."""

from __future__ import annotations

import threading

import openai
import pytest

from tests.runtime.manager.helpers import greedy_reference, metric, wait_until, workers
from tests.runtime.processes import http

PROMPT = [17, 240, 33, 101, 5]


def _client(manager) -> openai.OpenAI:
    return openai.OpenAI(base_url=manager.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def fleet(module_processes, tiny_model):
    engines = [module_processes.engine() for _ in range(2)]
    manager = module_processes.manager(
        token="admin-token", tokenizer=str(tiny_model), engines=[{"url": e.url} for e in engines]
    )
    return manager, engines


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_completion_of_token_ids_is_greedy_tracked_and_counted(fleet, hf_tokenizer):
    manager, engines = fleet
    before = metric(manager, "rollflow_finished_samples_total")
    answer = _client(manager).completions.create(
        model="any-name",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    expected = greedy_reference(engines[0], PROMPT, 16)
    choice = answer.choices[0]
    assert choice.model_extra["token_ids"] == expected
    assert choice.text == hf_tokenizer.decode(expected, skip_special_tokens=True)
    assert len(choice.logprobs.token_logprobs) == 16 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert choice.finish_reason == "length" and answer.model == "any-name"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        5,
        16,
        21,
    )
    assert metric(manager, "rollflow_finished_samples_total") == before + 1  # one manager sample


def test_text_completion_streams_the_same_text_with_usage_last(fleet):
    manager, _ = fleet
    client = _client(manager)
    args = dict(
        model="m", prompt="The event loop", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert len(chunks) >= 3


def test_chat_uses_the_tokenizers_template_streamed_or_not(fleet, hf_tokenizer):
    manager, _ = fleet
    client = _client(manager)
    messages = [{"role": "user", "content": "Hello there"}]
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=10, temperature=0)
    prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert whole.usage.prompt_tokens == len(hf_tokenizer.encode(prompt, add_special_tokens=False))
    chunks = list(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_stop_string_ends_the_text_before_it(fleet):
    manager, _ = fleet
    client = _client(manager)
    args = dict(model="m", prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**args, max_tokens=24).choices[0].text
    stop = full[8:11]
    cut = full.index(stop)
    for stream in (False, True):
        answer = client.completions.create(**args, max_tokens=24, stop=[stop], stream=stream)
        choices = [c.choices[0] for c in answer] if stream else answer.choices
        assert "".join(c.text for c in choices) == full[:cut]
        assert choices[-1].finish_reason == "stop"


def test_openai_routes_need_no_token_and_bad_values_are_400s(fleet):
    manager, _ = fleet
    client = _client(manager)
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        client.completions.create(model="m", prompt=PROMPT, n=2)
    with pytest.raises(openai.BadRequestError, match="max_new_tokens_limit"):
        client.completions.create(model="m", prompt=PROMPT, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="m", prompt=[1, 10**6], max_tokens=2)
    status, body = http("POST", manager.url + "/v1/chat/completions", {"model": "m", "messages": []})
    assert status == 400 and "messages" in body["error"]["message"]


def test_a_stream_whose_engine_is_killed_finishes_on_another_with_nothing_regenerated(processes, tiny_model):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        tokenizer=str(tiny_model), health_interval_s=0.5, engines=[{"url": e.url} for e in engines]
    )
    stream = _client(manager).completions.create(
        model="m",
        prompt=PROMPT,
        max_tokens=300,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    token_ids: list[int] = []
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices:
            token_ids += chunk.choices[0].model_extra.get("token_ids", [])
        if len(chunks) == 3:  # streaming: kill the engine that serves it
            busy = wait_until(
                lambda: [e for e in engines if workers(manager)[e.url]["running"]], what="a busy engine"
            )
            busy[0].kill()
            survivor = next(e for e in engines if e is not busy[0])
    assert token_ids == greedy_reference(survivor, PROMPT, 300)
    assert chunks[-1].usage.completion_tokens == 300
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert metric(manager, "rollflow_resumed_samples_total") == 1
    assert metric(manager, "rollflow_regenerated_tokens_total") == 0


def test_with_resume_restart_an_unstreamed_answer_holds_only_the_regenerated_tokens(processes, tiny_model):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        tokenizer=str(tiny_model),
        resume="restart",
        health_interval_s=0.5,
        engines=[{"url": e.url} for e in engines],
    )
    answers = []
    request = threading.Thread(
        target=lambda: answers.append(
            _client(manager).completions.create(
                model="m",
                prompt=PROMPT,
                max_tokens=300,
                temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
        )
    )
    request.start()
    busy = wait_until(
        lambda: [
            e for e in engines if (w := workers(manager)[e.url])["running"] and w["tokens_generated"] >= 20
        ],
        what="an engine 20 tokens into the sample",
    )
    busy[0].kill()
    request.join(timeout=120)
    survivor = next(e for e in engines if e is not busy[0])
    assert answers[0].choices[0].model_extra["token_ids"] == greedy_reference(survivor, PROMPT, 300)
    assert answers[0].usage.completion_tokens == 300
    assert metric(manager, "rollflow_regenerated_tokens_total") >= 20


def test_a_rendered_chat_generates_what_the_chat_route_answers(fleet, hf_tokenizer):
    """vLLM's render then vLLM's generate, on the manager: the chat template's token ids, and a
    body that /inference/v1/generate answers with the tokens /v1/chat/completions gives."""
    manager, _ = fleet
    messages = [{"role": "user", "content": "hello there"}]
    chat = {"model": "m", "messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": True}
    status, rendered = http("POST", manager.url + "/v1/chat/completions/render", chat | {"session_id": "t-1"})
    assert status == 200, rendered
    prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered["token_ids"] == hf_tokenizer.encode(prompt, add_special_tokens=False)
    assert rendered["sampling_params"]["max_tokens"] == 12 and rendered["sampling_params"]["logprobs"] == 0
    assert rendered["features"] is None and rendered["model"] == "m" and rendered["stream"] is False
    status, generated = http("POST", manager.url + "/inference/v1/generate", rendered)
    assert status == 200, generated
    answer = _client(manager).chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
    )
    assert generated["choices"][0]["token_ids"] == answer.choices[0].model_extra["token_ids"]
    assert len(generated["choices"][0]["logprobs"]["content"]) == len(
        answer.choices[0].model_extra["token_ids"]
    )
    status, body = http(
        "POST", manager.url + "/v1/chat/completions/render", chat | {"tools": [{"type": "x"}]}
    )
    assert status == 400 and "tools" in body["error"]["message"]
