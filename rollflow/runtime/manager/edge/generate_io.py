"""What a `/generate` and a session's turn share (sglang_api.py, sessions_api.py): the manager's
limits on a prompt and its sampling parameters, and SGLang's answer of one sample.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from rollflow.runtime.http.answer import dumps
from rollflow.runtime.http.errors import BadRequest
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.edge.protocol import GenerateBody
from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.sglang import SamplingParamsBody

ID_BYTES_PER_TOKEN = 16
"""Most bytes a prompt's token id takes in a body: 10 digits for the largest id, then ", ", and
room for more white space than any client sends."""


def one_prompt_bytes(config: ManagerConfig) -> int:
    """Largest body of one prompt of `input_ids` that may hold `max_prompt_tokens` tokens: any
    larger one holds more, and is refused before it is read (the other fields get 64 KiB)."""
    return config.max_prompt_tokens * ID_BYTES_PER_TOKEN + (1 << 16)


def one_prompt_limit(config: ManagerConfig) -> tuple[int, str]:
    """`one_prompt_bytes` as a body reader's limit: (bytes, why), for a body known to hold one prompt."""
    bound = one_prompt_bytes(config)
    why = (
        f"one prompt of input_ids this large holds more than max_prompt_tokens={config.max_prompt_tokens} "
        f"tokens (a token id takes at most {ID_BYTES_PER_TOKEN} bytes; bodies above {bound} bytes are refused)"
    )
    return bound, why


def sampling_params(
    body: SamplingParamsBody, config: ManagerConfig, params: SamplingParams | None = None
) -> SamplingParams:
    """The engines' sampling parameters (`params`, when the caller has `body.to_params()` already),
    within this manager's limits (a 400 past them)."""
    params = params or body.to_params()
    if params.max_new_tokens > config.max_new_tokens_limit:
        raise BadRequest(
            f"sampling_params.max_new_tokens={params.max_new_tokens} exceeds this manager's limit "
            f"of {config.max_new_tokens_limit} (max_new_tokens_limit)"
        )
    if params.max_new_tokens < 1:
        raise BadRequest("sampling_params.max_new_tokens must be at least 1 on the manager")
    return params


def check_prompt(prompt: list[int], config: ManagerConfig, where: str) -> None:
    if len(prompt) > config.max_prompt_tokens:
        raise BadRequest(
            f"{where} has {len(prompt)} tokens, above max_prompt_tokens={config.max_prompt_tokens}"
        )


def output_text(sample: Sample, tokenizer: Any) -> str:
    """The sample's text: decoded here with the manager's tokenizer (as the request asked, the stop
    string trimmed as SGLang trims it), else the text the engines sent."""
    if tokenizer is None:
        return sample.engine_text
    params = sample.sampling
    text = tokenizer.decode(sample.output_ids, skip_special_tokens=params.skip_special_tokens)
    if sample.finish_reason == "stop" and not params.no_stop_trim:
        cut = min((text.find(stop) for stop in params.stop if stop in text), default=-1)
        text = text[:cut] if cut >= 0 else text
    return text


class StreamEvents:
    """A streamed sample's events, each SGLang's answer with the whole output so far (as SGLang
    streams by default). Encoding every output id and log-prob entry again per event cost the
    manager time in proportion to the output's length, per token (a third of its CPU per streamed
    token at 8 events per engine write): the JSON of the ids and entries is kept from one event to
    the next and only new tokens' are encoded; the rest of the event is encoded each time. The
    bytes are those of `sse_event(generate_payload(...))`. A sample whose output was discarded
    (restarted from its prompt) starts over."""

    def __init__(self) -> None:
        self._ids = bytearray()  # `output_ids`' JSON so far, without its brackets
        self._entries = bytearray()  # `output_token_logprobs`' JSON so far, without its brackets
        self._count = 0  # the tokens encoded
        self._regenerated = 0

    def event(self, sample: Sample, body: GenerateBody, rid: str, tokenizer: Any) -> bytes:
        output_ids = sample.output_ids
        if sample.regenerated_tokens != self._regenerated or self._count > len(output_ids):
            self.__init__()
            self._regenerated = sample.regenerated_tokens
        start = self._count
        if start < len(output_ids):
            tokens = output_ids[start:]
            comma = b"," if start else b""
            self._ids += comma + dumps(tokens)[1:-1]
            if body.return_logprob and not body.return_text_in_logprobs:
                # the (logprob, token, null) entries zipped in C, not a list built per token
                logprobs = sample.output_logprobs[start:]
                entries = list(zip(logprobs, tokens, repeat(None, len(tokens)), strict=True))
                self._entries += comma + dumps(entries)[1:-1]
            elif body.return_logprob:
                entries = _entries(sample, tokenizer, True, start)
                self._entries += comma + dumps(entries)[1:-1]
            self._count = len(output_ids)
        meta = dumps(_meta(sample, rid))
        if body.return_logprob:
            meta = b'%s,"output_token_logprobs":[%s]}' % (meta[:-1], self._entries)
        text = dumps(output_text(sample, tokenizer))
        return b'data: {"text":%s,"output_ids":[%s],"meta_info":%s}\n\n' % (text, self._ids, meta)


def _entries(sample: Sample, tokenizer: Any, with_text: bool, start: int = 0) -> list[list]:
    """SGLang's `output_token_logprobs` entries of the sample's tokens from `start` on."""
    tokens = sample.output_ids[start:]
    texts = [tokenizer.decode([token]) for token in tokens] if with_text else [None] * len(tokens)
    return [
        [logprob, token, text]
        for logprob, token, text in zip(sample.output_logprobs[start:], tokens, texts, strict=True)
    ]


def _meta(sample: Sample, rid: str) -> dict:
    """SGLang's `meta_info` (with rollflow's spans and resumes), but the log-prob entries."""
    meta: dict = {
        "id": rid,
        "prompt_tokens": len(sample.prompt_ids),
        "completion_tokens": len(sample.output_ids),
        "cached_tokens": sample.cached_tokens,
        "finish_reason": None,
        "weight_version": sample.weight_version,
        "spans": [span.to_json() for span in sample.spans],
        "resumes": sample.resumes,
    }
    if sample.state == SampleState.FINISHED and sample.finish_reason == "abort":
        meta["finish_reason"] = {"type": "abort", "message": sample.error}
    elif sample.state == SampleState.FINISHED:
        meta["finish_reason"] = {"type": sample.finish_reason}
    elif sample.state == SampleState.FAILED:
        meta["finish_reason"] = {"type": "abort", "message": sample.error}
    return meta


def generate_payload(sample: Sample, body: GenerateBody, rid: str, tokenizer: Any) -> dict:
    """SGLang's answer: text, output ids and meta_info (with rollflow's spans and resumes)."""
    meta = _meta(sample, rid)
    if body.return_logprob:
        meta["output_token_logprobs"] = _entries(sample, tokenizer, body.return_text_in_logprobs)
    return {"text": output_text(sample, tokenizer), "output_ids": list(sample.output_ids), "meta_info": meta}
