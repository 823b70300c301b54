"""Bodies of the manager's HTTP API, validated strictly: an unknown field is a 400 that names it.

`GenerateBody` is SGLang's `/generate` request as RL clients send it, so an SGLang client (slime,
AReaL, SkyRL, verl, sgl-router) can talk to the manager as if it were one engine; `WorkerBody` is
sgl-router's `POST /workers` body.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollflow.runtime.manager.config import RelayAddress
from rollflow.runtime.wire.base import MAX_TOKEN_ID, Body, Int
from rollflow.runtime.wire.sglang import TOP_LEVEL_NEUTRAL, SamplingParamsBody, drop_neutral
from rollflow.runtime.wire.sglang import GenerateBody as SGLangGenerateBody

SamplingBody = SamplingParamsBody
"""`sampling_params` of every manager route: SGLang's, shared with the built-in engine."""


class SessionParamsBody(Body):
    """SGLang's `session_params` of a `/generate`: the request is the next turn of session `id`
    (opened with `/open_session`); its `input_ids` follow the session's whole context."""

    id: str = Field(min_length=1, max_length=64)
    rid: str | None = None
    """The request it continues: null or the session's last request (branching is not served)."""
    offset: Int | None = None
    """Where in that request's context to append: null or 0, its end (cutting it is not served)."""
    replace: bool | None = None
    drop_previous_output: bool | None = None

    @model_validator(mode="after")
    def _append_only(self) -> SessionParamsBody:
        if self.offset not in (None, 0):
            raise ValueError(
                f"offset={self.offset}: only appending to the session's end is served; send null"
            )
        if self.replace or self.drop_previous_output:
            field = "replace" if self.replace else "drop_previous_output"
            raise ValueError(f"{field}=true: only appending to the session's end is served; send false")
        return self


class GenerateBody(SGLangGenerateBody):
    """SGLang's `/generate` body as clients send it (`rollflow.runtime.wire.sglang`), plus
    rollflow's own field and SGLang's sessions (sessions_api.py)."""

    allow_off_policy: bool = False
    """rollflow extension: the sample may continue on an engine with other weights."""
    session_params: SessionParamsBody | None = None
    """The request is the next turn of a session (SGLang's shape; see sessions_api.py)."""

    @model_validator(mode="before")
    @classmethod
    def _neutral(cls, data: Any) -> Any:
        """The engine's neutral-field rule, except that the manager serves `session_params`."""
        if not isinstance(data, dict) or data.get("session_params") is None:
            return drop_neutral(data, TOP_LEVEL_NEUTRAL, "")
        rest = drop_neutral({k: v for k, v in data.items() if k != "session_params"}, TOP_LEVEL_NEUTRAL, "")
        return rest | {"session_params": data["session_params"]}


class OpenSGLangSessionBody(Body):
    """SGLang's `/open_session` body."""

    capacity_of_str_len: Int = Field(0, ge=0)
    """SGLang's bound on the session's text; the manager's bound is max_prompt_tokens."""
    session_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    streaming: bool | None = None
    """SGLang's append-only sessions: the manager's sessions are append-only either way."""
    timeout: float | None = Field(None, gt=0)
    """SGLang reaps an idle session after this long; the manager keeps it until closed (accepted, unused)."""


class CloseSGLangSessionBody(Body):
    """SGLang's `/close_session` body."""

    session_id: str = Field(min_length=1, max_length=64)


class BatchBody(Body):
    prompts: list[list[int]] = Field(min_length=1)
    """Prompts as token ids; each becomes a group of `n` samples."""
    n: Int = Field(1, ge=1, le=4096)
    sampling_params: SamplingBody = SamplingBody()
    allow_off_policy: bool = False
    batch_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.]{1,64}$")
    """The client's id for the batch, so that a submission retried across a manager restart finds the
    batch it made rather than making a second one (letters, digits, `_` and `.`)."""

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


class NextMicroBatchBody(Body):
    min_groups: Int = Field(1, ge=1)
    max_groups: Int = Field(1 << 30, ge=1)
    timeout_s: float | None = Field(None, ge=0, le=3600)
    micro_batch: Int | None = Field(None, ge=0)
    """Index of the micro-batch asked for (how many the client holds already): one handed out before
    is answered again, so a call retried across a manager restart hands no group out twice."""
    received: list[list[int]] | None = Field(None, max_length=1 << 20)
    """Group indexes of the micro-batches 0..micro_batch-1 as the client holds them. A client that
    sends them keeps the record of its hand-outs itself: the manager answers without waiting for the
    hand-out to be journaled, and a manager restarted before it was takes the client's word for them."""

    @model_validator(mode="after")
    def _ordered(self) -> NextMicroBatchBody:
        if self.max_groups < self.min_groups:
            raise ValueError(f"max_groups ({self.max_groups}) is below min_groups ({self.min_groups})")
        if self.received is not None and self.micro_batch is None:
            raise ValueError("received needs micro_batch, the index of the micro-batch asked for")
        if self.received is not None and len(self.received) != self.micro_batch:
            raise ValueError(
                f"received holds {len(self.received)} micro-batches; it must hold micro_batch "
                f"({self.micro_batch}), the ones before the one asked for"
            )
        return self


