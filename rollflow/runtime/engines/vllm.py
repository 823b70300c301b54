"""Client for vLLM's OpenAI server: `/v1/completions` with a token-id prompt, streamed.

Each streamed choice carries the new `token_ids` (`return_token_ids`) and the sampled tokens'
logprobs (`logprobs: 0`). The usage event after the last choice (`stream_options.include_usage`)
says how many prompt tokens vLLM served from its prefix cache (`usage.prompt_tokens_details.
cached_tokens`, when the server runs with `--enable-prompt-tokens-details`); the finishing chunk
waits for it and carries that count. Aborting is closing the stream: vLLM aborts a request whose client went
away. Pausing, weight versions, reloading weights from disk and sleeping use the RL endpoints vLLM serves
when started with `VLLM_SERVER_DEV_MODE=1` (`/pause?mode=keep`, `/resume`, `/weight_info`,
`/update_weight_version`, `/collective_rpc` -> `reload_weights`, `/sleep?level=1` and `/wake_up`
with `--enable-sleep-mode`); without it those calls raise NotSupportedError saying so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Unpack

import aiohttp

from rollflow.runtime.engines.base import (
    EngineError,
    EngineRejectedError,
    EngineResponseError,
    GenerateChunk,
    NotSupportedError,
    RequestFailedError,
)
from rollflow.runtime.engines.http import (
    ClientOptions,
    HttpEngine,
    failure_text,
    iter_sse_json,
    parse_weight_version,
    raise_for_status,
)
from rollflow.runtime.engines.load import EngineLoad, parse_vllm_metrics
from rollflow.runtime.wire.base import SamplingParams, engine_sampling

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
LOAD_TIMEOUT_S = 2.0
DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 to enable it"


class VLLMClient(HttpEngine):
    """A vLLM OpenAI-compatible server at `url`; `model` defaults to the first one it serves."""

    server_name = "a vLLM server"

    def __init__(self, url: str, model: str | None = None, **options: Unpack[ClientOptions]) -> None:
        super().__init__(url, **options)
        self._model = model
        # rid -> open response, so abort() can close it; rids whose stream was closed by abort()
        self._open: dict[str, aiohttp.ClientResponse] = {}
        self._aborted: set[str] = set()

    async def model(self) -> str:
        if self._model is None:
            listing = await self.get_json("/v1/models")
            try:
                self._model = listing["data"][0]["id"]
            except (TypeError, KeyError, IndexError):
                raise EngineResponseError(
                    f"{self.url}/v1/models lists no model: {str(listing)[:200]}"
                ) from None
        return self._model

    async def generate(
        self, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk]:
        body = {
            "model": await self.model(),
            "prompt": input_ids,
            "request_id": rid,
            "stream": True,
            "logprobs": 0,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
            **vllm_sampling_params(sampling),
        }
        finished = False
        final = GenerateChunk([], [], None, None)  # the finishing chunk, held for the usage event
        try:
            async with self.session.post(
                self.url + "/v1/completions", json=body, headers=self.headers, timeout=self._stream_timeout
            ) as resp:
                await raise_for_status(resp)
                self._open[rid] = resp
                text = ""
                try:
                    async for payload in iter_sse_json(resp):
                        if finished:  # the usage event follows the finishing choice
                            final = final._replace(cached_tokens=parse_vllm_cached_tokens(payload))
                            break
                        chunk = parse_vllm_event(payload, text)
                        if chunk is None:
                            continue
                        text = chunk.text or text
                        if chunk.finish_reason is not None:
                            final, finished = chunk, True
                            continue
                        yield chunk
                finally:
                    self._open.pop(rid, None)
                    if not finished:
                        resp.close()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            if not finished and rid not in self._aborted:
                raise EngineError(
                    f"stream of {rid!r} from {self.url} broke off: {failure_text(exc)}"
                ) from exc
        if finished:  # a stream that broke after its last tokens loses only the usage
            self._aborted.discard(rid)
            yield final
            return
        if rid in self._aborted:
            # abort() closed the stream; vLLM drops the request when its client goes away
            self._aborted.discard(rid)
            yield GenerateChunk([], [], "abort", None)
            return
        raise EngineResponseError(f"stream of {rid!r} from {self.url} ended without a finish_reason")

    async def abort(self, rid: str) -> None:
        resp = self._open.pop(rid, None)
        if resp is not None:
            self._aborted.add(rid)
            resp.close()

    async def load(self) -> EngineLoad | None:
        """The running/waiting/KV gauges of vLLM's Prometheus `/metrics`; None when it serves none."""
        try:
            text = await self.get_text("/metrics", timeout_s=LOAD_TIMEOUT_S)
        except EngineRejectedError:
            return None
        try:
            return parse_vllm_metrics(text)
        except ValueError as exc:
            raise EngineResponseError(f"{self.url}/metrics: {exc}") from None

    async def weight_version(self) -> int | None:
        if await self.status("/weight_info") != 200:
            return None
        info = await self.get_json("/weight_info")
        if not isinstance(info, dict):
            raise EngineResponseError(f"{self.url}/weight_info answered {info!r}")
        return parse_weight_version(info.get("weight_version"))

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        answer = await self._dev_post(
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": path}},
            "reloading weights from disk",
        )
        if answer is not None and not isinstance(answer, dict):
            raise EngineResponseError(f"{self.url}/collective_rpc answered {str(answer)[:200]!r}")
        # Cached prefixes hold keys and values of the old weights.
        await self._dev_post("/reset_prefix_cache", None, "resetting the prefix cache")
        await self._dev_post("/update_weight_version", {"new_version": str(version)}, "weight versions")

    async def pause(self) -> None:
        await self._dev_post("/pause?mode=keep", None, "pausing")

    async def resume(self) -> None:
        await self._dev_post("/resume", None, "resuming")

    async def release_memory_occupation(self) -> None:
        # level 1: weights move to CPU memory, the KV cache is dropped (needs --enable-sleep-mode)
        await self._dev_post("/sleep?level=1", None, "sleep mode")

    async def resume_memory_occupation(self) -> None:
        await self._dev_post("/wake_up", None, "sleep mode")

    async def _dev_post(self, path: str, body: Any, what: str) -> Any:
        try:
            return await self.post_json(path, body, timeout_s=600)
        except EngineRejectedError as exc:
            if "HTTP 404" in str(exc):
                raise NotSupportedError(
                    f"{self.url} does not serve {path.split('?')[0]} ({what}): {DEV_MODE_HINT}"
                ) from None
            raise


