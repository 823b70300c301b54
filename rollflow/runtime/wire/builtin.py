"""Request bodies the built-in engine accepts: the subset of SGLang's native API it serves.

Field names and defaults follow SGLang's, so a body written for SGLang works here unchanged; a field
SGLang has and this engine does not is a 400 naming it (rather than being silently ignored).
`/generate`'s and `/abort_request`'s bodies are shared with the manager (sglang.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import CodecError
from rollflow.runtime.wire.base import Body


class _LaxBody(Body):
    """The engine's own admin bodies take values as pydantic's lax mode reads them (`"3"` for a
    version, as SGLang types `weight_version` a string), as they always have; unknown fields stay a 400."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class UpdateWeightsFromDiskBody(_LaxBody):
    model_path: str
    """A folder of *.safetensors files (as `save_pretrained` writes) or one .safetensors file."""
    weight_version: int | None = Field(None, ge=0)
    """Version the engine reports from now on; None adds 1 to the current one."""
    abort_all_requests: bool = False
    """Abort in-flight requests first; otherwise they go on under the new weights."""


class UpdateWeightsFromServerBody(_LaxBody):
    """rollflow's pull-based update (no SGLang counterpart): fetch a version from a weight server."""

    url: str = Field(pattern=r"^https?://[^\s/]+(/.*)?$")
    """Weight server (`rollflow weights serve`) to pull from; no token is needed to pull."""
    weight_version: int = Field(ge=0)
    """Version to pull; the engine reports it once every tensor is loaded."""
    codec: str = "delta+zstd"
    """Transfer codec; a delta is taken against the version the engine pulled last (full if none)."""
    transport: Literal["http", "mooncake"] = "http"
    """How the chunks travel: http, or mooncake (read from the weight server's registered memory;
    over http, saying why, where Mooncake cannot be used)."""

    @field_validator("codec")
    @classmethod
    def _known_codec(cls, value: str) -> str:
        try:
            return CodecSpec.parse(value).name
        except CodecError as exc:
            raise ValueError(str(exc)) from None


class PauseBody(_LaxBody):
    mode: Literal["abort", "retract", "in_place"] = "abort"
    """abort: end in-flight requests with finish_reason abort; in_place: keep them, frozen;
    retract: keep them but drop their KV caches (recomputed on continue)."""


MemoryTag = Literal["weights", "kv_cache", "cuda_graph"]


class MemoryOccupationBody(_LaxBody):
    """SGLang's `/release_memory_occupation` and `/resume_memory_occupation` body."""

    tags: list[MemoryTag] | None = None
    """Regions to release or take back; None is all of them. `cuda_graph` is accepted and has
    nothing to free on a CPU engine."""
