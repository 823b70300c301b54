"""Bodies of the manager's HTTP API, validated strictly: an unknown field is a 400 that names it.

`GenerateBody` is SGLang's `/generate` request (the subset rollout needs), so an SGLang
client can talk to the manager as if it were one engine.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rollflow.config import StrictModel
from rollflow.runtime.engines.base import MAX_SEED, MIN_SEED

MAX_TOKEN_ID = 2**31 - 1
"""Token ids above this fit no vocabulary (engines index int32/int64 tensors with them)."""


class SamplingBody(StrictModel):
    """Limits mirror what an engine can honour, so a value it would choke on is a 400 here, before routing."""

    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1, le=MAX_TOKEN_ID)
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]] = Field(default_factory=list)
    sampling_seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    """A 64-bit seed (what torch's and vLLM's generators take)."""


class GenerateBody(StrictModel):
    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: SamplingBody = SamplingBody()
    stream: bool = False
    return_logprob: bool = False
    rid: str | None = Field(None, min_length=1, max_length=256)
    allow_off_policy: bool = False
    """rollflow extension: the sample may continue on an engine with other weights."""

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateBody:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids or text")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids is empty")
        if self.input_ids is not None and min(self.input_ids) < 0:
            raise ValueError("input_ids holds a negative token id")
        if self.input_ids is not None and max(self.input_ids) > MAX_TOKEN_ID:
            raise ValueError(f"input_ids holds a token id above {MAX_TOKEN_ID}")
        if self.text is not None and not self.text:
            raise ValueError("text is empty")
        return self


class BatchBody(StrictModel):
    prompts: list[list[int]] = Field(min_length=1)
    """Prompts as token ids; each becomes a group of `n` samples."""
    n: int = Field(1, ge=1, le=4096)
    sampling_params: SamplingBody = SamplingBody()
    allow_off_policy: bool = False

    @model_validator(mode="after")
    def _non_empty_prompts(self) -> BatchBody:
        for index, prompt in enumerate(self.prompts):
            if not prompt:
                raise ValueError(f"prompts[{index}] is empty")
            if min(prompt) < 0:
                raise ValueError(f"prompts[{index}] holds a negative token id")
            if max(prompt) > MAX_TOKEN_ID:
                raise ValueError(f"prompts[{index}] holds a token id above {MAX_TOKEN_ID}")
        return self


class NextMicroBatchBody(StrictModel):
    min_groups: int = Field(1, ge=1)
    max_groups: int = Field(1 << 30, ge=1)
    timeout_s: float | None = Field(None, ge=0, le=3600)

    @model_validator(mode="after")
    def _ordered(self) -> NextMicroBatchBody:
        if self.max_groups < self.min_groups:
            raise ValueError(f"max_groups ({self.max_groups}) is below min_groups ({self.min_groups})")
        return self


class WorkerBody(StrictModel):
    url: str = Field(pattern=r"^https?://[^\s/]+(/.*)?$")
    kind: Literal["local", "remote", "spot"] = "local"
    engine_type: Literal["sglang", "vllm", "builtin"] = "sglang"
    capacity: int = Field(64, ge=1, le=100_000)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    """The engine's --api-key: the manager sends it as a bearer token on every call (sgl-router's field)."""


class StepReportBody(StrictModel):
    step_time_s: float = Field(gt=0)
    bubble_s: float = Field(ge=0)
    rollout_s: float | None = Field(None, gt=0)
    """Time the step's rollout took; the launcher's autoscaler reads it back from GET /step_report."""


class UpdateWeightsBody(StrictModel):
    """Give exactly one source: a folder the engine reads, or a weight server it pulls from."""

    model_path: str | None = Field(None, min_length=1)
    """Checkpoint folder on a disk the engine can read."""
    weights_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server (`rollflow weights serve`) the engine pulls `weight_version` from (built-in engines)."""
    codec: str | None = None
    """Pull codec (with weights_url only); the engine's default (delta+zstd) when absent."""
    weight_version: int = Field(ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> UpdateWeightsBody:
        if (self.model_path is None) == (self.weights_url is None):
            raise ValueError("give exactly one of model_path and weights_url")
        if self.codec is not None and self.weights_url is None:
            raise ValueError("codec applies to weights_url only, not to model_path")
        return self

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, value: str | None) -> str | None:
        if value is None:
            return None
        # imported here: the codec grammar lives with torch, which the manager needs for nothing else
        from rollflow.runtime.weights.codecs import CodecSpec
        from rollflow.runtime.weights.errors import CodecError

        try:
            return CodecSpec.parse(value).name
        except CodecError as exc:
            raise ValueError(str(exc)) from None


class ResumeWorkerBody(StrictModel):
    """Waking a released engine; with a weight source it loads the newest version before it rejoins."""

    model_path: str | None = Field(None, min_length=1)
    """Checkpoint folder of `weight_version` on a disk the engine can read."""
    weights_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server the engine pulls from (built-in engines); the newest version unless `weight_version`."""
    codec: str | None = None
    """Pull codec (with weights_url only); the engine's default when absent."""
    weight_version: int | None = Field(None, ge=0)
    """Version to serve once awake; none given: the version it held when released (or the weight
    server's newest with weights_url)."""

    @model_validator(mode="after")
    def _one_source(self) -> ResumeWorkerBody:
        if self.model_path is not None and self.weights_url is not None:
            raise ValueError("give at most one of model_path and weights_url")
        if self.model_path is not None and self.weight_version is None:
            raise ValueError("model_path needs the weight_version it holds")
        if self.codec is not None and self.weights_url is None:
            raise ValueError("codec applies to weights_url only, not to model_path")
        if self.weight_version is not None and self.model_path is None and self.weights_url is None:
            raise ValueError("weight_version needs a source: model_path or weights_url")
        return self
