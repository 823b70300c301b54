"""The one interface the rollout manager codes against, whatever engine serves the tokens.

A client streams one sample's new tokens as `GenerateChunk`s (only tokens not yet reported, even
when the server repeats the whole output in every event), each with the logprobs and the weight
version that made them; the last chunk carries the finish reason. Errors are typed so the manager
can tell a dead or misbehaving engine (resume elsewhere) from a request the engine refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, runtime_checkable

from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from rollflow.runtime.engines.load import EngineLoad

FinishReason = Literal["stop", "length", "abort"]


class GenerateChunk(NamedTuple):
    """Tokens an engine produced since the previous chunk of the same request.

    Immutable as a NamedTuple rather than a frozen dataclass: one is made for every event the
    manager reads, and a frozen dataclass sets each field through `object.__setattr__` (a chunk
    cost about 3 us to make that way, against 0.4 us as a tuple)."""

    # new token ids only, in order
    token_ids: list[int]
    # logprob of each new token, same length as token_ids
    logprobs: list[float]
    # set on the last chunk of a request; None while it runs
    finish_reason: FinishReason | None
    # weight version that produced these tokens, when the engine reports one
    weight_version: int | None
    # why the engine ended the request, when it says (an abort's message)
    message: str | None = None
    # HTTP status of an abort the engine blames on the request (SGLang's finish_reason.status_code);
    # None for an abort someone asked for (abort_request, pause), which is no error
    status_code: int | None = None
    # the engine's text of this attempt so far (cumulative), when it sends text
    text: str | None = None
    # prompt tokens the engine served from its prefix cache for this request, when it says
    cached_tokens: int | None = None


class EngineError(Exception):
    """The engine could not be reached, or broke off a request (connection lost, timeout)."""


class EngineResponseError(EngineError):
    """The engine answered with something that is not a valid response (bad status or body)."""


class RequestFailedError(EngineResponseError):
    """The engine, alive, ended this one request with an error event: the request may be at fault."""


class EngineRejectedError(EngineError):
    """The engine refused the request itself (HTTP 4xx): resending it elsewhere will not help."""


class NotSupportedError(EngineError):
    """The engine kind has no such operation (e.g. a weight update vLLM does not expose)."""


@runtime_checkable
class EngineClient(Protocol):
    """What the manager needs from an engine; one aiohttp session per client for its control calls
    (SGLang's `/generate` streams go over the client's own kept-alive connections, `pool.py`)."""

    url: str

    def generate(
        self, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk]:
        """Stream one sample; the last chunk has a finish_reason. Closing the iterator early aborts it."""
        ...

    async def abort(self, rid: str) -> None:
        """End a running request; its stream then finishes with "abort" (or just ends)."""
        ...

    async def health(self) -> bool:
        """True when the engine answers its health check."""
        ...

    async def load(self) -> EngineLoad | None:
        """What the engine holds now (running and waiting requests, KV use), from its load or
        metrics endpoint; None when it has none."""
        ...

    async def weight_version(self) -> int | None:
        """The version of the weights the engine serves now, None when it does not say."""
        ...

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        """Load a checkpoint folder the engine can read and report `version` from then on."""
        ...

    async def update_weights_from_server(
        self, url: str, version: int, codec: str | None = None, transport: str | None = None
    ) -> None:
        """Pull `version` from the weight server at `url` (rollflow's pull-based update; `codec` and
        `transport`, http or mooncake, None for the engine's defaults) and report it from then on; NotSupportedError for engines
        without such a route (nothing is loaded then)."""
        ...

    async def pause(self) -> None:
        """Stop producing tokens, keeping running requests in place, until `resume`."""
        ...

    async def resume(self) -> None: ...

    async def release_memory_occupation(self) -> None:
        """Give the device back: drop weights and KV cache, staying up and answering health checks
        (SGLang `/release_memory_occupation`, vLLM `/sleep`). Running requests end with "abort"."""
        ...

    async def resume_memory_occupation(self) -> None:
        """Take the device again, serving the weights held before the release (SGLang
        `/resume_memory_occupation`, vLLM `/wake_up`)."""
        ...

    async def close(self) -> None:
        """Release the HTTP session (when the client owns it)."""
        ...
