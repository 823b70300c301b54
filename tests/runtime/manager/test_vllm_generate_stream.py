"""vLLM's `/inference/v1/generate` streamed from the manager: server-sent events in vLLM's shape,
each holding one choice's new tokens, the same tokens and logprobs as the JSON answer; a stream
whose engine is killed finishes on another with the greedy tokens of an undisturbed run, and with
`resume: restart` (which cannot take streamed tokens back) ends with an error event instead."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from tests.runtime.manager.helpers import greedy_reference, metric, wait_until, workers
from tests.runtime.processes import http

PROMPT = [17, 240, 33, 101, 5]


def _body(max_tokens: int, **extra) -> dict:
    sampling = {"max_tokens": max_tokens, "temperature": 0.0, "logprobs": 1, "ignore_eos": True}
    return {"token_ids": PROMPT, "sampling_params": sampling, "model": "tiny"} | extra


def _events(manager, body: dict) -> Iterator[dict | str]:
    """The stream's events as they come: each parsed, `[DONE]` as the string."""
    request = urllib.request.Request(
        manager.url + "/inference/v1/generate",
        data=json.dumps(body | {"stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for line in response:
            if line.strip():
                data = line.decode().removeprefix("data: ").strip()
                yield data if data == "[DONE]" else json.loads(data)


@pytest.fixture(scope="module")
def manager(module_processes):
    engines = [module_processes.engine() for _ in range(2)]
    return module_processes.manager(engines=[{"url": e.url, "engine_type": "builtin"} for e in engines])


def test_a_stream_holds_the_tokens_and_logprobs_of_the_json_answer(manager):
    body = _body(64, stream_options={"include_usage": True, "continuous_usage_stats": True})
    status, whole = http("POST", manager.url + "/inference/v1/generate", body)
    assert status == 200, whole
    (expected,) = whole["choices"]
    events = list(_events(manager, body))
    assert events[-1] == "[DONE]"
    *token_events, usage = events[:-1]
    choices = [event["choices"][0] for event in token_events]
    assert len(choices) > 1  # streamed as the tokens came, not in one piece
    assert all(len(event["choices"]) == 1 and event["choices"][0]["index"] == 0 for event in token_events)
    assert [t for c in choices for t in c["token_ids"]] == expected["token_ids"]
    assert [e for c in choices for e in c["logprobs"]["content"]] == expected["logprobs"]["content"]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    # continuous usage: each event counts the tokens so far; then include_usage's event, no choices
    assert token_events[-1]["usage"]["completion_tokens"] == 64
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": 64,
        "total_tokens": len(PROMPT) + 64,
    }


def test_n_choices_stream_each_under_its_index(manager):
    events = list(_events(manager, _body(8, sampling_params={"n": 2, "max_tokens": 8, "temperature": 0.0})))
    assert events[-1] == "[DONE]"
    by_index: dict[int, list[int]] = {0: [], 1: []}
    for event in events[:-1]:
        (choice,) = event["choices"]
        by_index[choice["index"]] += choice["token_ids"]
        assert choice["logprobs"] is None  # not asked for
    assert len(by_index[0]) == len(by_index[1]) == 8


def test_a_bad_streamed_request_is_an_error_answer_not_a_stream(manager):
    status, body = http(
        "POST", manager.url + "/inference/v1/generate", _body(8, stream=True, stream_options={"bogus": 1})
    )
    assert status == 400 and "stream_options" in body["error"]["message"]


def _kill_the_busy_engine(manager, engines) -> object:
    """Kill the engine streaming the one request; the other one, its survivor."""
    busy = wait_until(
        lambda: [e for e in engines if workers(manager)[e.url]["running"]], what="a busy engine"
    )
    busy[0].kill()
    return next(e for e in engines if e is not busy[0])


@pytest.mark.parametrize("resume", ["continue", "restart"])
def test_a_stream_whose_engine_is_killed(processes, resume):
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        resume=resume,
        health_interval_s=0.5,
        engines=[{"url": e.url, "engine_type": "builtin"} for e in engines],
    )
    tokens: list[int] = []
    events = []
    for event in _events(manager, _body(300)):
        events.append(event)
        if isinstance(event, dict) and "choices" in event:
            tokens += event["choices"][0]["token_ids"]
        if len(events) == 3:  # streaming: kill the engine that serves it
            survivor = _kill_the_busy_engine(manager, engines)
    assert events[-1] == "[DONE]"
    if resume == "continue":  # finished elsewhere from the tokens it had
        assert tokens == greedy_reference(survivor, PROMPT, 300)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert metric(manager, "rollflow_regenerated_tokens_total") == 0
    else:  # the tokens streamed cannot be taken back: an error event ends the stream, as vLLM's do
        error = events[-2]["error"]
        assert error["code"] == 502 and "resume: restart" in error["message"]
