"""Weights read straight from the trainer ranks that hold them (`parallelism: fsdp` with
`weights_transport: mooncake`): no rank gathers the model, no weight server copies its bytes.

FSDP2 shards every parameter along dimension 0, so trainer rank r holds rows [start, end) of each
tensor. For each version every rank encodes its own rows (`ShardExporter`), in blocks of whole rows
of at most `block_bytes`, each block on its own: the codec that changes bytes (int8, delta, zstd)
is applied before the bytes are registered with the rank's Mooncake TransferEngine. With a delta
codec a block is also kept as the XOR against the same rows of the version the rank exported
before, so an engine on that version reads only what changed. Each rank answers with a
`RankExport` (where each block lies); rank 0 merges them into one `ShardedManifest` and puts it on
the weight server, which serves it (and nothing else) to engines.

An engine reads a version with `read_sharded`: every block it needs, straight from the rank that
holds it, one batch read per rank. `rows` takes a row range (dimension 0) per tensor, so an engine
rank that serves a slice of a tensor (tensor parallelism: Megatron's column split is a dim-0 row
range of the weight) reads only the blocks that hold those rows, not the whole tensor. A slice on
another dimension (a row-parallel weight, split on dim 1) reads its full rows and cuts them locally.

Every block is checked twice: the wire bytes against their checksum, and the decoded rows against
the digest of the exact bytes the rank exported (lossless codecs), so a delta applied to the wrong
base is caught and read again in full. A rank that dies mid-read fails the read (OSError): the
caller keeps its old weights.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field

import numpy as np
import torch

from rollflow.runtime.weights.codecs import CodecSpec, decode_record, encode_whole, xor_delta
from rollflow.runtime.weights.errors import WeightIntegrityError, WeightsError
from rollflow.runtime.weights.mooncake import Engine
from rollflow.runtime.weights.tensors import (
    checksum,
    dtype_from_name,
    dtype_name,
    flat_bytes,
)

log = logging.getLogger(__name__)

BLOCK_BYTES = 4 << 20  # rows per block: as many as fit, at least one
DELTA_BLOCK_BYTES = 64 << 10  # the XOR delta's own blocks inside a row block (codecs.xor_delta)
READ_TIMEOUT_S = 300.0  # one read of an engine's blocks from all ranks, at most
CONNECT_TIMEOUT_S = 30.0  # a read's allowance beyond its bytes (Mooncake's handshake with the rank)
MIN_READ_BYTES_PER_S = 10e6  # slower than this, a read counts as hung
KEEP_VERSIONS = 2  # versions a rank keeps registered: the newest, and the one engines may still read
Rows = tuple[int, int]  # [start, end) along dimension 0


@dataclass(frozen=True)
class Record:
    """One encoding of a row block, where it lies in its rank's registered memory."""

    encoding: str  # raw | int8 | xor | same (xor and same: against the base version's rows)
    address: int
    wire_nbytes: int  # what travels (after zstd)
    raw_nbytes: int  # the record before zstd
    checksum: str  # of the wire bytes
    changed_blocks: tuple[tuple[int, int], ...] = ()  # xor: the changed DELTA_BLOCK_BYTES blocks


@dataclass(frozen=True)
class Block:
    """Whole rows of one tensor, encoded in full and (delta codecs) against the base version."""

    rows: Rows
    digest: str  # of the rows' exact bytes: what a lossless decode must give
    full: Record
    delta: Record | None = None


@dataclass(frozen=True)
class Piece:
    """The rows of one tensor that one rank holds."""

    rank: int
    rows: Rows
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the version: its dtype, shape, and which rank holds which rows."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def num_rows(self) -> int:
        return self.shape[0] if self.shape else 1


