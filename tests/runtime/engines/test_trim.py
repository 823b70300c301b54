"""The C `trim_event` (rollflow/runtime/engines/_trim.c) against its Python reference
(`trim_event_py`): the same bytes, or both None, for SGLang events, events cut at every byte, and
events with every part bent out of shape; and what it cuts is what a full parse would slice off."""

from __future__ import annotations

import random

import orjson
import pytest

from rollflow.runtime.engines.trim import trim_event_py
from tests.compiled import require_compiled

trim_event = require_compiled("rollflow.runtime.engines._trim").trim_event


def sglang_event(tokens: int, text: str | None = None, **meta) -> bytes:
    ids = list(range(1, tokens + 1))
    info = {
        "id": "r",
        "completion_tokens": tokens,
        "finish_reason": None,
        "weight_version": "3",
        "output_token_logprobs": [[-0.5 * t, t, text] for t in ids],
        **meta,
    }
    return orjson.dumps({"text": "ab", "output_ids": ids, "meta_info": info})


def trimmed_parse(data: bytes, drop: int) -> dict:
    """What a full parse gives, with both lists' first `drop` elements sliced off."""
    payload = orjson.loads(data)
    payload["output_ids"] = payload["output_ids"][drop:]
    meta = payload["meta_info"]
    meta["output_token_logprobs"] = meta["output_token_logprobs"][drop:]
    return payload


EVENTS = [
    sglang_event(6),
    sglang_event(6, text="x"),
    sglang_event(6, text='a "quoted", [bracketed] \\ text\n'),
    sglang_event(6, spans=[{"text": "caf\u00e9 ]}"}]),  # orjson writes é as UTF-8: kept as it is
    sglang_event(6, finish_reason={"type": "stop", "matched": [1, {"a": "]"}]}),
    orjson.dumps(
        {"meta_info": {"output_token_logprobs": [[1.5e-3, 1, None]] * 4, "x": []}, "output_ids": [1] * 4}
    ),
    b' { "output_ids" : [ 1 , 2 ,3] ,"meta_info":{"output_token_logprobs":[ [ -1 , 1 , null ] ,'
    b' [-2,2,"t\\u00e9\\n"],[-3E+2,3,true]] } } ',
]

BENT = [
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]},"output_ids":[1,2]}',
    b'{"meta_info":{},"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]],'
    b'"output_token_logprobs":[]}}',
    b'{"output_\\u0069ds":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]}}',
    b'{"output_ids":[01,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,[]],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,"\xc3\xa9"],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,"\\x"],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[NaN,1,null],[2,2,null]]}}',
    b'{"output_ids":[1,2,],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null],]}}',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]}} x',
    b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]},"z":{]}',
    b'{"output_ids":{"a":1},"meta_info":{"output_token_logprobs":[[1,1,null],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":[],"x":{"output_token_logprobs":[[1,1,null],[2,2,null]]}}',
    b'{"output_ids":[1,2],"meta_info":{"deep":' + b"[" * 600 + b"]" * 600 + b"}}",
    b"[1, 2]",
    b"",
]


def agree(data: bytes, drop: int) -> bytes | None:
    got = trim_event(data, drop)
    assert got == trim_event_py(data, drop), (data, drop)
    assert got == trim_event(memoryview(data), drop) == trim_event(bytearray(data), drop)
    return got


@pytest.mark.parametrize("data", EVENTS, ids=range(len(EVENTS)))
def test_an_event_loses_the_tokens_seen_and_nothing_else(data):
    count = len(orjson.loads(data)["output_ids"])
    assert agree(data, 0) is None and agree(data, -1) is None
    for drop in range(1, count + 1):
        assert orjson.loads(agree(data, drop)) == trimmed_parse(data, drop), drop
    assert agree(data, count + 1) is None  # fewer tokens than were seen: parsed whole


@pytest.mark.parametrize("data", EVENTS + BENT, ids=range(len(EVENTS + BENT)))
def test_every_cut_and_every_byte_answer_alike(data):
    for cut in range(len(data) + 1):
        agree(data[:cut], 1)
    for index in range(len(data)):
        for byte in b' ,:[]{}"\\0e-n':
            agree(data[:index] + bytes([byte]) + data[index + 1 :], 1)


@pytest.mark.parametrize("data", BENT, ids=range(len(BENT)))
def test_events_of_another_shape_are_left_whole(data):
    assert agree(data, 1) is None


def test_random_events_answer_alike():
    rng = random.Random(11)
    alphabet = b'{}[],:" \\ntrufalsenul0123456789.eE+-abcdeioptu_\xc3\xa9'
    for _ in range(3000):
        data = bytearray(sglang_event(rng.randint(1, 5), text=rng.choice([None, "a"])))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.choice(alphabet)
        agree(bytes(data), rng.randint(1, 3))
