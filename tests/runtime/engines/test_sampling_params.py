"""The built-in engine honours SGLang's whole `sampling_params` as RL clients send them (stop strings,
min_new_tokens, penalties, decoding options), accepts the top-level fields clients and sgl-router
send at their neutral values, refuses the others by name, answers batches with lists and reports its
load as SGLang does."""

from __future__ import annotations

import threading
import time

import pytest

from tests.runtime.engines.helpers import PROMPT
from tests.runtime.processes import http


def _generate(engine, **fields) -> dict:
    params = {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True} | fields.pop("sampling", {})
    status, answer = http(
        "POST", engine.url + "/generate", {"input_ids": PROMPT, "sampling_params": params} | fields
    )
    assert status == 200, answer
    return answer


def test_a_stop_string_ends_the_request_and_is_trimmed_from_the_text_unless_asked(engine):
    plain = _generate(engine)
    # a stop string from the middle of the greedy output
    word = next(
        piece
        for piece in (
            plain["text"][i : i + 2] for i in range(len(plain["text"]) // 2, len(plain["text"]) - 2)
        )
        if piece.isalnum()
    )
    stopped = _generate(engine, sampling={"stop": [word, "never-in-this-output"]})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert stopped["output_ids"] == plain["output_ids"][: len(stopped["output_ids"])]
    assert len(stopped["output_ids"]) < len(plain["output_ids"])
    assert word not in stopped["text"] and plain["text"].startswith(stopped["text"])
    kept = _generate(engine, sampling={"stop": word, "no_stop_trim": True})
    assert kept["output_ids"] == stopped["output_ids"] and word in kept["text"]


def test_min_new_tokens_keeps_stop_tokens_from_ending_the_request_early(engine):
    first = _generate(engine, sampling={"max_new_tokens": 1})["output_ids"][0]
    stopped = _generate(engine, sampling={"stop_token_ids": [first], "max_new_tokens": 6})
    assert stopped["output_ids"] == [first] and stopped["meta_info"]["finish_reason"]["type"] == "stop"
    held = _generate(engine, sampling={"stop_token_ids": [first], "min_new_tokens": 3, "max_new_tokens": 6})
    assert len(held["output_ids"]) >= 3 and first not in held["output_ids"][:3]


@pytest.mark.parametrize(
    "penalty", [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 2.0}]
)
def test_penalties_change_greedy_choices_only_where_a_token_repeats(engine, penalty):
    """Penalties lower only tokens already generated, so greedy decoding changes first where the
    plain output repeats a token (200 tokens of a 512-token vocabulary always repeat some)."""
    plain = _generate(engine, sampling={"max_new_tokens": 200})["output_ids"]
    penalised = _generate(engine, sampling={"max_new_tokens": 200} | penalty)["output_ids"]
    first_repeat = next(i for i, token in enumerate(plain) if token in plain[:i])
    assert penalised[:first_repeat] == plain[:first_repeat]
    assert penalised != plain


def test_min_p_of_one_samples_the_likeliest_token_only(engine):
    greedy = _generate(engine)["output_ids"]
    assert _generate(engine, sampling={"temperature": 1.0, "min_p": 1.0})["output_ids"] == greedy


def test_neutral_fields_clients_and_sgl_router_send_are_accepted(engine):
    router_fields = {
        "model": None,
        "log_metrics": True,
        "return_hidden_states": False,
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
        "return_text_in_logprobs": False,
        "image_data": [],
        "lora_path": None,
        "logprob_start_len": -1,
    }
    sampling = {
        "n": 1,
        "stop": None,
        "stop_token_ids": None,
        "custom_params": {"return_top_p_token_ids": True},
    }
    answer = _generate(engine, sampling=sampling, **router_fields)
    assert answer["output_ids"] == _generate(engine)["output_ids"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"lora_path": "adapter"}, "lora_path='adapter'"),
        ({"image_data": ["img.png"]}, "image_data"),
        ({"return_hidden_states": True}, "return_hidden_states=True"),
        ({"sampling_params": {"n": 2}}, "n=2"),
        ({"sampling_params": {"regex": "a+"}}, "regex"),
        ({"sampling_params": {"logit_bias": {"1": 5.0}}}, "logit_bias"),
        ({"sampling_params": {"min_new_tokens": 9, "max_new_tokens": 3}}, "min_new_tokens"),
        ({"sampling_params": {"stop": [""]}}, "empty string"),
        ({"no_such_field": 1}, "no_such_field: unknown field"),
    ],
)
def test_values_that_cannot_be_honoured_are_a_400_naming_them(engine, fields, named):
    status, answer = http("POST", engine.url + "/generate", {"input_ids": PROMPT} | fields)
    assert status == 400 and named in answer["error"]["message"], answer


def test_a_batched_generate_answers_a_list_in_prompt_order(engine):
    prompts = [PROMPT, PROMPT[:3], [9, 8, 7, 6]]
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    status, answers = http(
        "POST", engine.url + "/generate", {"input_ids": prompts, "sampling_params": params}
    )
    assert status == 200 and len(answers) == 3, answers
    for prompt, answer in zip(prompts, answers, strict=True):
        single = http("POST", engine.url + "/generate", {"input_ids": prompt, "sampling_params": params})[1]
        assert answer["output_ids"] == single["output_ids"]


def test_loads_report_the_running_request_until_it_is_aborted(engine):
    """The engine is paused in place once the request runs, so that it still runs while its load is
    read; a test process starved until the request had ended (a busy machine) tries again."""
    for attempt in range(3):
        rid = f"load-probe-{attempt}"
        body = {
            "rid": rid,
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True},
        }
        result: dict = {}
        thread = threading.Thread(
            target=lambda body=body, result=result: result.update(
                answer=http("POST", engine.url + "/generate", body)
            )
        )
        thread.start()
        deadline = time.monotonic() + 60
        while http("GET", engine.url + "/v1/loads")[1]["loads"][0]["num_running_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert http("POST", engine.url + "/pause_generation", {"mode": "in_place"})[0] == 200
        try:
            running = http("GET", engine.url + "/v1/loads")[1]["loads"][0]["num_running_reqs"]
            if running == 1:
                load = http("GET", engine.url + "/get_load")[1]
                assert load[0]["num_reqs"] == 1 and load[0]["num_tokens"] >= len(PROMPT)
                assert http("POST", engine.url + "/abort_request", {"rid": rid})[0] == 200
        finally:
            assert http("POST", engine.url + "/continue_generation", {})[0] == 200
        thread.join(60)
        if running == 1:
            break
    status, answer = result["answer"]
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "abort"
    loads = http("GET", engine.url + "/v1/loads")[1]
    assert loads["dp_rank_count"] == 1 and loads["loads"][0]["num_running_reqs"] == 0