@dataclass(frozen=True)
class RankExport:
    """What one rank registered for a version: its session and its pieces of each tensor."""

    rank: int
    session: str
    tensors: tuple[tuple[str, str, tuple[int, ...], Piece], ...]  # (name, dtype, shape, piece)
    nbytes: int  # exact bytes of this rank's rows (before any codec)
    wire_nbytes: int  # what it registered: the full records, and the delta ones if any
    base_version: int | None  # the version its delta records are against


@dataclass(frozen=True)
class ShardedManifest:
    """A version held by the trainer ranks: what an engine needs to read any rows of it."""

    version: int
    codec: str  # the full records' codec (no delta)
    delta_base: int | None  # the version the delta records are against; None: none kept
    sessions: dict[int, str]  # rank -> its TransferEngine's host:port
    tensors: tuple[TensorPlan, ...]
    files: dict[str, str] = field(default_factory=dict)  # config.json, ...

    @property
    def model_nbytes(self) -> int:
        return sum(math.prod(t.shape) * dtype_from_name(t.dtype).itemsize for t in self.tensors)

    @classmethod
    def merge(
        cls, version: int, codec: CodecSpec, exports: list[RankExport], files: Mapping[str, str]
    ) -> ShardedManifest:
        """Rank 0: the ranks' exports as one manifest (each tensor's pieces in row order)."""
        pieces: dict[str, list[Piece]] = {}
        kinds: dict[str, tuple[str, tuple[int, ...]]] = {}
        for export in exports:
            for name, dtype, shape, piece in export.tensors:
                kinds.setdefault(name, (dtype, shape))
                pieces.setdefault(name, []).append(piece)
        tensors = []
        for name in sorted(pieces):
            ordered = tuple(sorted(pieces[name], key=lambda p: p.rows))
            plan = TensorPlan(name, *kinds[name], ordered)
            _check_cover(plan)
            tensors.append(plan)
        bases = {e.base_version for e in exports}
        delta_base = bases.pop() if len(bases) == 1 else None  # ranks that disagree: no delta
        return cls(
            version,
            codec.without_delta().name,
            delta_base,
            {e.rank: e.session for e in exports},
            tuple(tensors),
            dict(files),
        )

    def to_json(self) -> str:
        body = {
            "version": self.version,
            "codec": self.codec,
            "delta_base": self.delta_base,
            "sessions": {str(rank): session for rank, session in self.sessions.items()},
            "tensors": [_plan_json(t) for t in self.tensors],
            "files": self.files,
        }
        return json.dumps(body)

    @classmethod
    def from_json(cls, text: str | bytes) -> ShardedManifest:
        """Parse a manifest; WeightsError naming what is wrong when it is not one."""
        try:
            body = json.loads(text)
            tensors = tuple(_plan_from_json(t) for t in body["tensors"])
            manifest = cls(
                int(body["version"]),
                CodecSpec.parse(str(body["codec"])).name,
                None if body["delta_base"] is None else int(body["delta_base"]),
                {int(rank): str(session) for rank, session in body["sessions"].items()},
                tensors,
                {str(k): str(v) for k, v in body.get("files", {}).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightsError(f"not a sharded manifest: {type(exc).__name__}: {exc}") from None
        for plan in tensors:
            _check_cover(plan)
            if any(p.rank not in manifest.sessions for p in plan.pieces):
                raise WeightsError(f"sharded manifest: {plan.name} names a rank with no session")
        return manifest


@dataclass(eq=False)
class ShardExporter:
    """A trainer rank's side: each version's rows encoded into memory registered with Mooncake."""

    engine: Engine
    rank: int
    codec: CodecSpec
    _: KW_ONLY
    keep_versions: int = KEEP_VERSIONS
    block_bytes: int = BLOCK_BYTES
    zstd_level: int = 3
    # version -> its buffer, oldest first
    _registered: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    # the last version's rows
    _base: tuple[int, dict[str, torch.Tensor]] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def export(
        self, version: int, rows: Mapping[str, tuple[torch.Tensor, int, tuple[int, ...]]]
    ) -> RankExport:
        """Register this rank's rows of `version`: name -> (its rows as a tensor, the first row's
        index, the whole tensor's shape). A tensor with no rows here is left out."""
        import zstandard

        compressor = zstandard.ZstdCompressor(level=self.zstd_level) if self.codec.zstd else None
        base_version, base = self._base if self._base is not None and self.codec.delta else (None, None)
        wire: list[bytes] = []
        layout = []  # (name, dtype, shape, start, [(rows, digest, full index, delta index)])
        kept: dict[str, torch.Tensor] = {}
        nbytes = 0
        for name in sorted(rows):
            tensor, start, shape = rows[name]
            local = tensor.detach().to("cpu").contiguous()
            if local.dim() == 0:
                local = local.reshape(1)
            if local.shape[0] == 0:
                continue
            kept[name] = local.clone() if self.codec.delta else local
            nbytes += local.numel() * local.element_size()
            row_bytes = max(local[0].numel() * local.element_size(), 1)
            per_block = max(1, self.block_bytes // row_bytes)
            blocks = []
            for first in range(0, local.shape[0], per_block):
                part = local[first : first + per_block].contiguous()
                full = self._encode_full(part)
                delta = None
                held = base.get(name) if base is not None else None
                if held is not None and held.shape == local.shape and held.dtype == local.dtype:
                    delta = self._encode_delta(part, held[first : first + per_block].contiguous())
                entries = []
                for record in (full, delta):
                    if record is None:
                        entries.append(None)
                        continue
                    encoding, raw, extra = record
                    data = compressor.compress(raw) if compressor is not None else raw
                    entries.append((encoding, len(wire), len(raw), extra))
                    wire.append(data)
                rows_here = (start + first, start + first + part.shape[0])
                blocks.append((rows_here, checksum(flat_bytes(part)), *entries))
            layout.append(
                (name, dtype_name(local.dtype), tuple(shape), (start, start + local.shape[0]), blocks)
            )
        buffer = np.empty(max(sum(len(w) for w in wire), 1), dtype=np.uint8)
        addresses, offset = [], 0
        for data in wire:
            buffer[offset : offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
            addresses.append(buffer.ctypes.data + offset)
            offset += len(data)
        with self._lock:
            if self.engine.engine.register_memory(buffer.ctypes.data, buffer.nbytes) != 0:
                raise OSError(f"mooncake could not register {buffer.nbytes} bytes of version {version}")
            self._registered[version] = buffer
            while len(self._registered) > self.keep_versions:
                self.engine.engine.unregister_memory(
                    self._registered.pop(next(iter(self._registered))).ctypes.data
                )
        self._base = (version, kept)

        def record(entry) -> Record | None:
            if entry is None:
                return None
            encoding, index, raw_nbytes, changed = entry
            data = wire[index]
            return Record(encoding, addresses[index], len(data), raw_nbytes, checksum(data), changed)

        tensors = tuple(
            (
                name,
                dtype,
                shape,
                Piece(
                    self.rank,
                    piece_rows,
                    tuple(Block(r, digest, record(full), record(delta)) for r, digest, full, delta in blocks),
                ),
            )
            for name, dtype, shape, piece_rows, blocks in layout
        )
        log.info(
            "rank %d exported version %d: %d bytes of its rows as %d bytes in mooncake memory",
            self.rank,
            version,
            nbytes,
            offset,
        )
        return RankExport(self.rank, self.engine.session, tensors, nbytes, offset, base_version)

    def close(self) -> None:
        with self._lock:
            for buffer in self._registered.values():
                self.engine.engine.unregister_memory(buffer.ctypes.data)
            self._registered.clear()

    def _encode_full(self, part: torch.Tensor) -> tuple[str, bytes, tuple]:
        encoding, record = encode_whole(part, self.codec.int8)
        return encoding, bytes(record), ()

    def _encode_delta(self, part: torch.Tensor, held: torch.Tensor) -> tuple[str, bytes, tuple]:
        delta = xor_delta(part, held, DELTA_BLOCK_BYTES)
        if not delta.changed_blocks:
            return "same", b"", ()
        return "xor", delta.data.tobytes(), delta.changed_blocks


@dataclass(frozen=True)
class ReadStats:
    """What one read moved: wire bytes per trainer rank, and whether deltas were used."""

    wire_nbytes: dict[int, int]
    blocks: int
    delta_blocks: int


def read_sharded(
    engine: Engine,
    manifest: ShardedManifest,
    *,
    rows: Mapping[str, Rows] | None = None,
    base: Mapping[str, tuple[torch.Tensor, int]] | None = None,
    base_version: int | None = None,
    timeout_s: float = READ_TIMEOUT_S,
) -> tuple[dict[str, torch.Tensor], ReadStats]:
    """The rows an engine needs of `manifest`'s version, read straight from the ranks that hold them.

    `rows`: name -> [start, end) along dimension 0 (a tensor not named is read whole); each result
    tensor holds just those rows. `base`: name -> (rows of `base_version` the engine holds, the
    first one's index): blocks whose rows it covers are read as deltas when the manifest has them.
    Raises OSError when a rank cannot be read (gone mid-transfer) or its read does not end within
    `timeout_s` (TimeoutError), WeightIntegrityError when a
    block fails its checks (`BaseMismatchError` when a delta did not apply to the engine's base).
    """
    use_delta = base is not None and base_version is not None and base_version == manifest.delta_base
    wanted: list[tuple[TensorPlan, Rows, list[tuple[Block, bool]]]] = []
    for plan in manifest.tensors:
        span = rows.get(plan.name, (0, plan.num_rows)) if rows is not None else (0, plan.num_rows)
        if not 0 <= span[0] <= span[1] <= plan.num_rows:
            raise WeightsError(f"rows {list(span)} of {plan.name} are outside its {plan.num_rows} rows")
        chosen = []
        for piece in plan.pieces:
            for block in piece.blocks:
                if block.rows[1] <= span[0] or block.rows[0] >= span[1]:
                    continue
                delta = use_delta and block.delta is not None and _holds(base, plan.name, block.rows)
                chosen.append((block, delta))
        wanted.append((plan, span, chosen))
    by_rank: dict[int, list[Record]] = {}
    owner = {id(b): p.rank for plan in manifest.tensors for p in plan.pieces for b in p.blocks}
    for _, _, chosen in wanted:
        for block, delta in chosen:
            by_rank.setdefault(owner[id(block)], []).append(block.delta if delta else block.full)
    wire = _read_records(engine, manifest.sessions, by_rank, timeout_s)
    decompressor = None
    if "zstd" in manifest.codec.split("+"):
        import zstandard

        decompressor = zstandard.ZstdDecompressor()
    out: dict[str, torch.Tensor] = {}
    for plan, span, chosen in wanted:
        dtype = dtype_from_name(plan.dtype)
        shape = plan.shape if plan.shape else (1,)
        result = torch.empty((span[1] - span[0], *shape[1:]), dtype=dtype)
        for block, delta in chosen:
            record = block.delta if delta else block.full
            data = wire[owner[id(block)], record.address, record.wire_nbytes]
            if len(data) != record.wire_nbytes or checksum(data) != record.checksum:
                raise WeightIntegrityError(
                    f"a block of {plan.name} rows {list(block.rows)} failed its checksum"
                )
            raw = decompressor.decompress(data, max_output_size=record.raw_nbytes) if decompressor else data
            block_shape = (block.rows[1] - block.rows[0], *shape[1:])
            held = _base_rows(base, plan.name, block.rows) if delta else None
            decoded = decode_record(
                record.encoding,
                memoryview(raw),
                dtype,
                block_shape,
                held,
                record.changed_blocks,
                DELTA_BLOCK_BYTES,
            )
            if record.encoding != "int8" and checksum(flat_bytes(decoded)) != block.digest:
                error = BaseMismatchError if delta else WeightIntegrityError
                raise error(f"rows {list(block.rows)} of {plan.name} decode to other bytes than the rank's")
            low, high = max(block.rows[0], span[0]), min(block.rows[1], span[1])
            result[low - span[0] : high - span[0]] = decoded[low - block.rows[0] : high - block.rows[0]]
        out[plan.name] = result.reshape(plan.shape) if not plan.shape else result
    sizes = {rank: sum(r.wire_nbytes for r in records) for rank, records in by_rank.items()}
    blocks = sum(len(chosen) for _, _, chosen in wanted)
    deltas = sum(delta for _, _, chosen in wanted for _, delta in chosen)
    return out, ReadStats(sizes, blocks, deltas)


class BaseMismatchError(WeightIntegrityError):
    """A delta block did not decode to the rank's bytes: the engine's base is not the version it
    named. Read again without a base."""


def _read_records(
    engine: Engine, sessions: Mapping[int, str], by_rank: Mapping[int, list[Record]], timeout_s: float
) -> dict[tuple[int, int, int], bytes]:
    """Every record's wire bytes by (rank, address, size): one batch read per rank, all ranks at once.

    Each rank's read runs on a thread of its own, into a buffer of its own that the thread frees
    only once Mooncake's call has returned: a rank that hangs instead of dying (killed half-way
    through its teardown) can leave that call waiting forever, and it must not hold the engine's
    update. A read that takes longer than CONNECT_TIMEOUT_S plus its bytes at MIN_READ_BYTES_PER_S
    (at most `timeout_s`) fails with TimeoutError; its thread and buffer are left behind."""
    reads = [_RankRead(engine, rank, sessions[rank], records) for rank, records in by_rank.items()]
    started = time.monotonic()
    for read in reads:
        read.thread.start()
    wire: dict[tuple[int, int, int], bytes] = {}
    for read in reads:
        allowed = min(timeout_s, CONNECT_TIMEOUT_S + read.nbytes / MIN_READ_BYTES_PER_S)
        if not read.done.wait(max(0.0, started + allowed - time.monotonic())):
            raise TimeoutError(
                f"mooncake read of {read.nbytes} bytes from trainer rank {read.rank} at {read.session} "
                f"did not end within {allowed:.0f} s"
            )
        if read.error is not None:
            raise read.error
        wire.update(read.wire)
    return wire


class _RankRead:
    """One rank's batch read, on a daemon thread (see _read_records)."""

    def __init__(self, engine: Engine, rank: int, session: str, records: list[Record]) -> None:
        self.engine, self.rank, self.session, self.records = engine, rank, session, records
        self.nbytes = sum(r.wire_nbytes for r in records)
        self.wire: dict[tuple[int, int, int], bytes] = {}
        self.error: OSError | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"mooncake-read-{rank}", daemon=True)

    def _run(self) -> None:
        try:
            self._read()
        except OSError as exc:
            self.error = exc
        finally:
            self.done.set()

    def _read(self) -> None:
        transfer = self.engine.engine
        buffer = np.empty(max(self.nbytes, 1), dtype=np.uint8)
        placed, locals_, remotes, lengths, offset = {}, [], [], [], 0
        for record in self.records:
            placed[self.rank, record.address, record.wire_nbytes] = (offset, record.wire_nbytes)
            if record.wire_nbytes:
                locals_.append(buffer.ctypes.data + offset)
                remotes.append(record.address)
                lengths.append(record.wire_nbytes)
            offset += record.wire_nbytes
        if lengths:
            if transfer.register_memory(buffer.ctypes.data, buffer.nbytes) != 0:
                raise OSError(f"mooncake could not register a {buffer.nbytes}-byte receive buffer")
            try:
                status = transfer.batch_transfer_sync_read(self.session, locals_, remotes, lengths)
            finally:
                transfer.unregister_memory(buffer.ctypes.data)
            if status < 0:
                raise OSError(f"mooncake read from trainer rank {self.rank} at {self.session} failed")
        self.wire = {key: buffer[at : at + n].tobytes() for key, (at, n) in placed.items()}


def _holds(base: Mapping[str, tuple[torch.Tensor, int]] | None, name: str, rows: Rows) -> bool:
    if base is None or name not in base:
        return False
    tensor, first = base[name]
    held = tensor.shape[0] if tensor.dim() else 1
    return first <= rows[0] and rows[1] <= first + held


def _base_rows(base: Mapping[str, tuple[torch.Tensor, int]] | None, name: str, rows: Rows) -> torch.Tensor:
    tensor, first = base[name]  # _holds said it covers them
    tensor = tensor.detach().to("cpu").reshape(-1) if tensor.dim() == 0 else tensor.detach().to("cpu")
    return tensor[rows[0] - first : rows[1] - first].contiguous()


def _check_cover(plan: TensorPlan) -> None:
    """The pieces and their blocks cover the tensor's rows once each, in order."""
    at = 0
    for piece in plan.pieces:
        if piece.rows[0] != at:
            raise WeightsError(
                f"sharded manifest: rows of {plan.name} from {at} are held by no rank (or twice)"
            )
        inner = piece.rows[0]
        for block in piece.blocks:
            if block.rows[0] != inner or block.rows[1] <= inner:
                raise WeightsError(
                    f"sharded manifest: the blocks of {plan.name} on rank {piece.rank} do not tile it"
                )
            inner = block.rows[1]
        if inner != piece.rows[1]:
            raise WeightsError(
                f"sharded manifest: the blocks of {plan.name} on rank {piece.rank} do not tile it"
            )
        at = piece.rows[1]
    if at != plan.num_rows:
        raise WeightsError(f"sharded manifest: {plan.name} has {plan.num_rows} rows, its pieces cover {at}")


def _record_json(record: Record | None) -> dict | None:
    if record is None:
        return None
    body = {k: v for k, v in vars(record).items() if k != "changed_blocks"}
    return body | (
        {"changed_blocks": [list(b) for b in record.changed_blocks]} if record.changed_blocks else {}
    )


def _record_from_json(body: dict | None) -> Record | None:
    if body is None:
        return None
    changed = tuple((int(a), int(b)) for a, b in body.get("changed_blocks", ()))
    return Record(
        str(body["encoding"]),
        int(body["address"]),
        int(body["wire_nbytes"]),
        int(body["raw_nbytes"]),
        str(body["checksum"]),
        changed,
    )


def _plan_json(plan: TensorPlan) -> dict:
    return {
        "name": plan.name,
        "dtype": plan.dtype,
        "shape": list(plan.shape),
        "pieces": [
            {
                "rank": p.rank,
                "rows": list(p.rows),
                "blocks": [
                    {
                        "rows": list(b.rows),
                        "digest": b.digest,
                        "full": _record_json(b.full),
                        "delta": _record_json(b.delta),
                    }
                    for b in p.blocks
                ],
            }
            for p in plan.pieces
        ],
    }


def _plan_from_json(body: dict) -> TensorPlan:
    pieces = tuple(
        Piece(
            int(p["rank"]),
            (int(p["rows"][0]), int(p["rows"][1])),
            tuple(
                Block(
                    (int(b["rows"][0]), int(b["rows"][1])),
                    str(b["digest"]),
                    _record_from_json(b["full"]),
                    _record_from_json(b.get("delta")),
                )
                for b in p["blocks"]
            ),
        )
        for p in body["pieces"]
    )
    dtype_from_name(str(body["dtype"]))  # a known dtype, or WeightIntegrityError
    return TensorPlan(str(body["name"]), str(body["dtype"]), tuple(int(s) for s in body["shape"]), pieces)
