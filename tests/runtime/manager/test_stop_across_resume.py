"""A stop string that begins before a resume and ends after it stops the sample where an
undisturbed engine would: the new engine sees only its own text, so the manager looks across,
and keeps tokens up to the one that completed it even when a busy engine sent several in one event."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from rollflow.runtime.manager.client import ManagerClient
from rollflow.runtime.manager.durability.stops import SpanningStop
from tests.runtime.manager.helpers import EngineProxy
from tests.runtime.processes import http

PROMPT = [11, 3, 60]
MAX_NEW_TOKENS = 40


class CutAfter(EngineProxy):
    """A real engine whose `/generate` stream breaks right after token `cut` (greedy, so the sample
    resumes elsewhere at exactly that token). A busy engine sends several tokens in one event, so
    the event that reaches `cut` is cut back to it: its first `cut` tokens (the engine's events are
    cumulative) and their text, `before`."""

    def __init__(self, backend_url: str, cut: int, before: str) -> None:
        self.cut, self.before = cut, before
        super().__init__(backend_url)

    async def forward_line(self, response: web.StreamResponse, line: bytes, index: int) -> bool:
        if not line.startswith(b"data: {"):
            await response.write(line)
            return True
        event = json.loads(line[6:])
        meta = event["meta_info"]
        if meta["completion_tokens"] < self.cut:
            await response.write(line)
            return True
        event["output_ids"] = event["output_ids"][: self.cut]
        event["text"] = self.before
        meta["completion_tokens"], meta["finish_reason"] = self.cut, None
        meta["output_token_logprobs"] = meta["output_token_logprobs"][: self.cut]
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        return False


class Batched(EngineProxy):
    """A real engine as a busy one streams: its cumulative events passed on only every `every`
    tokens (and the last), so one event brings several tokens."""

    def __init__(self, backend_url: str, every: int) -> None:
        self.every = every
        self._passed = True
        super().__init__(backend_url)

    async def forward_line(self, response: web.StreamResponse, line: bytes, index: int) -> bool:
        if line.startswith(b"data: {"):
            meta = json.loads(line[6:])["meta_info"]
            self._passed = meta["finish_reason"] is not None or meta["completion_tokens"] % self.every == 0
        if self._passed:  # a held event's blank line goes with it
            await response.write(line)
        return True


def generate(engine, **sampling) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0, "ignore_eos": True, **sampling}}
    status, answer = http("POST", engine.url + "/generate", body)
    assert status == 200, answer
    return answer


def _spanning_stop(healthy) -> tuple[int, str, str]:
    """A cut point and a 4-character stop string that begins 2 characters before it and is seen
    nowhere earlier in the greedy output: (cut, text before the cut, stop)."""
    full = generate(healthy, max_new_tokens=MAX_NEW_TOKENS)["text"]
    for cut in range(4, MAX_NEW_TOKENS - 4):
        before = generate(healthy, max_new_tokens=cut)["text"]
        stop = full[len(before) - 2 : len(before) + 2]
        if (
            len(before) >= 2
            and full.startswith(before)
            and len(stop) == 4
            and full.find(stop) == len(before) - 2
        ):
            return cut, before, stop
    raise AssertionError(f"no cut point in {full!r} suits a spanning stop string")


@pytest.mark.parametrize("every", [1, 3], ids=["token-per-event", "three-tokens-per-event"])
def test_a_stop_string_spanning_a_resume_stops_the_sample_there(processes, tiny_model, every):
    real, healthy = processes.engine(), processes.engine()
    cut, before, stop = _spanning_stop(healthy)
    undisturbed = generate(healthy, max_new_tokens=MAX_NEW_TOKENS, stop=[stop])
    assert undisturbed["meta_info"]["finish_reason"]["type"] == "stop"
    assert cut < len(undisturbed["output_ids"]) < MAX_NEW_TOKENS

    proxy, busy = CutAfter(real.url, cut, before), Batched(healthy.url, every)
    try:
        # the tokenizer tells which of an event's tokens completed the stop string
        manager = processes.manager(
            router="round_robin", engines=[{"url": proxy.url}, {"url": busy.url}], tokenizer=str(tiny_model)
        )
        answer = ManagerClient(manager.url).generate(
            PROMPT, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True, stop=[stop]
        )
    finally:
        proxy.stop()
        busy.stop()
    meta = answer["meta_info"]
    assert meta["resumes"] == 1 and meta["spans"][0]["engine_url"] == proxy.url, meta
    assert len(meta["spans"]) == 2 and meta["spans"][1]["engine_url"] == busy.url
    assert answer["output_ids"] == undisturbed["output_ids"]
    assert meta["finish_reason"]["type"] == "stop"
    assert answer["text"] == undisturbed["text"] == before[:-2]


def test_a_spanning_stop_is_found_from_an_earlier_text_of_any_length():
    # the earlier text shorter than the stop string's reach: all of it may begin the stop string
    assert SpanningStop("ab", ["abcd"]).find("cd", may_stop=True) == 0
    assert SpanningStop("xab", ["abcd"]).find("cdz", may_stop=True) == 1
    # wholly in the new text: the engine's own to find; held back while min_new_tokens is not met
    assert SpanningStop("xab", ["cd"]).find("cd", may_stop=True) is None
    assert SpanningStop("xa", ["abcd"]).find("bcd", may_stop=False) is None
