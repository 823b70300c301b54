"""The engine's side: pull a version from a WeightServer, resumably, and verify all of it.

A version the trainer ranks hold themselves (`parallelism: fsdp` with Mooncake: shards.py) is read
straight from those ranks instead: the server gives only its manifest.

A pull is manifest -> chunks -> decode. Chunks travel over HTTP, or with `transport="mooncake"`
straight from the server's registered memory through Mooncake's transfer engine (mooncake.py);
where Mooncake cannot be used (not installed here, or the server serves none), the pull says why
in one log line and uses HTTP. Each chunk is checksummed as it arrives and kept in
`cache_dir` under its payload's name, so a pull cut off half-way (server killed, network gone,
engine restarted) fetches only the chunks it lacks next time. Decoding re-verifies every chunk,
the whole stream's digest and, for lossless codecs, the digest of the exact published tensors;
a pull either returns the complete version or raises, never a half-loaded one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp
import safetensors.torch
import torch

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import (
    UnknownVersionError,
    WeightIntegrityError,
    WeightsError,
    WeightTransferError,
)
from rollflow.runtime.weights.io import ChunkEntry, Manifest, VersionList
from rollflow.runtime.weights.mooncake import ChunkReader, PayloadLocation, Unavailable, local_engine
from rollflow.runtime.weights.payload import chunk_file, decode_payload, verify_chunk
from rollflow.runtime.weights.server import FILES_METADATA_KEY
from rollflow.runtime.weights.shards import (
    READ_TIMEOUT_S,
    BaseMismatchError,
    ShardedManifest,
    read_sharded,
)
from rollflow.runtime.weights.slices import rank_slices
from rollflow.runtime.weights.store import PAYLOAD_ID
from rollflow.runtime.weights.tensors import StateDict, as_cpu_contiguous, checksum, state_digest

logger = logging.getLogger(__name__)
Transport = Literal["http", "mooncake"]
# written by `save_weights` next to the tensors: which version the folder holds
SAVED_VERSION_FILE = "rollflow_weights.json"


@dataclass(frozen=True)
class LoadedWeights:
    """A complete, verified version: what an engine loads, and its base for the next delta."""

    version: int
    state_dict: dict[str, torch.Tensor]
    # small text files published with the version (config.json, ...)
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PullStats:
    # chunk bytes downloaded over all attempts (chunks reused from disk excluded)
    wire_nbytes: int
    # chunks downloaded over all attempts; equals the chunk count when none was fetched twice
    chunks_downloaded: int
    # verified chunks found on disk, left by an earlier attempt or an interrupted pull
    chunks_reused: int
    # 1 when nothing failed
    attempts: int
    seconds: float
    # why the server (or the puller) used a full payload instead of the requested delta
    fallback_reason: str | None
    # how the chunks travelled: "http", or "mooncake" when asked for and usable
    transport: Transport = "http"


@dataclass(frozen=True)
class ShardedSource:
    """What a pull read from the trainer ranks (its fields are those of a Manifest a caller reads)."""

    manifest: ShardedManifest
    codec: str  # the codec of the records read: delta+... when deltas were read
    base_version: int | None  # the version the deltas were against
    model_nbytes: int
    wire_nbytes_by_rank: dict[int, int]


@dataclass(frozen=True)
class PullResult:
    weights: LoadedWeights
    manifest: Manifest | ShardedSource
    stats: PullStats


class _BaseMismatchError(WeightIntegrityError):
    """Chunks and stream verified, yet the result is not the version: the base was not what
    the engine named. The next attempt asks for a full payload."""


class _Retryable(Exception):
    """A failure worth another attempt (server down or restarting, payload pruned mid-pull)."""


class WeightPuller:
    """Client of one WeightServer; use as `async with WeightPuller(url, cache_dir) as puller:`."""

    def __init__(
        self,
        url: str,
        cache_dir: str | Path,
        *,
        token: str | None = None,
        max_attempts: int = 5,
        retry_delay_s: float = 0.5,
        timeout_s: float = 300.0,
        parallel_chunks: int = 4,
        on_chunk: Callable[[int, int], None] | None = None,
        transport: Transport = "http",
    ) -> None:
        """`cache_dir` holds partial pulls (one puller per folder); `on_chunk(done, total)` is
        called as each chunk is verified, for progress; delays double after each failed attempt.
        `transport`: how chunks travel (http, or mooncake where both sides can use it)."""
        self.url = url.rstrip("/")
        self.cache_dir = Path(cache_dir)
        self.token = token
        self.max_attempts = max_attempts
        self.retry_delay_s = retry_delay_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.parallel_chunks = parallel_chunks
        self.on_chunk = on_chunk
        self.transport: Transport = transport
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> WeightPuller:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def versions(self, *, newer_than: int | None = None, wait_s: float = 0.0) -> VersionList:
        """Versions the server holds; with `newer_than`, waits up to `wait_s` for a newer one."""
        params = {"wait_s": str(wait_s)} | ({"newer_than": str(newer_than)} if newer_than is not None else {})
        try:
            body = await self._get_json("/v1/versions", params)
        except (aiohttp.ClientError, TimeoutError, _Retryable) as exc:
            raise WeightTransferError(f"weight server {self.url} did not answer: {exc}") from None
        return VersionList(tuple(body["versions"]))

    async def pull(
        self,
        version: int | None = None,
        codec: CodecSpec | str = "zstd",
        base: LoadedWeights | None = None,
        tp: tuple[int, int] | None = None,
    ) -> PullResult:
        """Fetch, verify and decode `version` (None: the newest). With a delta codec, `base` is
        the version the engine holds; the transfer then carries only what changed. With `tp`
        (tp_size, rank), only that tensor-parallel rank's slices travel (slices.py), and `base`
        holds that rank's slices too."""
        codec = codec if isinstance(codec, CodecSpec) else CodecSpec.parse(codec)
        if self.transport == "mooncake":
            sharded = await self._sharded_manifest(version)
            if sharded is not None:
                return await self._pull_sharded(sharded, codec, base, tp)
        started = time.monotonic()
        counts = {"wire_nbytes": 0, "chunks_downloaded": 0, "chunks_reused": 0}
        puller_fallback: str | None = None
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            manifest: Manifest | None = None
            try:
                manifest = await self._manifest(version, codec, base, tp)
                await self._fetch_chunks(manifest, counts)
                weights = await asyncio.to_thread(self._decode, manifest, base)
            except _BaseMismatchError as exc:
                last_error = exc
                puller_fallback = str(exc)
                codec = codec.without_delta()
            except WeightIntegrityError as exc:
                last_error = exc
            except (aiohttp.ClientError, TimeoutError, _Retryable) as exc:
                last_error = exc
            else:
                self._clear_cache()
                stats = PullStats(
                    **counts,
                    attempts=attempt,
                    seconds=time.monotonic() - started,
                    fallback_reason=puller_fallback or manifest.fallback_reason,
                    transport=self.transport,
                )
                return PullResult(weights, manifest, stats)
            logger.warning("weight pull attempt %d/%d failed: %s", attempt, self.max_attempts, last_error)
            if attempt < self.max_attempts and not isinstance(last_error, _BaseMismatchError):
                await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        error_type = (
            WeightIntegrityError if isinstance(last_error, WeightIntegrityError) else WeightTransferError
        )
        raise error_type(
            f"pulling weights from {self.url} failed after {self.max_attempts} attempts: {last_error}"
        ) from None

    async def publish(
        self, version: int, state_dict: StateDict, *, files: dict[str, str] | None = None
    ) -> Manifest:
        """Upload a version to the server (the trainer's side when it runs on another machine)."""
        metadata = {FILES_METADATA_KEY: json.dumps(files or {})}
        body = await asyncio.to_thread(safetensors.torch.save, as_cpu_contiguous(state_dict), metadata)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        session = self._client()
        try:
            async with session.put(f"{self.url}/v1/versions/{version}", data=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise WeightsError(
                        f"publishing version {version} failed ({resp.status}): {_reason(text)}"
                    )
        except aiohttp.ClientError as exc:
            raise WeightTransferError(f"weight server {self.url} did not answer: {exc}") from None
        return Manifest.from_json(text)

    async def _sharded_manifest(self, version: int | None) -> ShardedManifest | None:
        """The manifest of `version` when trainer ranks hold it (None: the server holds it whole)."""
        path = f"/v1/sharded/{'latest' if version is None else version}"
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self._client().get(f"{self.url}{path}") as resp:
                    text = await resp.text()
                    if resp.status == 404:
                        return None
                    if resp.status != 200:
                        raise _Retryable(f"{path}: HTTP {resp.status}")
                return ShardedManifest.from_json(text)
            except (aiohttp.ClientError, TimeoutError, _Retryable) as exc:
                last_error = exc
                if attempt < self.max_attempts:
                    await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        raise WeightTransferError(f"weight server {self.url} did not answer: {last_error}")

    async def _pull_sharded(
        self,
        manifest: ShardedManifest,
        codec: CodecSpec,
        base: LoadedWeights | None,
        tp: tuple[int, int] | None,
    ) -> PullResult:
        """Read the version straight from the trainer ranks (a delta when `base` is the version the
        ranks' deltas are against); a rank gone mid-read fails the attempt, the next reads it again.
        A tensor-parallel rank reads only its rows of the tensors split along dim 0 (the ranks'
        blocks are rows), and narrows those split along dim 1 after reading them whole."""
        started = time.monotonic()
        engine = await asyncio.to_thread(local_engine)
        if isinstance(engine, Unavailable):
            raise WeightTransferError(
                f"weight version {manifest.version} is held by the trainer ranks and read over Mooncake, "
                f"which this engine cannot use: {engine.reason}"
            )
        splits = _tp_splits(manifest, tp)
        rows = {name: (part.start, part.stop) for name, (dim, part) in splits.items() if dim == 0}
        held = None
        if codec.delta and base is not None and base.version == manifest.delta_base:
            # a rank's base holds whole rows only where it holds every column: not for dim-1 splits
            held = {
                name: (tensor, rows[name][0] if name in rows else 0)
                for name, tensor in base.state_dict.items()
                if name not in splits or name in rows
            }
        fallback: str | None = None
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                state, read = await asyncio.to_thread(
                    read_sharded,
                    engine,
                    manifest,
                    rows=rows or None,
                    base=held,
                    base_version=base.version if held else None,
                    timeout_s=self.timeout.total or READ_TIMEOUT_S,
                )
            except BaseMismatchError as exc:
                last_error, fallback, held = exc, str(exc), None
            except (OSError, WeightIntegrityError) as exc:
                last_error = exc
            else:
                for name, (dim, part) in splits.items():
                    if dim != 0:
                        state[name] = state[name].narrow(dim, part.start, part.stop - part.start).contiguous()
                weights = LoadedWeights(manifest.version, state, dict(manifest.files))
                source = ShardedSource(
                    manifest,
                    f"delta+{manifest.codec}" if read.delta_blocks else manifest.codec,
                    manifest.delta_base if read.delta_blocks else None,
                    # a tensor-parallel rank's weights are its slices, as with an HTTP pull's payload
                    sum(tensor.nbytes for tensor in state.values()) if splits else manifest.model_nbytes,
                    read.wire_nbytes,
                )
                stats = PullStats(
                    wire_nbytes=sum(read.wire_nbytes.values()),
                    chunks_downloaded=read.blocks,
                    chunks_reused=0,
                    attempts=attempt,
                    seconds=time.monotonic() - started,
                    fallback_reason=fallback,
                    transport="mooncake",
                )
                return PullResult(weights, source, stats)
            logger.warning("weight pull attempt %d/%d failed: %s", attempt, self.max_attempts, last_error)
            if attempt < self.max_attempts and not isinstance(last_error, BaseMismatchError):
                await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        raise WeightTransferError(
            f"reading weight version {manifest.version} from the trainer ranks failed after "
            f"{self.max_attempts} attempts: {last_error}"
        )

    async def _manifest(
        self, version: int | None, codec: CodecSpec, base: LoadedWeights | None, tp: tuple[int, int] | None
    ) -> Manifest:
        params = {"version": "latest" if version is None else str(version), "codec": codec.name}
        if codec.delta and base is not None:
            params["base"] = str(base.version)
        tp = tp if tp is not None and tp[0] > 1 else None
        if tp is not None:
            params |= {"tp_size": str(tp[0]), "tp_rank": str(tp[1])}
        manifest = Manifest.from_json(json.dumps(await self._get_json("/v1/manifest", params)))
        if not PAYLOAD_ID.match(manifest.payload_id):
            raise WeightIntegrityError(f"manifest names a bad payload id {manifest.payload_id!r}")
        if manifest.tp != tp:
            raise WeightIntegrityError(
                f"asked for the slices of tensor-parallel {tp}, the server sent {manifest.tp}"
            )
        return manifest

    async def _fetch_chunks(self, manifest: Manifest, counts: dict[str, int]) -> None:
        folder = self.cache_dir / manifest.payload_id
        folder.mkdir(parents=True, exist_ok=True)
        gate = asyncio.Semaphore(self.parallel_chunks)
        done = 0
        reader = await self._mooncake_reader(manifest) if self.transport == "mooncake" else None

        async def fetch(entry: ChunkEntry) -> None:
            nonlocal done
            async with gate:
                path = chunk_file(folder, entry.index)
                if await asyncio.to_thread(_holds_chunk, path, entry):
                    counts["chunks_reused"] += 1
                else:
                    await self._download(manifest, entry, path, reader)
                    counts["chunks_downloaded"] += 1
                    counts["wire_nbytes"] += entry.wire_nbytes
                done += 1
                if self.on_chunk is not None:
                    self.on_chunk(done, len(manifest.chunks))

        try:
            async with asyncio.TaskGroup() as group:
                for entry in manifest.chunks:
                    group.create_task(fetch(entry))
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        finally:
            if reader is not None:
                reader.close()

    async def _mooncake_reader(self, manifest: Manifest) -> ChunkReader | None:
        """A reader of the payload's chunks over Mooncake; None (and HTTP from now on) where there is none."""
        engine = await asyncio.to_thread(local_engine)
        if isinstance(engine, Unavailable):
            return self._use_http(engine.reason)
        url = f"{self.url}/v1/payloads/{manifest.payload_id}/mooncake"
        async with self._client().get(url) as resp:
            text = await resp.text()
            if resp.status == 409:
                return self._use_http(_reason(text))
            if resp.status != 200:
                raise _Retryable(f"the Mooncake location of {manifest.payload_id}: HTTP {resp.status}")
        location = PayloadLocation.from_json(json.loads(text))
        if len(location.chunks) != len(manifest.chunks):
            raise WeightIntegrityError(
                f"the server's Mooncake location lists {len(location.chunks)} chunks, its manifest "
                f"{len(manifest.chunks)}"
            )
        try:
            return await asyncio.to_thread(ChunkReader, engine, location)
        except OSError as exc:  # this process could not register a receive buffer
            return self._use_http(str(exc))

    def _use_http(self, reason: str) -> None:
        logger.warning("weights over mooncake unavailable, pulling over http: %s", reason)
        self.transport = "http"
        return None

    async def _download(
        self, manifest: Manifest, entry: ChunkEntry, path: Path, reader: ChunkReader | None
    ) -> None:
        if reader is None:
            data = await self._get_chunk(manifest, entry)
        else:
            try:
                data = await asyncio.to_thread(reader.read, entry.index)
            except OSError as exc:
                raise _Retryable(str(exc)) from None
        await asyncio.to_thread(verify_chunk, entry, data)
        partial = path.with_suffix(".part")
        partial.write_bytes(data)
        partial.rename(path)

    async def _get_chunk(self, manifest: Manifest, entry: ChunkEntry) -> bytes:
        url = f"{self.url}/v1/payloads/{manifest.payload_id}/chunks/{entry.index}"
        async with self._client().get(url) as resp:
            if resp.status != 200:
                raise _Retryable(f"chunk {entry.index} of {manifest.payload_id}: HTTP {resp.status}")
            return await resp.read()

    def _decode(self, manifest: Manifest, base: LoadedWeights | None) -> LoadedWeights:
        folder = self.cache_dir / manifest.payload_id
        base_state = base.state_dict if base is not None and manifest.base_version is not None else None
        if manifest.base_version is not None and (base is None or base.version != manifest.base_version):
            raise WeightIntegrityError(f"server sent a delta from version {manifest.base_version}, not ours")
        try:
            state = decode_payload(
                manifest, lambda entry: chunk_file(folder, entry.index).read_bytes(), base_state
            )
        except (WeightIntegrityError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)  # whatever is on disk is suspect now
            raise WeightIntegrityError(str(exc)) from None
        if manifest.lossless and state_digest(state) != manifest.state_digest:
            if manifest.base_version is not None:
                raise _BaseMismatchError(f"the base weights did not match version {manifest.base_version}")
            raise WeightIntegrityError(f"decoded version {manifest.version} fails its state digest")
        return LoadedWeights(manifest.version, state, dict(manifest.files))

    async def _get_json(self, path: str, params: dict[str, str]) -> dict:
        async with self._client().get(f"{self.url}{path}", params=params) as resp:
            text = await resp.text()
            if resp.status == 404:
                raise UnknownVersionError(_reason(text))
            if 400 <= resp.status < 500:
                raise WeightsError(f"weight server refused {path}: {_reason(text)}")
            if resp.status != 200:
                raise _Retryable(f"{path}: HTTP {resp.status}")
        return json.loads(text)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    def _clear_cache(self) -> None:
        """Drop partial pulls: after a complete one, none of them is worth resuming."""
        if self.cache_dir.is_dir():
            for folder in self.cache_dir.iterdir():
                if folder.is_dir() and PAYLOAD_ID.match(folder.name):
                    shutil.rmtree(folder, ignore_errors=True)


def _tp_splits(manifest: ShardedManifest, tp: tuple[int, int] | None) -> dict[str, tuple[int, slice]]:
    """name -> (dim, slice) of each tensor a tensor-parallel rank holds a part of (none for tp=None)."""
    if tp is None:
        return {}
    splits = {plan.name: rank_slices(plan.name, tuple(plan.shape), *tp) for plan in manifest.tensors}
    return {name: where for name, where in splits.items() if where is not None}


def save_weights(weights: LoadedWeights, out_dir: str | Path) -> Path:
    """Write a pulled version as a folder a model loader reads: model.safetensors, the published
    text files (config.json makes it a transformers checkpoint) and rollflow_weights.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "model.safetensors.part"
    safetensors.torch.save_file(as_cpu_contiguous(weights.state_dict), str(partial), {"format": "pt"})
    partial.rename(out / "model.safetensors")
    for name, text in weights.files.items():
        (out / name).write_text(text)
    (out / SAVED_VERSION_FILE).write_text(json.dumps({"version": weights.version}))
    return out


def _holds_chunk(path: Path, entry: ChunkEntry) -> bool:
    if not path.is_file() or path.stat().st_size != entry.wire_nbytes:
        return False
    return checksum(path.read_bytes()) == entry.checksum


def _reason(text: str) -> str:
    """The message of the weight server's error body (`{"error": {"message": ...}}`)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()
