"""One implementation of `/v1/completions` and `/v1/chat/completions` over any token source.

The manager and the built-in engine each supply a `TokenSource` (a prompt's token ids and sampling
params in, new tokens out) and a tokenizer; everything OpenAI-shaped happens here: chat templates,
incremental detokenization, stop strings, logprobs, `usage`, server-sent events ending in
`data: [DONE]`. Stop strings are matched on the decoded text, so they work whatever engine makes
the tokens; text that could be the start of a stop string is held back until it is not.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.openai import ChatBody, CompletionBody, OpenAIError, parse_body

REPLACEMENT_CHAR = "\ufffd"


@dataclass(frozen=True)
class Delta:
    """Tokens a source produced since its previous delta; the last one carries the finish reason."""

    token_ids: list[int]
    logprobs: list[float]
    # "stop" | "length" | "abort" on the last delta, None before
    finish_reason: str | None
    # prompt tokens the engine served from its prefix cache, when the source knows
    cached_tokens: int | None = None


class TokenSource(Protocol):
    def open(
        self, prompt_ids: list[int], sampling: SamplingParams, incremental: bool
    ) -> AsyncIterator[Delta]:
        """Check the request (OpenAIError on bad input, before anything streams) and return its
        deltas; closing the iterator early ends the generation. Not `incremental`, the client sees
        only the end, so the source may hold tokens back until then."""
        ...


class Tokenizer:
    """A transformers tokenizer as the OpenAI routes use it."""

    def __init__(self, tokenizer: Any, where: str) -> None:
        self._tokenizer = tokenizer
        self._where = where

    def encode(self, text: str) -> list[int]:
        # as the engines' /generate does with `text`: no special tokens added
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        if not getattr(self._tokenizer, "chat_template", None):
            raise OpenAIError(
                400,
                f"the tokenizer at {self._where} has no chat template, so /v1/chat/completions cannot "
                "build a prompt; use /v1/completions, or add one (`rollflow engine init-model` writes one)",
                "messages",
            )
        from jinja2 import TemplateError

        try:
            text = self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as exc:
            raise OpenAIError(400, f"the chat template refused these messages: {exc}", "messages") from None
        return self.encode(text)


class TextAssembler:
    """Decodes a growing token list into text safe to send: never a partial character, never the
    start of a stop string, nothing from the first stop string on."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stops = stops
        self._holdback = max((len(s) for s in stops), default=1) - 1
        self.token_ids: list[int] = []
        self.sent = ""  # text sent so far
        self.stopped = False  # a stop string was found: generation should end

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """The new text to send after these tokens (all of what is left when `final`)."""
        self.token_ids.extend(token_ids)
        text = self._tokenizer.decode(self.token_ids)
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped, final = text[:cut], True, True
        end = len(text)
        if not final:
            end = max(len(self.sent), end - self._holdback)
            while end > len(self.sent) and text[end - 1] == REPLACEMENT_CHAR:
                end -= 1
        piece = text[len(self.sent) : end]
        self.sent += piece
        return piece


@dataclass
class _Request:
    """What one OpenAI request asked, in the terms both routes share."""

    chat: bool
    body: CompletionBody | ChatBody
    prompt_ids: list[int]
    want_logprobs: bool
    rid: str
    created: int
    cached_tokens: int | None = None  # the source's last word on it: usage.prompt_tokens_details

    def note(self, delta: Delta) -> None:
        if delta.cached_tokens is not None:
            self.cached_tokens = delta.cached_tokens


def _prompt_ids(body: CompletionBody | ChatBody, tokenizer: Tokenizer) -> list[int]:
    if isinstance(body, ChatBody):
        return tokenizer.chat_prompt(body.conversation(), body.add_generation_prompt)
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
        if not prompt:
            raise OpenAIError(400, "prompt encodes to no tokens", "prompt")
    bad = next((i for i in prompt if i >= tokenizer.vocab_size), None)
    if bad is not None:
        raise OpenAIError(
            400, f"prompt holds token id {bad}, outside the vocabulary [0, {tokenizer.vocab_size})", "prompt"
        )
    return list(prompt)


async def handle(
    request: web.Request,
    chat: bool,
    data: dict[str, Any],
    source: TokenSource,
    tokenizer: Tokenizer | None,
) -> web.StreamResponse:
    """Answer one completions (or chat) request: JSON, or SSE chunks then `data: [DONE]`."""
    try:
        body = parse_body(ChatBody if chat else CompletionBody, data)
        if tokenizer is None:
            raise OpenAIError(
                400,
                "the OpenAI routes answer with text and need a tokenizer: start the manager with "
                "`tokenizer:` set to the model folder",
            )
        prompt_ids = _prompt_ids(body, tokenizer)
        sampling = body.sampling(body.max_new_tokens())
        incremental = body.stream or bool(body.stop_strings())  # stop strings are matched as text arrives
        stream = source.open(prompt_ids, sampling, incremental)
    except OpenAIError as exc:
        return error_response(exc)
    want_logprobs = bool(body.logprobs) if chat else body.logprobs is not None
    prefix = "chatcmpl" if chat else "cmpl"
    req = _Request(chat, body, prompt_ids, want_logprobs, f"{prefix}-{uuid.uuid4().hex}", int(time.time()))
    assembler = TextAssembler(tokenizer, body.stop_strings())
    async with contextlib.aclosing(stream):
        if body.stream:
            return await _stream(request, req, stream, assembler, tokenizer)
        return await _whole(req, stream, assembler, tokenizer)


