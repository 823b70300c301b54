"""The OpenAI layer's text handling and request checks, on the tiny model's real tokenizer."""

from __future__ import annotations

import pytest

from rollflow.runtime.openai.serve import TextAssembler, Tokenizer
from rollflow.runtime.wire.openai import ChatBody, CompletionBody, OpenAIError, parse_body


@pytest.fixture(scope="module")
def tokenizer(tiny_model) -> Tokenizer:
    from transformers import AutoTokenizer

    return Tokenizer(AutoTokenizer.from_pretrained(tiny_model), str(tiny_model))


def _feed(assembler: TextAssembler, ids: list[int]) -> list[str]:
    pieces = [assembler.add([token]) for token in ids[:-1]]
    return [*pieces, assembler.add(ids[-1:], final=True)]


def test_pieces_add_up_to_the_whole_decoded_text(tokenizer):
    ids = tokenizer.encode("The event loop runs callbacks, one after another.")
    assembler = TextAssembler(tokenizer, ())
    assert "".join(_feed(assembler, ids)) == tokenizer.decode(ids)
    assert not assembler.stopped


def test_a_stop_string_ends_the_text_before_it_and_is_never_sent_in_part(tokenizer):
    text = "The event loop runs callbacks, one after another."
    ids = tokenizer.encode(text)
    assembler = TextAssembler(tokenizer, ("callbacks",))
    pieces = []
    for token in ids:
        pieces.append(assembler.add([token]))
        if assembler.stopped:
            break
    assert assembler.stopped
    assert "".join(pieces) == "The event loop runs "
    assert all("call" not in piece for piece in pieces)


def test_a_partial_character_is_held_back_until_it_is_whole(tokenizer):
    ids = tokenizer.encode("naïve café ✓")
    assembler = TextAssembler(tokenizer, ())
    pieces = _feed(assembler, ids)
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == "naïve café ✓"


def test_the_chat_template_of_init_model_ends_with_the_assistant_turn(tokenizer):
    ids = tokenizer.chat_prompt([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert tokenizer.decode(ids).endswith("assistant\n")
    assert "Hello" in tokenizer.decode(ids)


def test_a_tokenizer_without_a_chat_template_is_a_400_that_says_so(tiny_model):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(tiny_model)
    raw.chat_template = None
    with pytest.raises(OpenAIError, match="no chat template") as caught:
        Tokenizer(raw, "somewhere").chat_prompt([{"role": "user", "content": "Hi"}], True)
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 2}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_values_that_cannot_be_honoured_are_a_400_naming_the_field(extra, param):
    with pytest.raises(OpenAIError) as caught:
        parse_body(CompletionBody, {"model": "m", "prompt": "hi"} | extra)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


def test_unknown_and_malformed_fields_are_a_400_naming_them():
    with pytest.raises(OpenAIError, match=r"max_token.*did you mean 'max_tokens'"):
        parse_body(CompletionBody, {"model": "m", "prompt": "hi", "max_token": 3})
    with pytest.raises(OpenAIError, match="temperature"):
        parse_body(
            ChatBody, {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": -1}
        )
    with pytest.raises(OpenAIError, match="tools are not supported"):
        parse_body(ChatBody, {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]})


def test_openai_parameters_map_onto_sampling_params():
    body = parse_body(
        CompletionBody,
        {
            "model": "m",
            "prompt": [1, 2],
            "max_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "top_k": 0,
        },
    )
    sampling = body.sampling(body.max_new_tokens())
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.seed, sampling.top_k) == (
        7,
        0,
        0.5,
        3,
        -1,
    )
    chat = parse_body(
        ChatBody, {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5}
    )
    assert chat.max_new_tokens() == 5
