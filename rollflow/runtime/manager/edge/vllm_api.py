"""vLLM's router API on the manager: the data plane that vllm-router serves to SkyRL's
`RemoteInferenceClient`, prime-rl and NeMo-RL, over whatever engines the manager runs (built-in,
vLLM, SGLang), with the manager's token tracking under every request.

- `POST /inference/v1/generate`: vLLM's token-in/token-out generate. `{"token_ids",
  "sampling_params", "model"}` in; `{"choices": [{"token_ids", "finish_reason", "logprobs":
  {"content": [{"logprob"}]}}]}` out, or with `stream: true` vLLM's server-sent events, each one
  choice's new tokens, then `data: [DONE]`. Each choice is one manager sample: routed by the
  manager, every token recorded with its engine and weight version, and resumed on another engine
  from its tokens when its engine dies, so the answer (streamed or not) is the one an undisturbed
  engine gives.
- Sessions by header, as vllm-router's `sticky_least_loaded` (SkyRL's and prime-rl's default): the
  requests of one `X-Session-ID` (or a body's `session_id`) follow the engine the first went to,
  which holds their prefix, unless it is far more loaded than the least loaded engine (the
  manager's `session` router, the simulator's). `POST /finish_session?session_id=` forgets it.
- `POST /tokenize` and `POST /detokenize` in vLLM's shapes, with the manager's `tokenizer:`.
- `POST /v1/chat/completions/render`: vLLM's render, a chat body turned into the
  `/inference/v1/generate` body that generates its answer (the prompt's token ids through the
  tokenizer's chat template, the sampling fields as vLLM names them), text only.

Errors are in vLLM's (OpenAI's) shape, `{"error": {"message", "type", "param", "code"}}`, which is
what SkyRL's client reads; a field this server cannot honour is a 400 naming it, never ignored.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollflow.config import describe_validation_error
from rollflow.runtime.engines.vllm import vllm_sampling_params
from rollflow.runtime.http.answer import dumps, json_response
from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.batches import sample_sampling
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.edge.shared import MANAGER_KEY, TOKENIZER_KEY, body_limit
from rollflow.runtime.openai.serve import Tokenizer
from rollflow.runtime.wire.base import MAX_SEED, MIN_SEED, SamplingParams, edge_sampling
from rollflow.runtime.wire.openai import ChatBody, OpenAIError, StreamOptions, parse_body
from rollflow.runtime.wire.sglang import MAX_TOKEN_ID, Int

SESSION_HEADER = "X-Session-ID"
DEFAULT_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default, for a body that leaves it out."""
MAX_CHOICES = 64  # `n` per request: more samples of one prompt belong in a batch (/batches)
routes = web.RouteTableDef()

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VllmSamplingParams(_Body):
    """vLLM's `SamplingParams` fields an RL client sends, as vLLM names them."""

    n: Int = Field(1, ge=1, le=MAX_CHOICES)
    max_tokens: Int | None = Field(None, ge=1)
    min_tokens: Int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Int = Field(-1, ge=-1, le=MAX_TOKEN_ID)
    """-1 (or 0) keeps every token."""
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: Int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    logprobs: Int | None = Field(None, ge=0, le=1)
    """0 or 1: each sampled token's logprob (`logprobs.content[i].logprob`). The engines' top
    alternatives are not recorded, so `top_logprobs` is empty and more than 1 is refused."""
    prompt_logprobs: Int | None = None
    presence_penalty: float = Field(0.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    output_kind: Int | None = None
    """vLLM's streaming mode (cumulative, delta, final only): an answer here is always whole."""

    def to_params(self) -> SamplingParams:
        if self.prompt_logprobs is not None:
            raise OpenAIError(
                400, "prompt_logprobs is not served by the manager", "sampling_params.prompt_logprobs"
            )
        return edge_sampling(self, "vllm", max_new_tokens=self.max_tokens or DEFAULT_MAX_TOKENS)


class GenerateBody(_Body):
    """vLLM's `GenerateRequest` (`/inference/v1/generate`), without what the manager cannot serve
    (multimodal features, LoRA adapters by name, KV transfer)."""

    token_ids: list[TokenId] = Field(min_length=1)
    sampling_params: VllmSamplingParams = VllmSamplingParams()
    model: str | None = None
    """Echoed back; the manager serves the model its engines run, whatever name is asked."""
    request_id: str | None = None
    stream: bool = False
    """Server-sent events as vLLM streams them: one per choice that has new tokens or ended."""
    stream_options: StreamOptions | None = None
    """`include_usage`: a last event with `usage` and no choices; with it, `continuous_usage_stats`
    puts `usage` (that choice's tokens so far) in every event too, as vLLM does."""
    cache_salt: str | None = None
    """Accepted and not used: the engines' prefix caches are the engines' own."""
    priority: int = 0
    features: None = None
    """Multimodal features: none (a render of a text-only chat sends `features: null`)."""
    session_id: str | None = Field(None, min_length=1)
    """The session's routing key when the client sends no X-Session-ID header."""


class TokenizeBody(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeBody(_Body):
    model: str | None = None
    tokens: list[TokenId]


async def _parse(request: web.Request, model: type[_Body]) -> Any:
    def validate(data: Any) -> Any:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise OpenAIError(
                400, describe_validation_error(model, exc, prefix="invalid request: ")
            ) from None

    return await read_json_object(request, body_limit(request), validate)


def session_of(request: web.Request, body_session: str | None = None) -> str | None:
    """The request's session: its X-Session-ID header, else its body's `session_id`."""
    return request.headers.get(SESSION_HEADER) or body_session


def answers_errors(handler: Callable[..., Awaitable[web.StreamResponse]]) -> Callable:
    """A route (given the request, and whatever else its registration passes) whose OpenAIError is
    answered in vLLM's error shape (and counted, as the manager counts every 4xx it answers)."""

    @functools.wraps(handler)
    async def route(request: web.Request, *args: Any) -> web.StreamResponse:
        try:
            return await handler(request, *args)
        except OpenAIError as exc:
            if exc.status < 500:
                request.app[MANAGER_KEY].metrics.requests_rejected.labels(str(exc.status)).inc()
            return web.json_response(exc.body(), status=exc.status)

    return route


class _Updates:
    """The watcher of one request's samples (the manager tells it of each update): it wakes the
    request at every update when it streams, else only once every sample has ended, so a JSON
    answer costs no wake-up per token."""

    def __init__(self, stream: bool) -> None:
        self.samples: list[Sample] = []
        self.event = asyncio.Event()
        self._stream = stream

    def set(self) -> None:
        if self._stream or all(sample.state >= SampleState.FINISHED for sample in self.samples):
            self.event.set()

    async def next(self) -> None:
        await self.event.wait()
        self.event.clear()


@routes.post("/inference/v1/generate")
@answers_errors
async def generate(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER_KEY]
    body = await _parse(request, GenerateBody)
    params = body.sampling_params.to_params()
    check_limits(
        manager.config, len(body.token_ids), params.max_new_tokens, "token_ids", "sampling_params.max_tokens"
    )
    session = session_of(request, body.session_id)
    updates = _Updates(body.stream)
    samples = updates.samples
    request_id = f"generate-tokens-{body.request_id or uuid.uuid4().hex}"
    try:
        for index in range(body.sampling_params.n):
            sampling = sample_sampling(params, 0, index)
            # vLLM's requests know no weight version: one paused across a weight update goes on with
            # the new weights, as vLLM's does (each token's span still records the version it came from)
            samples.append(
                manager.submit_sample(
                    body.token_ids, sampling, allow_off_policy=True, session_id=session, watcher=updates
                )
            )
        if body.stream:
            return await _stream(request, body, request_id, updates)
        while not all(sample.state >= SampleState.FINISHED for sample in samples):
            await updates.next()
    finally:
        for sample in samples:
            manager.release(sample)
    _raise_if_failed(samples)
    want_logprobs = body.sampling_params.logprobs is not None
    return json_response(
        {
            "request_id": request_id,
            "model": body.model,
            "choices": [
                _choice(index, sample, 0, sample.finish_reason or "length", want_logprobs)
                for index, sample in enumerate(samples)
            ],
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


def _raise_if_failed(samples: list[Sample]) -> None:
    failed = next((sample for sample in samples if sample.state == SampleState.FAILED), None)
    if failed is not None:
        raise OpenAIError(400 if failed.refused else 502, f"the request failed: {failed.error}")


async def _stream(
    request: web.Request, body: GenerateBody, request_id: str, updates: _Updates
) -> web.StreamResponse:
    """vLLM's stream: at each update, an event per choice with new tokens (or that ended), holding
    only those tokens; then the usage event if asked, then `data: [DONE]`. A failure before the
    first event is an error answer; one after it is an `{"error"}` event before `[DONE]`, as vLLM
    sends it. With `resume: restart` a sample may drop the tokens it has, which a client that has
    seen some of them cannot be spared: that is an error too."""
    samples = updates.samples
    want_logprobs = body.sampling_params.logprobs is not None
    options = body.stream_options
    usage_last = bool(options and options.include_usage)
    usage_each = bool(options and options.include_usage and options.continuous_usage_stats)
    sent = [0] * len(samples)
    ended = [False] * len(samples)
    dropped = [0] * len(samples)  # each sample's tokens dropped by a restart, when it last streamed
    response: web.StreamResponse | None = None
    try:
        while True:
            events = []
            for index, sample in enumerate(samples):
                if sample.state == SampleState.FAILED:
                    _raise_if_failed(samples)
                if sent[index] and sample.regenerated_tokens > dropped[index]:
                    raise OpenAIError(
                        502,
                        f"the sample restarted from its prompt (resume: restart) after {sent[index]} tokens "
                        "were streamed, which cannot be taken back; use resume: continue, or stream: false",
                    )
                done = sample.state >= SampleState.FINISHED
                if ended[index] or not (done or len(sample.output_ids) > sent[index]):
                    continue
                finish = (sample.finish_reason or "length") if done else None
                choice = _choice(index, sample, sent[index], finish, want_logprobs)
                sent[index] += len(choice["token_ids"])
                dropped[index] = sample.regenerated_tokens
                ended[index] = done
                event: dict[str, Any] = {"request_id": request_id, "choices": [choice]}
                if usage_each:
                    event["usage"] = _usage(len(body.token_ids), sent[index])
                events.append(event)
            if all(ended) and usage_last:
                events.append(
                    {"request_id": request_id, "choices": [], "usage": _usage(len(body.token_ids), sum(sent))}
                )
            if events:
                if response is None:
                    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await response.prepare(request)
                await response.write(b"".join(b"data: " + dumps(event) + b"\n\n" for event in events))
            if all(ended):
                break
            await updates.next()
    except OpenAIError as exc:
        if response is None:
            raise
        await response.write(b"data: " + dumps(exc.body()) + b"\n\n")
    assert response is not None  # every sample ended, so each sent an event
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def check_limits(
    config: ManagerConfig, num_prompt_tokens: int, max_new_tokens: int, prompt_field: str, max_field: str
) -> None:
    """A 400 naming the field past this manager's `max_prompt_tokens` or `max_new_tokens_limit`."""
    if num_prompt_tokens > config.max_prompt_tokens:
        raise OpenAIError(
            400,
            f"{prompt_field} has {num_prompt_tokens} tokens, above max_prompt_tokens={config.max_prompt_tokens}",
            prompt_field,
        )
    if max_new_tokens > config.max_new_tokens_limit:
        raise OpenAIError(
            400,
            f"{max_field}={max_new_tokens} exceeds this manager's limit of {config.max_new_tokens_limit} "
            "(max_new_tokens_limit)",
            max_field,
        )


def _choice(
    index: int, sample: Sample, start: int, finish_reason: str | None, want_logprobs: bool
) -> dict[str, Any]:
    """Choice `index`: the sample's tokens from `start` on (a stream's new ones, else all)."""
    ids = sample.output_ids[start:]
    logprobs = None
    if want_logprobs:
        content = [
            {"token": f"token_id:{token}", "logprob": logprob, "bytes": None, "top_logprobs": []}
            for token, logprob in zip(ids, sample.output_logprobs[start : start + len(ids)], strict=True)
        ]
        logprobs = {"content": content}
    return {"index": index, "token_ids": list(ids), "finish_reason": finish_reason, "logprobs": logprobs}


@routes.post("/finish_session")
@answers_errors
async def finish_session(request: web.Request) -> web.Response:
    """vllm-router's `/finish_session`: the session's requests are done; its engine is forgotten."""
    session_id = request.query.get("session_id")
    if not session_id:
        raise OpenAIError(400, "give the session: POST /finish_session?session_id=ID", "session_id")
    request.app[MANAGER_KEY].dispatcher.end_session(session_id)
    return web.json_response({"status": "ok", "session_id": session_id})


def _tokenizer(request: web.Request) -> Any:
    tokenizer = request.app[TOKENIZER_KEY]
    if tokenizer is None:
        raise OpenAIError(
            400,
            "/tokenize and /detokenize need the manager's tokenizer: start it with `tokenizer:` set to "
            "the model folder",
        )
    return tokenizer


@routes.post("/tokenize")
@answers_errors
async def tokenize(request: web.Request) -> web.Response:
    body = await _parse(request, TokenizeBody)
    encoding = _tokenizer(request).encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return web.json_response(
        {
            "count": len(encoding.ids),
            "max_model_len": request.app[MANAGER_KEY].config.max_prompt_tokens,
            "tokens": encoding.ids,
            "token_strs": encoding.tokens if body.return_token_strs else None,
        }
    )


@routes.post("/detokenize")
@answers_errors
async def detokenize(request: web.Request) -> web.Response:
    body = await _parse(request, DetokenizeBody)
    return web.json_response({"prompt": _tokenizer(request).decode(body.tokens, skip_special_tokens=False)})


@answers_errors
async def render_chat(
    request: web.Request, tokenizer_of: Callable[[], Awaitable[Tokenizer | None]]
) -> web.Response:
    """vLLM's `/v1/chat/completions/render`: the `/inference/v1/generate` body (vLLM's
    `GenerateRequest`) that answers this chat as `/v1/chat/completions` would, so a client can
    render on one server and generate on another. Its token ids are the chat template's, as the
    manager's `/v1/chat/completions` builds its prompt; `max_tokens` is the count that route would
    generate."""
    data = await read_json_object(request, body_limit(request))
    data.pop("session_id", None)  # a session routes generation; a render generates nothing
    body = parse_body(ChatBody, data)
    tokenizer = await tokenizer_of()
    if tokenizer is None:
        raise OpenAIError(
            400,
            "rendering a chat needs the manager's tokenizer: start it with `tokenizer:` set to the model folder",
        )
    sampling = vllm_sampling_params(body.sampling(body.max_new_tokens()))
    stop = body.stop_strings()
    sampling |= {"n": 1, "logprobs": 0 if body.logprobs else None} | ({"stop": list(stop)} if stop else {})
    return json_response(
        {
            "request_id": f"chatcmpl-{uuid.uuid4().hex}",
            "token_ids": tokenizer.chat_prompt(body.conversation(), body.add_generation_prompt),
            "features": None,
            "sampling_params": sampling,
            "model": body.model,
            "stream": body.stream,
            "stream_options": body.stream_options.model_dump() if body.stream_options else None,
            "cache_salt": None,
            "priority": 0,
        }
    )
