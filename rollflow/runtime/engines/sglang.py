"""Client for SGLang's native API (`/generate` with input_ids), also served by the built-in engine.

SGLang streams either the whole output so far in every event (its default) or only the new part
(`--incremental-streaming-output`); `meta_info.completion_tokens` is cumulative in both, so the
client takes the last `completion_tokens - seen` ids and logprobs of each event as the new ones.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

import aiohttp
import orjson

from rollflow.runtime.engines.base import (
    EngineError,
    EngineRejectedError,
    EngineResponseError,
    GenerateChunk,
    RequestFailedError,
)
from rollflow.runtime.engines.http import (
    ClientOptions,
    HttpEngine,
    SseBlock,
    SseLines,
    failure_text,
    parse_weight_version,
    raise_for_status,
    sse_json,
    sse_line_json,
    status_error,
)
from rollflow.runtime.engines.load import EngineLoad, parse_sglang_get_load, parse_sglang_loads
from rollflow.runtime.engines.pool import ProtocolError, Response
from rollflow.runtime.engines.trim import trim_event
from rollflow.runtime.wire.base import SamplingParams, engine_sampling

if TYPE_CHECKING:
    import torch

FINISH_TYPES = frozenset({"stop", "length", "abort"})
_FLOAT, _INT = frozenset({float}), frozenset({int})
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
LOAD_ROUTES = (("/v1/loads", parse_sglang_loads), ("/get_load", parse_sglang_get_load))  # newest first
LOAD_TIMEOUT_S = 2.0


class SGLangClient(HttpEngine):
    """An SGLang server (or the built-in engine) at `url`."""

    server_name = "an SGLang server"

    def __init__(self, url: str, **options: Unpack[ClientOptions]) -> None:
        super().__init__(url, **options)
        self._missing_load_routes: set[str] = set()  # load routes this server answered 4xx to
        # the last sampling params sent and SGLang's form of them: requests alike share one object
        self._last_sampling: tuple[SamplingParams, dict[str, Any]] | None = None

    async def generate(
        self, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk]:
        stream = await self.open_stream(rid, input_ids, sampling)
        try:
            while not stream.over:
                for chunk in stream.chunks(await stream.read_pieces()):
                    yield chunk
            stream.check_finished()
        finally:
            stream.close()

    async def open_stream(self, rid: str, input_ids: list[int], sampling: SamplingParams) -> GenerateStream:
        """`generate`'s request, sent, and its answer's head read: the stream, for a caller that
        reads it without a task (`GenerateStream.on_bytes`), or awaits it as `generate` does.
        Raises as `generate` does for a refused request or a broken connection."""
        last = self._last_sampling
        if last is None or last[0] is not sampling:
            last = self._last_sampling = (sampling, sglang_sampling_params(sampling))
        body = {
            "rid": rid,
            "input_ids": input_ids,
            "sampling_params": last[1],
            "stream": True,
            "return_logprob": True,
        }
        url = self.url + "/generate"
        try:
            response = await self.pool.request("POST", "/generate", orjson.dumps(body), self.headers)
            if response.status >= 300:
                try:
                    text = (await response.read()).decode(errors="replace")
                finally:
                    response.close()
                raise status_error("POST", url, response.status, text)
        except (TimeoutError, OSError, ProtocolError) as exc:
            raise _broke_off(rid, self.url, exc) from exc
        return GenerateStream(rid, self.url, response)

    async def abort(self, rid: str) -> None:
        await self.post_json("/abort_request", {"rid": rid})

    async def load(self) -> EngineLoad | None:
        """SGLang's `/v1/loads`, else its older `/get_load`; None when the server has neither (a
        route that answered 404 once is not asked again)."""
        for path, parse in LOAD_ROUTES:
            if path in self._missing_load_routes:
                continue
            try:
                payload = await self.get_json(path, timeout_s=LOAD_TIMEOUT_S)
            except EngineRejectedError:
                self._missing_load_routes.add(path)
                continue
            try:
                return parse(payload)
            except ValueError as exc:
                raise EngineResponseError(f"{self.url}{path}: {exc}") from None
        return None

    async def weight_version(self) -> int | None:
        try:
            info = await self.get_json("/get_weight_version")
        except EngineRejectedError:
            # older SGLang: only /get_model_info has it
            info = await self.get_json("/get_model_info")
        if not isinstance(info, dict):
            raise EngineResponseError(f"{self.url} answered {info!r} for its weight version")
        return parse_weight_version(info.get("weight_version"))

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        # SGLang types weight_version as a string; the built-in engine parses it as an integer.
        answer = await self.post_json(
            "/update_weights_from_disk", {"model_path": path, "weight_version": str(version)}, timeout_s=600
        )
        _check_success(answer, self.url, "update_weights_from_disk")

    async def pause(self) -> None:
        await self.post_json("/pause_generation", {"mode": "in_place"})

    async def resume(self) -> None:
        await self.post_json("/continue_generation", {})

    async def release_memory_occupation(self) -> None:
        # SGLang answers with an empty body; the built-in engine with {"success": ...}
        answer = await self.post_json("/release_memory_occupation", {"tags": None}, timeout_s=600)
        if answer is not None:
            _check_success(answer, self.url, "release_memory_occupation")

    async def resume_memory_occupation(self) -> None:
        answer = await self.post_json("/resume_memory_occupation", {"tags": None}, timeout_s=600)
        if answer is not None:
            _check_success(answer, self.url, "resume_memory_occupation")


class BuiltinEngineClient(SGLangClient):
    """The built-in engine, which also takes weights pushed over HTTP or pulls them itself."""

    async def update_weights_from_server(
        self, url: str, version: int, codec: str | None = None, transport: str | None = None
    ) -> None:
        body = {"url": url, "weight_version": version} | ({"codec": codec} if codec is not None else {})
        body |= {"transport": transport} if transport is not None else {}
        answer = await self.post_json("/update_weights_from_server", body, timeout_s=600)
        _check_success(answer, self.url, "update_weights_from_server")

    async def push_weights(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Send some or all of the model's tensors (safetensors bytes) and switch to `version`."""
        from safetensors.torch import save

        data = save({name: t.detach().contiguous().cpu() for name, t in tensors.items()})
        try:
            async with self.session.post(
                f"{self.url}/update_weights_from_safetensors",
                params={"weight_version": str(version)},
                data=data,
                headers=self.headers | {"Content-Type": "application/octet-stream"},
                timeout=aiohttp.ClientTimeout(total=600),
            ) as resp:
                await raise_for_status(resp)
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise EngineError(f"pushing weights to {self.url} failed: {failure_text(exc)}") from exc
        _check_success(answer, self.url, "update_weights_from_safetensors")