async def _whole(
    req: _Request, stream: AsyncIterator[Delta], assembler: TextAssembler, tokenizer: Tokenizer
) -> web.Response:
    logprobs: list[float] = []
    finish = None
    try:
        async for delta in stream:
            req.note(delta)
            assembler.add(delta.token_ids, final=delta.finish_reason is not None)
            logprobs.extend(delta.logprobs)
            finish = "stop" if assembler.stopped else delta.finish_reason
            if finish is not None:
                break
    except OpenAIError as exc:
        return error_response(exc)
    ids = assembler.token_ids
    lp = _logprobs(req, tokenizer, ids, logprobs, 0) if req.want_logprobs else None
    choice: dict[str, Any] = {"index": 0, "logprobs": lp, "finish_reason": finish}
    if req.chat:
        choice["message"] = {"role": "assistant", "content": assembler.sent}
    else:
        choice["text"] = assembler.sent
    _add_token_ids(req, choice, ids)
    answer = _envelope(req, "chat.completion" if req.chat else "text_completion", [choice])
    answer["usage"] = _usage(req, len(ids))
    return web.json_response(answer)


async def _stream(
    request: web.Request,
    req: _Request,
    stream: AsyncIterator[Delta],
    assembler: TextAssembler,
    tokenizer: Tokenizer,
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    options = req.body.stream_options
    usage_each = options is not None and options.continuous_usage_stats
    usage_last = options is not None and options.include_usage
    kind = "chat.completion.chunk" if req.chat else "text_completion"

    async def send(choices: list[dict[str, Any]], num_tokens: int) -> None:
        chunk = _envelope(req, kind, choices)
        if usage_each or usage_last:
            chunk["usage"] = _usage(req, num_tokens) if usage_each or not choices else None
        await _send_event(response, chunk)

    if req.chat:
        await send(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            0,
        )
    sent_tokens = 0
    logprobs: list[float] = []
    try:
        async for delta in stream:
            req.note(delta)
            logprobs.extend(delta.logprobs)
            piece = assembler.add(delta.token_ids, final=delta.finish_reason is not None)
            finish = "stop" if assembler.stopped else delta.finish_reason
            new_ids = assembler.token_ids[sent_tokens:]
            if piece or finish is not None or (req.body.return_token_ids and new_ids):
                offset = len(assembler.sent) - len(piece)
                lp = (
                    _logprobs(req, tokenizer, new_ids, logprobs[sent_tokens:], offset)
                    if req.want_logprobs
                    else None
                )
                choice: dict[str, Any] = {"index": 0, "logprobs": lp, "finish_reason": finish}
                if req.chat:
                    choice["delta"] = {"content": piece} if piece or finish is None else {}
                else:
                    choice["text"] = piece
                _add_token_ids(req, choice, new_ids, with_prompt=sent_tokens == 0)
                sent_tokens = len(assembler.token_ids)
                await send([choice], sent_tokens)
            if finish is not None:
                break
        if usage_last:
            await send([], len(assembler.token_ids))
    except OpenAIError as exc:
        await _send_event(response, exc.body())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _envelope(req: _Request, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": kind,
        "created": req.created,
        "model": req.body.model,
        "choices": choices,
    }


def _usage(req: _Request, num_completion: int) -> dict[str, Any]:
    num_prompt = len(req.prompt_ids)
    usage: dict[str, Any] = {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
    }
    if req.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens}
    return usage


def _add_token_ids(req: _Request, choice: dict[str, Any], ids: list[int], with_prompt: bool = True) -> None:
    if req.body.return_token_ids:
        choice["token_ids"] = list(ids)
        if with_prompt:
            choice["prompt_token_ids"] = req.prompt_ids


def _logprobs(
    req: _Request, tokenizer: Tokenizer, ids: list[int], logprobs: list[float], offset: int
) -> dict[str, Any]:
    """OpenAI's logprobs object for these tokens (their own logprobs; no alternatives)."""
    pieces = [tokenizer.decode([token]) for token in ids]
    values = logprobs[: len(ids)]
    if req.chat:
        return {
            "content": [
                {"token": p, "logprob": v, "bytes": list(p.encode()), "top_logprobs": []}
                for p, v in zip(pieces, values, strict=True)
            ]
        }
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": pieces, "token_logprobs": values, "top_logprobs": None, "text_offset": offsets}


async def _send_event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def error_response(exc: OpenAIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)
