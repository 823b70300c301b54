"""SGLang's `/generate` request as RL clients really send it, validated once for the manager and the
built-in engine.

slime, AReaL, SkyRL, verl and sgl-router send more than the fields rollout needs: decoding options
(`skip_special_tokens`, `no_stop_trim`, ...), multimodal and LoRA slots left empty (`image_data: []`,
`lora_path: null`), and the bookkeeping sgl-router adds when it forwards (`model`, `log_metrics`,
`return_hidden_states: false`, ...). Every field here is either honoured or accepted only at a value
that asks for nothing (its "neutral" value); any other value is a 400 that names the field and what
this server can do instead. A field SGLang does not have at all stays a 400 too ("unknown field").

`SamplingParamsBody.to_params()` turns the edge body into the one `SamplingParams` every engine
client and the built-in engine use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator, model_validator

from rollflow.runtime.wire.base import (
    MAX_SEED,
    MAX_TOKEN_ID,
    MIN_SEED,
    Body,
    Int,
    SamplingParams,
    edge_sampling,
)

MAX_STOP_STRINGS = 64


def _is_empty(value: Any) -> bool:
    return value is None or value == [] or value == "" or value == {}


def _is_false(value: Any) -> bool:
    return value is None or value is False


def _anything(value: Any) -> bool:
    return True


# field -> (test of a value that asks for nothing, what to say when a value asks for something)
Neutral = dict[str, tuple[Callable[[Any], bool], str]]

TOP_LEVEL_NEUTRAL: Neutral = {
    "image_data": (_is_empty, "no multimodal input is served; send it empty or null"),
    "video_data": (_is_empty, "no multimodal input is served; send it empty or null"),
    "audio_data": (_is_empty, "no multimodal input is served; send it empty or null"),
    "lora_path": (_is_empty, "no LoRA adapter is served; send null"),
    "lora_id": (_is_empty, "no LoRA adapter is served; send null"),
    "return_hidden_states": (_is_false, "hidden states are not returned; send false"),
    "return_routed_experts": (_is_false, "routed experts are not returned; send false"),
    "routed_experts_start_len": (lambda v: v in (None, 0), "routed experts are not returned"),
    "return_bytes": (_is_false, "send false"),
    "return_entropy": (_is_false, "entropies are not returned; send false"),
    "background": (_is_false, "background requests are not served; send false"),
    "require_reasoning": (_is_false, "send false"),
    "logprob_start_len": (lambda v: v in (None, -1), "prompt logprobs are not returned; send -1 or null"),
    "top_logprobs_num": (lambda v: v in (None, 0), "top logprobs are not returned; send 0 or null"),
    "token_ids_logprob": (_is_empty, "logprobs of chosen token ids are not returned; send null"),
    "custom_logit_processor": (_is_empty, "custom logit processors are not run; send null"),
    "bootstrap_host": (_is_empty, "prefill/decode disaggregation is not served; send null"),
    "bootstrap_port": (_is_empty, "prefill/decode disaggregation is not served; send null"),
    "bootstrap_room": (_is_empty, "prefill/decode disaggregation is not served; send null"),
    "data_parallel_rank": (lambda v: v in (None, 0), "there is one data-parallel rank (0)"),
    "session_params": (_is_empty, "sessions are not served; send null"),
    "priority": (_is_empty, "priority scheduling is not served; send null"),
    # routing and logging hints: sgl-router adds them when it forwards; they ask nothing of the output
    "model": (_anything, ""),
    "log_metrics": (_anything, ""),
    "no_logs": (_anything, ""),
    "external_trace_header": (_anything, ""),
}

SAMPLING_NEUTRAL: Neutral = {
    "n": (lambda v: v in (None, 1), "one sample per request; send n requests (or a batch) for more"),
    "regex": (_is_empty, "constrained decoding is not served; send null"),
    "json_schema": (_is_empty, "constrained decoding is not served; send null"),
    "ebnf": (_is_empty, "constrained decoding is not served; send null"),
    "structural_tag": (_is_empty, "constrained decoding is not served; send null"),
    "stop_regex": (_is_empty, "stop regexes are not served; use stop strings"),
    "logit_bias": (_is_empty, "logit bias is not served; send null"),
    # parameters of a custom logit processor, which SGLang too ignores when none is given
    "custom_params": (_anything, ""),
    "stream_interval": (_anything, ""),
}


def drop_neutral(data: Any, neutral: Neutral, where: str) -> Any:
    """`data` without the fields that ask for nothing; ValueError naming one that asks for more."""
    if not isinstance(data, dict):
        return data
    kept = {}
    for key, value in data.items():
        rule = neutral.get(key)
        if rule is None:
            kept[key] = value
            continue
        is_neutral, hint = rule
        if not is_neutral(value):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise ValueError(f"{where}{key}={shown} cannot be honoured by this server: {hint}")
    return kept


class SamplingParamsBody(Body):
    """SGLang's `sampling_params` object (field names and defaults are SGLang's)."""

    max_new_tokens: Int = Field(128, ge=0)
    """Tokens to generate at most; the request finishes with `length` when it reaches them."""
    min_new_tokens: Int = Field(0, ge=0)
    """End-of-sequence and stop tokens cannot end the request before this many tokens."""
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """0 is greedy decoding; otherwise logits are divided by it before sampling."""
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Int = Field(-1, ge=-1, le=MAX_TOKEN_ID)
    """Keep the k most likely tokens; -1 (or 0) keeps all."""
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0, allow_inf_nan=False)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    """Strings that end the request with `stop` once the output text holds one."""
    stop_token_ids: list[int] | None = None
    """More token ids that finish the request with `stop` (null is none)."""
    sampling_seed: Int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    """A 64-bit seed of this request's sampler (what torch's and vLLM's generators take)."""
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    """Keep the matched stop string at the end of `text`."""

    @model_validator(mode="before")
    @classmethod
    def _neutral(cls, data: Any) -> Any:
        return drop_neutral(data, SAMPLING_NEUTRAL, "")

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        strings = [value] if isinstance(value, str) else value or []
        if any(not s for s in strings):
            raise ValueError("stop holds an empty string, which would stop every request at once")
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"stop holds {len(strings)} strings, above {MAX_STOP_STRINGS}")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids(cls, value: list[int] | None) -> list[int] | None:
        bad = next((t for t in value or [] if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise ValueError(f"holds {bad}, which is no token id (0..{MAX_TOKEN_ID})")
        return value

    @model_validator(mode="after")
    def _min_below_max(self) -> SamplingParamsBody:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) is above max_new_tokens ({self.max_new_tokens})"
            )
        return self

    def to_params(self) -> SamplingParams:
        return edge_sampling(self, "sglang")


