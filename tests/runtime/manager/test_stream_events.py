"""A streamed `/generate`'s events, built from the JSON kept from one event to the next
(generate_io.StreamEvents), are byte for byte those of the whole answer encoded again per event."""

from __future__ import annotations

import pytest

from rollflow.runtime.http.sse import event as sse_event
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.edge.generate_io import StreamEvents, generate_payload
from rollflow.runtime.manager.edge.protocol import GenerateBody
from rollflow.runtime.wire.base import SamplingParams


class _Tokenizer:
    """Decodes token t as `<t>`: enough to tell the texts apart."""

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{token}>" for token in tokens)


def _sample() -> Sample:
    return Sample(seq=1, sample_id="s-1", prompt_ids=[4, 5, 6], sampling=SamplingParams(max_new_tokens=64))


@pytest.mark.parametrize(
    ("return_logprob", "with_text", "tokenizer"),
    [(True, False, None), (False, False, None), (True, True, _Tokenizer()), (True, False, _Tokenizer())],
)
def test_each_event_is_the_whole_answer_encoded_again(return_logprob, with_text, tokenizer):
    body = GenerateBody(
        input_ids=[4, 5, 6],
        stream=True,
        return_logprob=return_logprob,
        return_text_in_logprobs=with_text,
    )
    sample, events = _sample(), StreamEvents()

    def check() -> None:
        assert events.event(sample, body, "r-1", tokenizer) == sse_event(
            generate_payload(sample, body, "r-1", tokenizer)
        )

    sample.begin_attempt(0)
    check()  # no token yet
    sample.engine_texts[1] = "ab"
    sample.record(0, "http://e0", 3, [11, 12, 13], [-0.5, -0.25, -1.0])
    check()
    check()  # nothing new
    sample.record(0, "http://e0", 4, [14], [-2.0])  # a new version: a new span
    check()
    sample.begin_attempt(1)  # resumed elsewhere
    sample.resumes += 1
    sample.record(1, "http://e1", 4, [15, 16], [-0.125, 0.0])
    check()
    sample.discard_output()  # restarted from its prompt: the events start over
    sample.record(1, "http://e1", 4, [21, 22, 23, 24], [-1.5, -1.5, -1.5, -1.5])
    check()
    sample.record(1, "http://e1", 4, [25], [-3.0])
    sample.state, sample.finish_reason = SampleState.FINISHED, "length"
    check()


def test_a_discarded_output_shorter_than_what_was_sent_starts_over():
    body = GenerateBody(input_ids=[4, 5, 6], stream=True, return_logprob=True)
    sample, events = _sample(), StreamEvents()
    sample.begin_attempt(0)
    sample.record(0, "http://e0", 0, [1, 2, 3], [-1.0, -1.0, -1.0])
    events.event(sample, body, "r", None)
    sample.discard_output()
    sample.record(0, "http://e0", 0, [7], [-0.5])
    sample.state, sample.error = SampleState.FAILED, "engine gone"
    assert events.event(sample, body, "r", None) == sse_event(generate_payload(sample, body, "r", None))
