"""Encode a state dict into a chunked payload on disk, and decode verified chunks back.

The payload stream is every tensor's record, in name order; it is cut into `chunk_bytes`
pieces, each compressed on its own, so chunks are verified, stored and resumed independently
and decoding needs one chunk and one tensor in memory beyond the output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rollflow.runtime.weights.codecs import CodecSpec, decode_record, encode_whole, xor_delta
from rollflow.runtime.weights.errors import WeightIntegrityError
from rollflow.runtime.weights.io import ChunkEntry, Manifest, TensorEntry
from rollflow.runtime.weights.tensors import (
    StateDict,
    checksum,
    dtype_from_name,
    dtype_name,
    new_digest,
)


@dataclass(frozen=True)
class EncodedPayload:
    """What encoding wrote: the tensor records' places, the chunks, and the stream's digest."""

    tensors: tuple[TensorEntry, ...]
    chunks: tuple[ChunkEntry, ...]
    payload_digest: str


def chunk_file(payload_dir: Path, index: int) -> Path:
    return payload_dir / f"{index:06d}.chunk"


def encode_payload(
    state: StateDict,
    codec: CodecSpec,
    base: StateDict | None,
    out_dir: Path,
    *,
    chunk_bytes: int,
    zstd_level: int,
    block_bytes: int,
) -> EncodedPayload:
    """Write `state` (contiguous CPU tensors) as chunk files in `out_dir`; delta needs `base`."""
    writer = _ChunkWriter(out_dir, chunk_bytes, zstd_level if codec.zstd else None)
    entries = []
    for name in sorted(state):
        tensor = state[name]
        base_tensor = base.get(name) if base is not None else None
        offset = writer.position
        entry = dict(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), offset=offset)
        if (
            base_tensor is not None
            and base_tensor.dtype == tensor.dtype
            and base_tensor.shape == tensor.shape
        ):
            delta = xor_delta(tensor, base_tensor, block_bytes)
            writer.write(delta.data)
            encoding = "xor" if delta.changed_blocks else "same"
            extra = (
                dict(block_bytes=block_bytes, changed_blocks=delta.changed_blocks)
                if delta.changed_blocks
                else {}
            )
            entries.append(TensorEntry(**entry, encoding=encoding, nbytes=delta.data.size, **extra))
            continue
        encoding, record = encode_whole(tensor, codec.int8)
        writer.write(record)
        entries.append(TensorEntry(**entry, encoding=encoding, nbytes=len(record)))
    chunks, digest = writer.close()
    return EncodedPayload(tuple(entries), tuple(chunks), digest)


def verify_chunk(entry: ChunkEntry, wire: bytes) -> None:
    if len(wire) != entry.wire_nbytes or checksum(wire) != entry.checksum:
        raise WeightIntegrityError(f"chunk {entry.index} failed its checksum")


def decode_payload(
    manifest: Manifest, read_wire: Callable[[ChunkEntry], bytes], base: StateDict | None
) -> dict[str, torch.Tensor]:
    """Materialize the tensors; every chunk and the whole stream are verified on the way.

    `read_wire` returns a chunk's wire bytes; `base` must hold the manifest's base version
    when it names one. Raises WeightIntegrityError on any mismatch; returns nothing partial.
    """
    if manifest.base_version is not None and base is None:
        raise ValueError(f"payload {manifest.payload_id} is a delta; pass the base version's tensors")
    stream = _StreamReader(_decoded_chunks(manifest, read_wire))
    state: dict[str, torch.Tensor] = {}
    for entry in manifest.tensors:
        if entry.offset != stream.position:
            raise WeightIntegrityError(f"tensor {entry.name} does not start where the previous one ended")
        record = stream.read(entry.nbytes)
        state[entry.name] = _decode_tensor(entry, record, base)
    stream.finish(manifest.payload_digest)
    return state


def _decode_tensor(entry: TensorEntry, record: memoryview, base: StateDict | None) -> torch.Tensor:
    dtype = dtype_from_name(entry.dtype)
    base_tensor = None
    if entry.encoding in ("same", "xor"):
        base_tensor = base.get(entry.name) if base is not None else None
        if base_tensor is None or base_tensor.dtype != dtype or tuple(base_tensor.shape) != entry.shape:
            raise WeightIntegrityError(
                f"the base weights lack {entry.name} as {entry.dtype}{list(entry.shape)}"
            )
        base_tensor = base_tensor.detach().to("cpu").contiguous()
    return decode_record(
        entry.encoding, record, dtype, entry.shape, base_tensor, entry.changed_blocks, entry.block_bytes
    )


def _decoded_chunks(manifest: Manifest, read_wire: Callable[[ChunkEntry], bytes]) -> Iterator[bytes]:
    # imported here, not with the module: an engine imports this module to serve, and pulls rarely
    import zstandard

    decompressor = zstandard.ZstdDecompressor() if "zstd" in manifest.codec.split("+") else None
    for entry in manifest.chunks:
        wire = read_wire(entry)
        verify_chunk(entry, wire)
        try:
            raw = decompressor.decompress(wire, max_output_size=entry.raw_nbytes) if decompressor else wire
        except zstandard.ZstdError as exc:
            raise WeightIntegrityError(f"chunk {entry.index} does not decompress: {exc}") from None
        if len(raw) != entry.raw_nbytes:
            raise WeightIntegrityError(
                f"chunk {entry.index} decodes to {len(raw)} bytes, not {entry.raw_nbytes}"
            )
        yield raw


class _ChunkWriter:
    """Cuts an appended byte stream into fixed-size chunks, compresses and checksums each."""

    def __init__(self, out_dir: Path, chunk_bytes: int, zstd_level: int | None) -> None:
        self.out_dir = out_dir
        self.chunk_bytes = chunk_bytes
        if zstd_level is not None:
            import zstandard

            self.compressor = zstandard.ZstdCompressor(level=zstd_level)
        else:
            self.compressor = None
        self.buffer = bytearray()
        self.position = 0
        self.chunks: list[ChunkEntry] = []
        self.digest = new_digest()

    def write(self, data: bytes | np.ndarray) -> None:
        view = memoryview(data).cast("B")
        self.position += view.nbytes
        while view.nbytes:
            if not self.buffer and view.nbytes >= self.chunk_bytes:  # a whole chunk: no copy
                self._flush(view[: self.chunk_bytes])
                view = view[self.chunk_bytes :]
                continue
            take = min(self.chunk_bytes - len(self.buffer), view.nbytes)
            self.buffer += view[:take]
            view = view[take:]
            if len(self.buffer) == self.chunk_bytes:
                self._flush(self.buffer)
                self.buffer = bytearray()

    def close(self) -> tuple[list[ChunkEntry], str]:
        if self.buffer or not self.chunks:
            self._flush(self.buffer)
        return self.chunks, self.digest.hexdigest()

    def _flush(self, raw: bytearray | memoryview) -> None:
        self.digest.update(raw)
        wire = self.compressor.compress(raw) if self.compressor else raw
        index = len(self.chunks)
        path = chunk_file(self.out_dir, index)
        path.write_bytes(wire)
        self.chunks.append(ChunkEntry(index, len(raw), len(wire), checksum(wire)))


class _StreamReader:
    """Reads exact-length records across chunk boundaries and digests the whole stream."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.current = memoryview(b"")
        self.position = 0
        self.digest = new_digest()

    def read(self, nbytes: int) -> memoryview | np.ndarray:
        self.position += nbytes
        if nbytes <= self.current.nbytes:
            record, self.current = self.current[:nbytes], self.current[nbytes:]
            return record
        record = np.empty(nbytes, dtype=np.uint8)  # writable: the tensor takes it over, no copy
        filled = self.current.nbytes
        record[:filled] = self.current
        while filled < nbytes:
            chunk = self._next_chunk()
            take = min(nbytes - filled, chunk.nbytes)
            record[filled : filled + take] = chunk[:take]
            self.current = chunk[take:]
            filled += take
        return record

    def finish(self, expected_digest: str) -> None:
        if self.current.nbytes or next(self.chunks, None) not in (None, b""):
            raise WeightIntegrityError("payload holds bytes past its last tensor")
        if self.digest.hexdigest() != expected_digest:
            raise WeightIntegrityError("payload digest does not match the manifest")

    def _next_chunk(self) -> memoryview:
        chunk = next(self.chunks, None)
        if chunk is None:
            raise WeightIntegrityError("payload ends before its last tensor")
        self.digest.update(chunk)
        return memoryview(chunk)