def sglang_sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """SGLang's `sampling_params` for `sampling` (fields at their defaults are left out)."""
    return engine_sampling(sampling, "sglang")


class GenerateStream:
    """One `/generate` stream once its head is in: its reads reduced to chunks of tokens.

    `chunks` turns a read's pieces into the chunks they add, up to the one that finishes; the
    stream is `over` after it, or once the body ended (or sent `data: [DONE]`) without one, which
    `check_finished` raises as the engine's fault. `close` gives the connection
    back when the stream finished (its rest, `data: [DONE]`, is read and dropped) or closes it
    (the engine aborts a request whose client went away)."""

    def __init__(self, rid: str, url: str, response: Response) -> None:
        self.rid = rid
        self._url = url
        self._response = response
        self._events = EventReducer(url + "/generate")
        self.finished = False
        self._ended = False

    @property
    def over(self) -> bool:
        return self.finished or self._ended

    async def read_pieces(self) -> list[bytes]:
        """The next read's pieces, waiting for them ([] at the body's end)."""
        try:
            return await self._response.read_pieces()
        except (TimeoutError, OSError, ProtocolError) as exc:
            raise _broke_off(self.rid, self._url, exc) from exc

    def take_pieces(self) -> list[bytes] | None:
        """`read_pieces` without waiting: None when nothing came since the last call."""
        try:
            return self._response.take_pieces()
        except (TimeoutError, OSError, ProtocolError) as exc:
            raise _broke_off(self.rid, self._url, exc) from exc

    def on_bytes(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever there is something to take (pool.Response.on_bytes)."""
        self._response.on_bytes(listener)

    def chunks(self, pieces: list[bytes]) -> list[GenerateChunk]:
        """The chunks one read's `pieces` add ([]: the body's end), up to the finishing one."""
        chunks = self._events.feed(pieces) if pieces else self._events.end()
        for index, chunk in enumerate(chunks):
            if chunk.finish_reason is not None:
                self.finished = True
                return chunks[: index + 1]
        self._ended = not pieces or self._events.done or self._events.error is not None
        return chunks

    def check_finished(self) -> None:
        """Raise for a stream that is over without a finish: the engine's fault, or a failure it
        reported mid-stream (after the tokens before it were read)."""
        if self._events.error is not None:
            raise self._events.error
        if not self.finished:
            raise EngineResponseError(
                f"stream of {self.rid!r} from {self._url} ended without a finish_reason"
            )

    def close(self) -> None:
        if self.finished:
            self._response.release()
        else:
            self._response.close()


def _broke_off(rid: str, url: str, exc: BaseException) -> EngineError:
    return EngineError(f"stream of {rid!r} from {url} broke off: {failure_text(exc)}")


class EventReducer:
    """One `/generate` stream's events, reduced to as few chunks as each read of the socket allows.

    An engine that outruns its reader leaves many events in each read (tens per read under a load
    of long streams), and SGLang's default events each repeat the whole output so far: parsing
    every one costs the manager time in proportion to the output's length, per token. The newest
    event of a read holds everything the older ones do, so it alone is parsed, unless it does not
    (an engine streaming increments: every event is parsed, and the read's tokens go out as one
    chunk) or the engine's weight version changed within the read (every event is parsed, and each
    version's tokens make a chunk of their own, so every token keeps the version that made it)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._sse = SseLines(url)
        self._num_seen = 0
        self._text = ""
        self._version: int | None = None
        self._started = False  # an event was parsed: `_version` is the stream's version so far
        # why the stream broke off: an event that is not a /generate event (what came before it is kept)
        self.error: EngineResponseError | None = None

    @property
    def done(self) -> bool:
        """The stream's `data: [DONE]` was read."""
        return self._sse.done

    def feed(self, pieces: list[bytes]) -> list[GenerateChunk]:
        """The chunks of tokens that one read's `pieces` (its body bytes, in order) add, up to a
        finish."""
        return self._reduce(self._sse.feed(pieces))

    def end(self) -> list[GenerateChunk]:
        """The body ended: what its last line without a newline adds."""
        return self._reduce(self._sse.end())

    def _reduce(self, block: SseBlock) -> list[GenerateChunk]:
        found = self._sse.newest(block) if block else None
        if found is not None:
            last, done = found
            try:
                newest, dropped = self._newest(last)
            except EngineResponseError:
                newest = None  # a broken newest event: the read's events are parsed one by one
            if (
                newest is not None
                and _holds_whole_output(newest, dropped)
                and self._keeps_version(newest, block)
            ):
                self._sse.done = done
                return self._chunks([newest], dropped)
        payloads = []
        for data in self._sse.lines(block):
            try:
                payloads.append(sse_json(data, self._url))
            except EngineResponseError as exc:
                self.error = exc  # the events before it hold tokens the engine made: they are kept
                break
        return self._chunks(payloads)

    def _newest(self, line: memoryview) -> tuple[dict[str, Any], int]:
        """A read's newest event (a `data: {...}` line), without the tokens seen already when it
        repeats them (trim.py says why), and how many were cut from the front of its lists."""
        data = line[len(b"data: ") :]
        trimmed = trim_event(data, self._num_seen)
        if trimmed is not None:
            try:
                return sse_json(trimmed, self._url), self._num_seen
            except EngineResponseError:
                pass  # what is left is not JSON: the whole event is parsed, for the error's own words
        return sse_json(data, self._url), 0

    def _chunks(self, payloads: list[dict[str, Any]], dropped: int = 0) -> list[GenerateChunk]:
        """The chunks of the events' `payloads`, each with `dropped` tokens cut from its lists."""
        self._started = self._started or bool(payloads)
        chunks = []
        for payload in payloads:
            try:
                chunk = parse_sglang_event(payload, self._num_seen, self._text, dropped)
            except EngineResponseError as exc:
                self.error = exc  # the engine's word that the request failed, or an event not its own
                break
            self._num_seen += len(chunk.token_ids)
            if chunk.text is not None:
                self._text = chunk.text
            if chunk.weight_version is not None:
                self._version = chunk.weight_version
            chunks.append(chunk)
            if chunk.finish_reason is not None:
                break
        return _by_version(chunks)

    def _keeps_version(self, newest: dict[str, Any], block: SseBlock) -> bool:
        """Whether the read's newest event has the weight version the stream had before the read
        (on a stream's first read, the version of its first event)."""
        before = self._version if self._started else _version_of(sse_line_json(block.first_line(), self._url))
        return _version_of(newest) == before


