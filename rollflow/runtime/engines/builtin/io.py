"""Request bodies the built-in engine accepts: the subset of SGLang's native API it serves.

Field names and defaults follow SGLang's `GenerateReqInput` / `SamplingParams`, so a body written
for SGLang works here unchanged; a field SGLang has and this engine does not is a 400 naming it
(rather than being silently ignored).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollflow.runtime.engines.base import MAX_SEED, MIN_SEED
from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import CodecError


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingParamsBody(_Body):
    """SGLang's `sampling_params` object."""

    max_new_tokens: int = Field(128, ge=0)
    """Tokens to generate at most; the request finishes with `length` when it reaches them."""
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """0 is greedy decoding; otherwise logits are divided by it before sampling. Below
    `GREEDY_BELOW` it is greedy too, as in SGLang: dividing logits by a tiny temperature overflows."""
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = Field(-1, ge=-1)
    """Keep the k most likely tokens; -1 keeps all."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token."""
    stop_token_ids: list[int] = Field(default_factory=list)
    """More token ids that finish the request with `stop` (the eos token always does, unless ignored)."""
    sampling_seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    """Seed of this request's sampler, so a sampled output can be reproduced; None draws one.
    Any 64-bit value, signed or unsigned, what torch's generator takes (the manager's limits too)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the returned `text` (token ids always include them)."""


class GenerateBody(_Body):
    """SGLang's `/generate` body for one sample (batches are one request per sample)."""

    input_ids: list[int] | None = None
    """Prompt token ids; give this or `text`."""
    text: str | None = None
    """Prompt text, tokenized by the engine; give this or `input_ids`."""
    sampling_params: SamplingParamsBody = Field(default_factory=SamplingParamsBody)
    stream: bool = False
    """Answer with server-sent events, one per step, instead of one JSON object."""
    return_logprob: bool = False
    """Add `meta_info.output_token_logprobs` as [[logprob, token_id, text or null], ...]."""
    return_text_in_logprobs: bool = False
    """Put each token's text in the third slot of `output_token_logprobs`."""
    rid: str | None = Field(None, min_length=1, max_length=256)
    """Request id, used by `/abort_request`; the engine makes one when it is absent."""

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids or text")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids is empty")
        if self.text is not None and not self.text:
            raise ValueError("text is empty")
        return self


class AbortBody(_Body):
    rid: str = ""
    """Request to abort; ignored when abort_all is set."""
    abort_all: bool = False
    """Abort every request the engine holds."""


class UpdateWeightsFromDiskBody(_Body):
    model_path: str
    """A folder of *.safetensors files (as `save_pretrained` writes) or one .safetensors file."""
    weight_version: int | None = Field(None, ge=0)
    """Version the engine reports from now on; None adds 1 to the current one."""
    abort_all_requests: bool = False
    """Abort in-flight requests first; otherwise they go on under the new weights."""


class UpdateWeightsFromServerBody(_Body):
    """rollflow's pull-based update (no SGLang counterpart): fetch a version from a weight server."""

    url: str = Field(pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server (`rollflow weights serve`) to pull from; no token is needed to pull."""
    weight_version: int = Field(ge=0)
    """Version to pull; the engine reports it once every tensor is loaded."""
    codec: str = "delta+zstd"
    """Transfer codec; a delta is taken against the version the engine pulled last (full if none)."""

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, value: str) -> str:
        try:
            return CodecSpec.parse(value).name
        except CodecError as exc:
            raise ValueError(str(exc)) from None


class PauseBody(_Body):
    mode: Literal["abort", "retract", "in_place"] = "abort"
    """abort: end in-flight requests with finish_reason abort; in_place: keep them, frozen;
    retract: keep them but drop their KV caches (recomputed on continue)."""


MemoryTag = Literal["weights", "kv_cache", "cuda_graph"]


class MemoryOccupationBody(_Body):
    """SGLang's `/release_memory_occupation` and `/resume_memory_occupation` body."""

    tags: list[MemoryTag] | None = None
    """Regions to release or take back; None is all of them. `cuda_graph` is accepted and has
    nothing to free on a CPU engine."""
