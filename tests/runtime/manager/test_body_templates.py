"""The lean `/generate` path's remembered bodies (sglang_api.BodyTemplates): a body answered from a
template is exactly what pydantic makes of it, and whatever pydantic would convert or refuse is left
to full validation."""

from __future__ import annotations

import pytest

from rollflow.runtime.manager.edge.protocol import GenerateBody
from rollflow.runtime.manager.edge.sglang_api import BodyTemplates
from rollflow.runtime.wire.sglang import MAX_TOKEN_ID

SAMPLING = {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["</s>"], "ignore_eos": False}


def _seen(templates: BodyTemplates, data: dict) -> None:
    body = GenerateBody.model_validate(data)
    templates.put(data, body, body.sampling_params.to_params())


@pytest.mark.parametrize(
    "first, second",
    [
        (
            {"input_ids": [1, 2, 3], "sampling_params": SAMPLING},
            {"input_ids": [7], "sampling_params": SAMPLING},
        ),
        (
            {"input_ids": [1], "sampling_params": SAMPLING, "rid": "a", "return_logprob": True},
            {
                "input_ids": [MAX_TOKEN_ID, 0],
                "sampling_params": SAMPLING,
                "rid": "b" * 256,
                "return_logprob": True,
            },
        ),
        (  # a rid the first body had and the second has not: the second's is None
            {"input_ids": [5, 6], "rid": "x", "model": "m", "image_data": None},
            {"input_ids": [8, 9, 10], "model": "m", "image_data": None},
        ),
    ],
)
def test_a_body_like_one_seen_is_what_pydantic_makes_of_it(first: dict, second: dict) -> None:
    templates = BodyTemplates()
    _seen(templates, first)
    known = templates.get(second)
    assert known is not None
    template, params = known
    expected = GenerateBody.model_validate(second)
    assert (
        template.model_copy(update={"input_ids": second["input_ids"], "rid": second.get("rid")}) == expected
    )
    assert params == expected.sampling_params.to_params()


@pytest.mark.parametrize(
    "input_ids, rid",
    [
        ([1, True], None),  # pydantic converts a bool id to 1: validated in full
        ([1, 2.0], None),  # and a whole float to 2
        ([1, "2"], None),
        ([], None),
        ([-1], None),
        ([MAX_TOKEN_ID + 1], None),
        ([1, [2]], None),
        ("1 2", None),
        ([1], ""),
        ([1], "r" * 257),
        ([1], 7),
    ],
)
def test_ids_or_a_rid_pydantic_would_convert_or_refuse_are_validated_in_full(input_ids, rid) -> None:
    templates = BodyTemplates()
    _seen(templates, {"input_ids": [1, 2], "sampling_params": SAMPLING})
    assert templates.get({"input_ids": input_ids, "sampling_params": SAMPLING, "rid": rid}) is None


@pytest.mark.parametrize("value", [1, 1.0, True, "1"])
def test_fields_equal_in_python_but_not_in_json_type_are_other_bodies(value) -> None:
    templates = BodyTemplates()
    _seen(templates, {"input_ids": [1], "sampling_params": {"temperature": 1}})
    known = templates.get({"input_ids": [2], "sampling_params": {"temperature": value}})
    assert (known is not None) == (type(value) is int)


def test_a_negative_zero_is_not_a_zero() -> None:
    templates = BodyTemplates()
    _seen(templates, {"input_ids": [1], "sampling_params": {"temperature": 0.0}})
    assert templates.get({"input_ids": [2], "sampling_params": {"temperature": 0.0}}) is not None
    assert templates.get({"input_ids": [2], "sampling_params": {"temperature": -0.0}}) is None


def test_a_text_prompt_or_another_field_is_not_served_from_a_template() -> None:
    templates = BodyTemplates()
    _seen(templates, {"input_ids": [1], "sampling_params": SAMPLING})
    assert templates.get({"text": "hi", "sampling_params": SAMPLING}) is None
    assert templates.get({"input_ids": [1], "sampling_params": SAMPLING, "stream": True}) is None
    assert templates.get({"input_ids": [1], "sampling_params": {**SAMPLING, "top_k": 5}}) is None


def test_the_table_is_bounded() -> None:
    templates = BodyTemplates(max_entries=2)
    for tokens in (1, 2, 3):
        _seen(templates, {"input_ids": [1], "sampling_params": {"max_new_tokens": tokens}})
    assert templates.get({"input_ids": [9], "sampling_params": {"max_new_tokens": 3}}) is not None
    assert templates.get({"input_ids": [9], "sampling_params": {"max_new_tokens": 1}}) is None