def _version_of(payload: dict[str, Any]) -> int | None:
    meta = payload.get("meta_info")
    return parse_weight_version(meta.get("weight_version")) if isinstance(meta, dict) else None


def _holds_whole_output(payload: dict[str, Any], dropped: int = 0) -> bool:
    """Whether an event repeats every token of its request (SGLang's default streaming), the
    `dropped` cut from the front of its lists counted."""
    meta = payload.get("meta_info")
    if "error" in payload or not isinstance(meta, dict):
        return False
    entries = meta.get("output_token_logprobs")
    return isinstance(entries, list) and len(entries) + dropped == meta.get("completion_tokens")


def _by_version(chunks: list[GenerateChunk]) -> list[GenerateChunk]:
    """Consecutive chunks joined into one per run of one weight version (a finished chunk ends its
    run), so every token keeps the version that made it and a reader pays per run, not per event."""
    runs: list[list[GenerateChunk]] = []
    for chunk in chunks:
        if (
            runs
            and runs[-1][-1].weight_version == chunk.weight_version
            and runs[-1][-1].finish_reason is None
        ):
            runs[-1].append(chunk)
        else:
            runs.append([chunk])
    return [run[0] if len(run) == 1 else _joined(run) for run in runs]


def _joined(run: list[GenerateChunk]) -> GenerateChunk:
    """Consecutive chunks of one stream, of one weight version, as one (joined once, not pairwise:
    a read of many incremental events would otherwise copy its tokens once per event)."""
    texts = [chunk.text for chunk in run if chunk.text is not None]
    cached = [chunk.cached_tokens for chunk in run if chunk.cached_tokens is not None]
    return run[-1]._replace(
        token_ids=[token for chunk in run for token in chunk.token_ids],
        logprobs=[logprob for chunk in run for logprob in chunk.logprobs],
        text=texts[-1] if texts else None,
        cached_tokens=cached[-1] if cached else None,
    )


