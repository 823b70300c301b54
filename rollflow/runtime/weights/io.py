"""What crosses the wire between a weight server and its pullers: the manifest of one payload.

A payload is one version of the weights encoded by one codec (optionally against a base
version). Its tensors' records are concatenated into one byte stream, which is cut into
fixed-size chunks; each chunk is compressed on its own (when the codec has zstd) and checksummed,
so a puller verifies and keeps chunks one at a time and resumes from the ones it already has.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal

from pydantic import TypeAdapter, ValidationError

from rollflow.runtime.weights.errors import WeightIntegrityError

TensorEncoding = Literal["raw", "int8", "xor", "same"]


@dataclass(frozen=True)
class ChunkEntry:
    """One piece of the payload stream as it travels."""

    index: int
    # bytes of the payload stream this chunk carries, once decompressed
    raw_nbytes: int
    # bytes on the wire (after zstd, when the codec has it)
    wire_nbytes: int
    # xxh3-128 of the wire bytes, hex
    checksum: str


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's record lies in the payload stream, and how to decode it."""

    name: str
    # torch dtype name of the tensor the puller materializes ("bfloat16", "float32", ...)
    dtype: str
    shape: tuple[int, ...]
    # raw: the tensor's bytes; int8: int8 codes then one float32 scale per row (dim 0);
    # xor: changed blocks of (new XOR base) bytes; same: equal to the base, no bytes
    encoding: TensorEncoding
    # offset of the record in the decoded payload stream
    offset: int
    # length of the record in the decoded payload stream
    nbytes: int
    # xor only: block size in bytes over the tensor's flat bytes
    block_bytes: int = 0
    # xor only: changed blocks as [start, end) block-index ranges, in order
    changed_blocks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Manifest:
    """Everything a puller needs to fetch, verify and decode one payload."""

    # names the payload in chunk URLs; one per (version, codec, base)
    payload_id: str
    version: int
    # canonical codec name, e.g. "int8+zstd", "delta+zstd", "raw"
    codec: str
    # version the delta was taken against; None for a full payload
    base_version: int | None
    # why a delta request was answered with a full payload (None when it was not)
    fallback_reason: str | None
    # xxh3-128 over the exact published tensors (names, dtypes, shapes, bytes)
    state_digest: str
    # True when decoding gives back the published tensors bit for bit (no int8)
    lossless: bool
    # total bytes of the published tensors, what a raw transfer would send
    model_nbytes: int
    # xxh3-128 over the whole decoded payload stream
    payload_digest: str
    tensors: tuple[TensorEntry, ...]
    chunks: tuple[ChunkEntry, ...]
    # small text files published beside the tensors (config.json, ...), name -> content
    files: dict[str, str] = field(default_factory=dict)
    # (tp_size, rank) whose slices (slices.py) the payload holds, and whose bytes state_digest and
    # model_nbytes count; None: the whole tensors
    tp: tuple[int, int] | None = None

    @property
    def wire_nbytes(self) -> int:
        return sum(chunk.wire_nbytes for chunk in self.chunks)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse and type-check a manifest; a malformed one is an integrity error, not a crash."""
        try:
            return _MANIFEST_ADAPTER.validate_json(text)
        except ValidationError as exc:
            raise WeightIntegrityError(f"malformed weight manifest: {exc.errors()[0]['msg']}") from None


@dataclass(frozen=True)
class VersionList:
    """The versions a store holds, oldest first."""

    versions: tuple[int, ...]

    @property
    def latest(self) -> int | None:
        return self.versions[-1] if self.versions else None


_MANIFEST_ADAPTER = TypeAdapter(Manifest)
