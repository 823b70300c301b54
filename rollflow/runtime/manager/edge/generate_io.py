"""What a `/generate` and a session's turn share (sglang_api.py, sessions_api.py): the manager's
limits on a prompt and its sampling parameters, and SGLang's answer of one sample.
"""

from __future__ import annotations

from typing import Any

from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.engines.sglang_io import SamplingParamsBody
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.edge.protocol import GenerateBody
from rollflow.runtime.manager.edge.shared import BadRequest

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


class LogprobEntries:
    """SGLang's `output_token_logprobs` of one sample, kept from one event of its stream to the next:
    each event repeats every entry so far, and building them all again per event cost the manager
    time in proportion to the output's length, per token. Only the entries of new tokens are
    made; a sample whose output was discarded (restarted from its prompt) is built again."""

    def __init__(self) -> None:
        self.entries: list[list] = []
        self._regenerated = 0

    def of(self, sample: Sample, tokenizer: Any, with_text: bool) -> list[list]:
        if sample.regenerated_tokens != self._regenerated or len(self.entries) > len(sample.output_ids):
            self.entries, self._regenerated = [], sample.regenerated_tokens
        start = len(self.entries)
        tokens = sample.output_ids[start:]
        texts = [tokenizer.decode([token]) for token in tokens] if with_text else [None] * len(tokens)
        self.entries += [
            [logprob, token, text]
            for logprob, token, text in zip(sample.output_logprobs[start:], tokens, texts, strict=True)
        ]
        return self.entries


def generate_payload(
    sample: Sample, body: GenerateBody, rid: str, tokenizer: Any, entries: LogprobEntries | None = None
) -> dict:
    """SGLang's answer: text, output ids and meta_info (with rollflow's spans and resumes). A
    stream passes the `entries` it keeps from event to event."""
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
    if body.return_logprob:
        entries = entries or LogprobEntries()
        meta["output_token_logprobs"] = entries.of(sample, tokenizer, body.return_text_in_logprobs)
    return {"text": output_text(sample, tokenizer), "output_ids": list(sample.output_ids), "meta_info": meta}