def vllm_sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """vLLM's completion fields for `sampling` (fields at their defaults are left out)."""
    return engine_sampling(sampling, "vllm")


def parse_vllm_event(payload: dict[str, Any], text_seen: str = "") -> GenerateChunk | None:
    """New tokens of one streamed completion event (and the text so far: `text_seen` plus this
    event's); None for an event with no choice (usage only)."""
    if "error" in payload:
        raise RequestFailedError(f"vLLM reported an error mid-stream: {payload['error']}")
    choices = payload.get("choices")
    if not isinstance(choices, list):
        raise EngineResponseError(f"completion event without choices: {str(payload)[:200]}")
    if not choices:
        return None
    choice = choices[0]
    token_ids = choice.get("token_ids") or []
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if not isinstance(token_ids, list) or len(logprobs) != len(token_ids):
        raise EngineResponseError(
            f"completion event has {len(token_ids)} token_ids and {len(logprobs)} logprobs: {str(choice)[:200]}"
        )
    try:
        token_ids = [int(t) for t in token_ids]
        logprobs = [float(lp) for lp in logprobs]
    except (TypeError, ValueError):
        raise EngineResponseError(f"malformed token_ids or logprobs: {str(choice)[:200]}") from None
    finish = choice.get("finish_reason")
    if finish is not None and finish not in FINISH_REASONS:
        raise EngineResponseError(f"unknown finish_reason {finish!r}")
    text = choice.get("text")
    text = text_seen + text if isinstance(text, str) else None
    return GenerateChunk(token_ids, logprobs, FINISH_REASONS.get(finish) if finish else None, None, text=text)


def parse_vllm_cached_tokens(payload: dict[str, Any]) -> int | None:
    """Prompt tokens served from vLLM's prefix cache, from a usage event; None when it does not say
    (a server without `--enable-prompt-tokens-details`, or no usage)."""
    usage = payload.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None