class WorkerBody(Body):
    """sgl-router's `POST /workers` body, plus rollflow's engine kind, type and capacity."""

    url: str = Field(pattern=r"^https?://[^\s/]+(/.*)?$")
    worker_type: Literal["regular", "prefill", "decode"] = "regular"
    """sgl-router's worker role; prefill/decode (disaggregated serving) are refused with a message."""
    bootstrap_port: Int | None = Field(None, ge=0, le=65535)
    """A prefill worker's KV bootstrap port (sgl-router's field): refused, as prefill workers are."""
    kind: Literal["local", "remote", "spot"] = "local"
    engine_type: Literal["sglang", "vllm", "builtin"] = "sglang"
    capacity: Int = Field(64, ge=1, le=100_000)
    api_key: str | None = Field(None, min_length=1, max_length=4096)
    """The engine's --api-key: the manager sends it as a bearer token on every call (sgl-router's field)."""
    relay: RelayAddress | None = None
    """HOST:PORT of the `rollflow manager relay` on the engine's node, which reads its token streams."""

    @model_validator(mode="after")
    def _regular_only(self) -> WorkerBody:
        if self.worker_type != "regular":
            raise ValueError(
                f"worker_type {self.worker_type!r}: prefill/decode disaggregation is not served by the "
                "rollflow manager; register each engine as worker_type 'regular'"
            )
        if self.bootstrap_port is not None:
            raise ValueError(
                "bootstrap_port belongs to prefill workers, which the rollflow manager does not serve; "
                "send null for a regular worker"
            )
        return self


class StepReportBody(Body):
    step_time_s: float = Field(gt=0)
    bubble_s: float = Field(ge=0)
    rollout_s: float | None = Field(None, gt=0)
    """Time the step's rollout took; the launcher's autoscaler reads it back from GET /step_report."""


class UpdateWeightsBody(Body):
    """Give exactly one source: a folder the engine reads, or a weight server it pulls from."""

    model_path: str | None = Field(None, min_length=1)
    """Checkpoint folder on a disk the engine can read."""
    weights_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server (`rollflow weights serve`) the engine pulls `weight_version` from (built-in engines)."""
    codec: str | None = None
    """Pull codec (with weights_url only); the engine's default (delta+zstd) when absent."""
    transport: Literal["http", "mooncake"] | None = None
    """How the pulled chunks travel (with weights_url only): http, or mooncake (from a weight server
    started with --mooncake); the engine's default (http) when absent."""
    weight_version: Int = Field(ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> UpdateWeightsBody:
        if (self.model_path is None) == (self.weights_url is None):
            raise ValueError("give exactly one of model_path and weights_url")
        for name in ("codec", "transport"):
            if getattr(self, name) is not None and self.weights_url is None:
                raise ValueError(f"{name} applies to weights_url only, not to model_path")
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


class ResumeWorkerBody(Body):
    """Waking a released engine; with a weight source it loads the newest version before it rejoins."""

    model_path: str | None = Field(None, min_length=1)
    """Checkpoint folder of `weight_version` on a disk the engine can read."""
    weights_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server the engine pulls from (built-in engines); the newest version unless `weight_version`."""
    codec: str | None = None
    """Pull codec (with weights_url only); the engine's default when absent."""
    transport: Literal["http", "mooncake"] | None = None
    """How the pulled chunks travel (with weights_url only); the engine's default (http) when absent."""
    weight_version: Int | None = Field(None, ge=0)
    """Version to serve once awake; none given: the version it held when released (or the weight
    server's newest with weights_url)."""

    @model_validator(mode="after")
    def _one_source(self) -> ResumeWorkerBody:
        if self.model_path is not None and self.weights_url is not None:
            raise ValueError("give at most one of model_path and weights_url")
        if self.model_path is not None and self.weight_version is None:
            raise ValueError("model_path needs the weight_version it holds")
        for name in ("codec", "transport"):
            if getattr(self, name) is not None and self.weights_url is None:
                raise ValueError(f"{name} applies to weights_url only, not to model_path")
        if self.weight_version is not None and self.model_path is None and self.weights_url is None:
            raise ValueError("weight_version needs a source: model_path or weights_url")
        return self


class OpenSessionBody(Body):
    """`POST /v1/sessions`: a multi-turn session (sessions.py)."""

    session_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """The client's id for the session (letters, digits, `_`, `.`, `-`); a new one when absent."""
    weight_version: Int | None = Field(None, ge=0)
    """Hold the session to this weight version; absent: the version of its first token."""
    allow_off_policy: bool = False
    """Let later turns continue on engines of other weight versions (each token keeps its own)."""


class TurnBody(Body):
    """`POST /v1/sessions/{id}/turns`: the first turn's input is the prompt; a later turn's is the
    environment's (or tool's) tokens that follow the last output, masked out of the loss."""

    input_ids: list[int] = Field(default_factory=list)
    sampling_params: SamplingBody = SamplingBody()
    return_logprob: bool = False
    """Add `meta_info.output_token_logprobs` as [[logprob, token_id, null], ...], as /generate does."""
    rid: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    """The turn's id, chosen by the client: the same turn sent again (after a manager restart) answers
    the turn of this rid, running or finished, instead of starting another."""

    @field_validator("input_ids")
    @classmethod
    def _token_ids(cls, value: list[int]) -> list[int]:
        if value and (min(value) < 0 or max(value) > MAX_TOKEN_ID):
            raise ValueError(f"token ids must lie in [0, {MAX_TOKEN_ID}]")
        return value
