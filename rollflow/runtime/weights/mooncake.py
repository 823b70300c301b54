"""Mooncake's transfer engine as the way a payload's chunks travel (`weights_transport: mooncake`).

Over HTTP an engine GETs each chunk from the weight server. With Mooncake the weight server puts a
payload's chunks (its encoded bytes: int8, delta and zstd already applied) in memory registered
with its TransferEngine, and the engine's own TransferEngine reads each chunk straight from there
(TCP on any machine, RDMA where there is a NIC for it) into memory registered on its side. The
manifest, the per-chunk checksums, the decode and its digest checks and the retries are those of
HTTP: only the bytes of the chunks take another path.

The package (`mooncake-transfer-engine-non-cuda`) needs Debian's libibverbs1, librdmacm1 and
libnuma1 to import. Where it does not load, or the engine cannot start, `load_engine` says why and
each side uses HTTP.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PROTOCOLS = ("tcp", "rdma")
MAX_EXPORTED_PAYLOADS = 8  # payloads a server keeps in registered memory (each a full copy of its chunks)


@dataclass(frozen=True)
class Engine:
    """A started TransferEngine and the address its peers reach it at."""

    engine: Any  # mooncake.engine.TransferEngine
    session: str  # host:port of its handshake listener


@dataclass(frozen=True)
class Unavailable:
    """Why Mooncake cannot be used in this process."""

    reason: str


def load_engine(hostname: str = "127.0.0.1", protocol: str = "tcp") -> Engine | Unavailable:
    """A TransferEngine on `hostname` (peer-to-peer handshake, no metadata server), or why not."""
    # Mooncake's INFO lines (several per connection) stay out of rollflow's logs; warnings and errors do not
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    try:
        from mooncake.engine import TransferEngine
    except (ImportError, OSError) as exc:
        return Unavailable(
            f"mooncake does not import ({exc}); install mooncake-transfer-engine-non-cuda==0.3.13.post1 "
            "and libibverbs1 librdmacm1 libnuma1 (make install does both)"
        )
    engine = TransferEngine()
    status = engine.initialize(hostname, "P2PHANDSHAKE", protocol, "")
    if status != 0:
        return Unavailable(
            f"mooncake's transfer engine did not start ({protocol} on {hostname}: status {status})"
        )
    return Engine(engine, f"{hostname}:{engine.get_rpc_port()}")


@functools.cache
def local_engine() -> Engine | Unavailable:
    """This process's one TCP engine on 127.0.0.1 (a puller's side), started on first use."""
    return load_engine("127.0.0.1", "tcp")


@dataclass(frozen=True)
class ChunkAddress:
    """Where one chunk's wire bytes lie in the server's registered memory."""

    index: int
    address: int  # virtual address in the server process
    nbytes: int


@dataclass(frozen=True)
class PayloadLocation:
    """What a puller needs to read a payload's chunks over Mooncake."""

    session: str
    chunks: tuple[ChunkAddress, ...]

    def to_json(self) -> dict:
        return {"session": self.session, "chunks": [vars(c) for c in self.chunks]}

    @classmethod
    def from_json(cls, body: dict) -> PayloadLocation:
        chunks = tuple(
            ChunkAddress(int(c["index"]), int(c["address"]), int(c["nbytes"])) for c in body["chunks"]
        )
        return cls(str(body["session"]), chunks)


class PayloadExporter:
    """The server's side: payloads' chunks copied into registered memory, newest kept."""

    def __init__(self, engine: Engine, max_payloads: int = MAX_EXPORTED_PAYLOADS) -> None:
        self.engine = engine
        self.max_payloads = max_payloads
        self._exported: dict[str, tuple[np.ndarray, PayloadLocation]] = {}  # oldest first
        self._lock = threading.Lock()

    def export(self, payload_id: str, chunk_paths: list[Path]) -> PayloadLocation:
        """The payload's location, registering its chunks first if they are not yet."""
        with self._lock:
            if payload_id in self._exported:
                return self._exported[payload_id][1]
            sizes = [path.stat().st_size for path in chunk_paths]
            buffer = np.empty(max(sum(sizes), 1), dtype=np.uint8)
            offset, chunks = 0, []
            for index, (path, size) in enumerate(zip(chunk_paths, sizes, strict=True)):
                buffer[offset : offset + size] = np.frombuffer(path.read_bytes(), dtype=np.uint8)
                chunks.append(ChunkAddress(index, buffer.ctypes.data + offset, size))
                offset += size
            if self.engine.engine.register_memory(buffer.ctypes.data, buffer.nbytes) != 0:
                raise OSError(f"mooncake could not register {buffer.nbytes} bytes of payload {payload_id}")
            location = PayloadLocation(self.engine.session, tuple(chunks))
            self._exported[payload_id] = (buffer, location)
            log.info("payload %s in mooncake memory: %d chunks, %d bytes", payload_id, len(chunks), offset)
            while len(self._exported) > self.max_payloads:
                self._release(next(iter(self._exported)))
            return location

    def close(self) -> None:
        with self._lock:
            for payload_id in list(self._exported):
                self._release(payload_id)

    def _release(self, payload_id: str) -> None:
        buffer, _ = self._exported.pop(payload_id)
        self.engine.engine.unregister_memory(buffer.ctypes.data)


class ChunkReader:
    """The puller's side: reads chunks of one payload into a buffer registered for the pull."""

    def __init__(self, engine: Engine, location: PayloadLocation) -> None:
        self.engine = engine
        self.location = location
        self._chunks: dict[int, tuple[ChunkAddress, int]] = {}  # index -> (its address, offset here)
        offset = 0
        for chunk in location.chunks:
            self._chunks[chunk.index] = (chunk, offset)
            offset += chunk.nbytes
        self._buffer = np.empty(max(offset, 1), dtype=np.uint8)
        if engine.engine.register_memory(self._buffer.ctypes.data, self._buffer.nbytes) != 0:
            raise OSError(f"mooncake could not register a {self._buffer.nbytes}-byte receive buffer")

    def read(self, index: int) -> bytes:
        """One chunk's wire bytes; OSError when the transfer fails (the server gone, say)."""
        chunk, offset = self._chunks[index]
        status = self.engine.engine.transfer_sync_read(
            self.location.session, self._buffer.ctypes.data + offset, chunk.address, chunk.nbytes
        )
        if status < 0:
            raise OSError(f"mooncake read of chunk {chunk.index} from {self.location.session} failed")
        return self._buffer[offset : offset + chunk.nbytes].tobytes()

    def close(self) -> None:
        self.engine.engine.unregister_memory(self._buffer.ctypes.data)