def parse_sglang_event(
    payload: dict[str, Any], num_seen: int, text_seen: str = "", dropped: int = 0
) -> GenerateChunk:
    """The tokens in one /generate event that come after the `num_seen` already reported, and the
    request's text so far (`text_seen` plus this event's, when the server streams increments).
    `dropped`: elements cut from the front of the event's `output_ids` and `output_token_logprobs`
    before it was parsed (trim.py), which the counts here add back."""
    if "error" in payload:
        raise RequestFailedError(f"engine reported an error mid-stream: {payload['error']}")
    meta = payload.get("meta_info")
    if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
        raise EngineResponseError(
            f"/generate event without meta_info.completion_tokens: {str(payload)[:200]}"
        )
    num_new = meta["completion_tokens"] - num_seen
    logprob_entries = meta.get("output_token_logprobs")
    if not isinstance(logprob_entries, list) or num_new < 0 or num_new > len(logprob_entries):
        raise EngineResponseError(
            f"/generate event reports {meta['completion_tokens']} tokens after {num_seen} were seen, "
            f"with {len(logprob_entries) + dropped if isinstance(logprob_entries, list) else 'no'} logprobs"
        )
    new_entries = logprob_entries[len(logprob_entries) - num_new :]
    try:
        logprobs = list(map(_FIRST, new_entries))  # in C: no bytecode per token
        token_ids = list(map(_SECOND, new_entries))
        # as engines send them, floats and ints: checked by type in C, no conversion call per token
        if not (_FLOAT.issuperset(map(type, logprobs)) and _INT.issuperset(map(type, token_ids))):
            logprobs = list(map(float, logprobs))
            token_ids = list(map(int, token_ids))
    except (TypeError, ValueError, LookupError):  # LookupError: an entry that is a dict, or too short
        raise EngineResponseError(f"malformed output_token_logprobs: {str(new_entries)[:200]}") from None
    output_ids = payload.get("output_ids")
    if isinstance(output_ids, list) and num_new and output_ids[len(output_ids) - num_new :] != token_ids:
        raise EngineResponseError("output_ids and output_token_logprobs disagree")
    finish = meta.get("finish_reason")
    finish_type = message = status_code = None
    if finish is not None:
        finish_type = finish.get("type") if isinstance(finish, dict) else None
        if finish_type not in FINISH_TYPES:
            raise EngineResponseError(f"unknown finish_reason {finish!r}")
        if finish.get("message") is not None:
            message = str(finish["message"])[:500]
        if isinstance(finish.get("status_code"), int) and finish["status_code"] >= 400:
            status_code = finish["status_code"]
    version = parse_weight_version(meta.get("weight_version"))
    text = payload.get("text")
    if isinstance(text, str):
        # cumulative events repeat every output id; incremental ones hold only the new ones
        incremental = isinstance(output_ids, list) and len(output_ids) + dropped < meta["completion_tokens"]
        text = text_seen + text if incremental else text
    else:
        text = None
    cached = meta.get("cached_tokens")
    cached = cached if isinstance(cached, int) and cached >= 0 else None
    return GenerateChunk(token_ids, logprobs, finish_type, version, message, status_code, text, cached)


def _check_success(answer: Any, url: str, what: str) -> None:
    if not isinstance(answer, dict) or "success" not in answer:
        raise EngineResponseError(f"{url}/{what} answered {str(answer)[:200]!r}")
    if not answer["success"]:
        raise EngineRejectedError(f"{url}/{what} failed: {answer.get('message')}")