class GenerateBody(Body):
    """SGLang's `/generate` body for one sample; a batch is split into these (`split_batch`)."""

    input_ids: list[int] | None = None
    """Prompt token ids; give this or `text`."""
    text: str | None = None
    """Prompt text, tokenized by the server; give this or `input_ids`."""
    sampling_params: SamplingParamsBody = Field(default_factory=SamplingParamsBody)
    stream: bool = False
    """Answer with server-sent events instead of one JSON object."""
    return_logprob: bool = False
    """Add `meta_info.output_token_logprobs` as [[logprob, token_id, text or null], ...]."""
    return_text_in_logprobs: bool = False
    """Put each token's text in the third slot of `output_token_logprobs`."""
    rid: str | None = Field(None, min_length=1, max_length=256)
    """Request id, used by `/abort_request`; the server makes one when it is absent."""

    @model_validator(mode="before")
    @classmethod
    def _neutral(cls, data: Any) -> Any:
        return drop_neutral(data, TOP_LEVEL_NEUTRAL, "")

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids or text")
        if self.input_ids is not None:
            if not self.input_ids:
                raise ValueError("input_ids is empty")
            bad = next((t for t in self.input_ids if not 0 <= t <= MAX_TOKEN_ID), None)
            if bad is not None:
                raise ValueError(f"input_ids holds {bad}, which is no token id (0..{MAX_TOKEN_ID})")
        if self.text is not None and not self.text:
            raise ValueError("text is empty")
        return self


BATCHED_KEYS = ("sampling_params", "rid")


def split_batch(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The per-prompt bodies of a batched `/generate` (a list of prompts), None for one prompt.

    As in SGLang, `sampling_params` and `rid` may be one value for all prompts or a list with one
    per prompt. ValueError names what does not line up.
    """
    prompts = data.get("input_ids")
    key = "input_ids"
    if not (isinstance(prompts, list) and prompts and isinstance(prompts[0], list)):
        prompts, key = data.get("text"), "text"
        if not isinstance(prompts, list):
            return None
    if not prompts:
        raise ValueError(f"{key} is an empty batch")
    if data.get("stream"):
        raise ValueError("stream with a batched /generate is not served; send one request per prompt")
    items = []
    for index, prompt in enumerate(prompts):
        item = {**data, key: prompt}
        for field in BATCHED_KEYS:
            value = data.get(field)
            if isinstance(value, list):
                if len(value) != len(prompts):
                    raise ValueError(f"{field} has {len(value)} entries for {len(prompts)} prompts")
                item[field] = value[index]
        items.append(item)
    return items


class AbortBody(Body):
    """SGLang's `/abort_request` body (the built-in engine's and the manager's)."""

    rid: str = ""
    """Request to abort (the `rid` of a /generate, or a batch sample's id); ignored with abort_all."""
    abort_all: bool = False
    """Abort every request held (on the manager: /generate's and batches' samples alike)."""
