"""OpenAI's `/v1/completions` and `/v1/chat/completions` on the manager.

Each request becomes one manager sample, exactly as a `/generate` request does: routed by the
manager's router, every token recorded with its engine and weight version, and resumed on another
engine from prompt + generated tokens when its engine dies, hangs or is removed. The client sees
one uninterrupted stream. Text needs the manager's `tokenizer:` (a model folder; chat also needs
its chat template), loaded with transformers on the first OpenAI request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from rollflow.runtime.http.body import read_json_object
from rollflow.runtime.manager.core.samples import SampleState
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.manager.edge.vllm_api import check_limits, render_chat, session_of
from rollflow.runtime.openai.serve import Delta, Tokenizer, error_response, handle
from rollflow.runtime.wire.base import SamplingParams
from rollflow.runtime.wire.openai import OpenAIError


class ManagerTokens:
    """Token source of the OpenAI routes: one sample of the manager per request."""

    def __init__(self, manager: RolloutManager, session_id: str | None = None) -> None:
        """`session_id`: the request's session (routed by the manager's session router)."""
        self._manager = manager
        self._session_id = session_id

    def open(
        self, prompt_ids: list[int], sampling: SamplingParams, incremental: bool
    ) -> AsyncIterator[Delta]:
        check_limits(self._manager.config, len(prompt_ids), sampling.max_new_tokens, "prompt", "max_tokens")
        return self._run(prompt_ids, sampling, incremental)

    async def _run(
        self, prompt_ids: list[int], sampling: SamplingParams, incremental: bool
    ) -> AsyncIterator[Delta]:
        """Tokens as they are recorded (incremental), or all of them once the sample is done: with
        `resume: restart` a sample may drop the tokens it has, which only a client that has seen
        none of them can be spared."""
        manager = self._manager
        # OpenAI's requests know no weight version: one paused across a weight update goes on with the
        # new weights, as vLLM's and SGLang's do (each token's span still records its version)
        sample = manager.submit_sample(
            prompt_ids, sampling, allow_off_policy=True, session_id=self._session_id
        )
        sent = 0
        try:
            while True:
                done = sample.state >= SampleState.FINISHED
                if sample.state == SampleState.FAILED:
                    raise OpenAIError(502, f"the sample failed: {sample.error}")
                if len(sample.output_ids) < sent:
                    raise OpenAIError(
                        502,
                        f"the sample restarted from its prompt (resume: restart) after {sent} tokens were "
                        "streamed, which cannot be taken back; use resume: continue, or stream: false",
                    )
                if (incremental and len(sample.output_ids) > sent) or done:
                    ids = sample.output_ids[sent:]
                    logprobs = sample.output_logprobs[sent : sent + len(ids)]
                    sent += len(ids)
                    finish = (sample.finish_reason or "length") if done else None
                    yield Delta(
                        ids, logprobs, finish, sample.cached_tokens if sample.cached_by_attempt else None
                    )
                if done:
                    return
                await manager.wait_for_update(sample)
        finally:
            manager.release(sample)


class LazyTokenizer:
    """The manager's tokenizer as transformers loads it, read once, off the event loop."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._lock = asyncio.Lock()
        self._tokenizer: Tokenizer | None = None

    async def get(self) -> Tokenizer | None:
        if self._path is None:
            return None
        async with self._lock:
            if self._tokenizer is None:
                self._tokenizer = await asyncio.to_thread(self._load, self._path)
        return self._tokenizer

    @staticmethod
    def _load(path: str) -> Tokenizer:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        where = Path(path)
        if where.is_dir():
            return Tokenizer(AutoTokenizer.from_pretrained(where), path)
        return Tokenizer(PreTrainedTokenizerFast(tokenizer_file=str(where)), path)


def openai_routes(manager: RolloutManager) -> list[web.RouteDef]:
    tokenizer = LazyTokenizer(manager.config.tokenizer)
    limit = int(manager.config.max_body_mb * (1 << 20))

    async def answer(request: web.Request, chat: bool) -> web.StreamResponse:
        data = await read_json_object(request, limit)
        # vllm-router's sessions: the X-Session-ID header, or `session_id` in the body
        body_session = data.pop("session_id", None)
        if body_session is not None and (not isinstance(body_session, str) or not body_session):
            return error_response(OpenAIError(400, "session_id must be a non-empty string", "session_id"))
        source = ManagerTokens(manager, session_of(request, body_session))
        response = await handle(request, chat, data, source, await tokenizer.get())
        if 400 <= response.status < 500:  # answered, not raised: count it as the middleware would
            manager.metrics.requests_rejected.labels(str(response.status)).inc()
        return response

    async def completions(request: web.Request) -> web.StreamResponse:
        return await answer(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await answer(request, chat=True)

    async def render(request: web.Request) -> web.Response:
        return await render_chat(request, tokenizer.get)

    return [
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
        web.post("/v1/chat/completions/render", render),
    ]
