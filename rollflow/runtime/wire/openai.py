"""Bodies of OpenAI's `/v1/completions` and `/v1/chat/completions`, as the manager and the built-in
engine accept them, and their mapping onto `SamplingParams`.

Every field OpenAI's client may send is named here. A value the serving side cannot honour
(`n` above 1, penalties, top logprobs, `echo`, tools...) is a 400 in OpenAI's error shape naming
the field, never silently ignored; a field OpenAI does not have is a 400 too (a typo is not lost).
`top_k`, `ignore_eos`, `stop_token_ids` and `return_token_ids` are vLLM's extensions, kept here so
a vLLM user's body works unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from rollflow.config import describe_validation_error
from rollflow.runtime.wire.base import MAX_SEED, MAX_TOKEN_ID, MIN_SEED, Body, Int, SamplingParams

MAX_STOP_STRINGS = 4
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for `/v1/completions`."""
CHAT_DEFAULT_MAX_TOKENS = 128
"""Default for chat, whose OpenAI default is "up to the context": SGLang's default `max_new_tokens`."""

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


class StreamOptions(Body):
    include_usage: bool = False
    """Send one more chunk before `[DONE]` with `usage` and no choices."""
    continuous_usage_stats: bool = False
    """vLLM's: `usage` in every chunk."""


class _Common(Body):
    """Fields completions and chat share."""

    model: str = Field(min_length=1)
    """Echoed back; the server serves one model (listed by `/v1/models`) whatever name is asked."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Int | None = Field(None, ge=-1, le=MAX_TOKEN_ID)
    """vLLM's extension; -1 (or 0) keeps every token."""
    n: Int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    """Up to 4 strings; the text ends before the first one the output holds (finish_reason stop)."""
    seed: Int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    """Recorded by OpenAI for abuse monitoring; accepted and not used."""
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    return_token_ids: bool = False
    """vLLM's extension: `prompt_token_ids` and each choice's `token_ids` in the answer."""

    def max_new_tokens(self) -> int:
        raise NotImplementedError

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return tuple(s for s in stops if s)

    def check_supported(self) -> None:
        """Raise OpenAIError(400) naming the first value this server cannot honour."""
        if self.n not in (None, 1):
            raise OpenAIError(
                400, f"n={self.n}: only n=1 is served; send n requests (or use the manager's /batches)", "n"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0.0):
                raise OpenAIError(400, f"{name}={getattr(self, name)} is not supported (only 0)", name)
        if self.logit_bias:
            raise OpenAIError(400, "logit_bias is not supported", "logit_bias")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP_STRINGS:
            raise OpenAIError(400, f"stop holds {len(self.stop)} strings, at most {MAX_STOP_STRINGS}", "stop")
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options is only allowed with stream: true", "stream_options")

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        top_k = self.top_k if self.top_k not in (None, 0) else -1
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=top_k,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            seed=self.seed,
        )


class CompletionBody(_Common):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    """Text, or token ids (one prompt per request: a list of one text or one id list is taken too)."""
    max_tokens: Int | None = Field(None, ge=1)
    logprobs: Int | None = Field(None, ge=0, le=20)
    """Only 0: each sampled token's own logprob (`logprobs.token_logprobs`); no alternatives."""
    echo: bool = False
    best_of: Int | None = Field(None, ge=1)
    suffix: str | None = None

    def max_new_tokens(self) -> int:
        return self.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS

    def check_supported(self) -> None:
        super().check_supported()
        nested = isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str | list)
        if nested and len(self.prompt) != 1:
            raise OpenAIError(400, f"prompt holds {len(self.prompt)} prompts; send one per request", "prompt")
        if self.logprobs not in (None, 0):
            raise OpenAIError(
                400,
                f"logprobs={self.logprobs}: only 0 is served (the sampled tokens' own logprobs, no alternatives)",
                "logprobs",
            )
        if self.echo:
            raise OpenAIError(400, "echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise OpenAIError(400, f"best_of={self.best_of}: only 1 is served", "best_of")
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported", "suffix")

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if not prompt:
            raise OpenAIError(400, "prompt is empty", "prompt")
        return prompt


class TextPart(Body):
    type: Literal["text"]
    text: str


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = Field(None, ge=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    """OpenAI's newer name of max_tokens; the smaller wins when both are given."""
    logprobs: bool = False
    """Each sampled token's logprob in `choices[0].logprobs.content`."""
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none"] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    """vLLM's extension: end the templated prompt with the assistant's turn opening."""

    def max_new_tokens(self) -> int:
        given = [v for v in (self.max_tokens, self.max_completion_tokens) if v is not None]
        return min(given) if given else CHAT_DEFAULT_MAX_TOKENS

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs not in (None, 0):
            raise OpenAIError(
                400, f"top_logprobs={self.top_logprobs}: only 0 is served (no alternatives)", "top_logprobs"
            )
        if self.tools:
            raise OpenAIError(400, "tools are not supported", "tools")
        if self.response_format not in (None, {"type": "text"}):
            raise OpenAIError(
                400, "response_format other than {'type': 'text'} is not supported", "response_format"
            )

    def conversation(self) -> list[dict[str, str]]:
        """The messages as chat templates take them: role and text content."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


def parse_body(model: type[_Common], data: dict[str, Any]) -> _Common:
    """Validate a body and check it asks for nothing unsupported; OpenAIError(400) otherwise."""
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise OpenAIError(400, describe_validation_error(model, exc, prefix="invalid request: ")) from None
    body.check_supported()
    return body
