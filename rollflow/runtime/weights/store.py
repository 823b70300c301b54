"""A versioned weight store on disk: the trainer publishes, engines pull what they lack.

    root/versions/v00000007/model.safetensors   the exact tensors (bases for deltas)
                            version.json        digest, size, small text files
    root/payloads/v7-int8-zstd/manifest.json    one encoded payload per (version, codec, base)
                               000000.chunk ...
    root/sharded/v00000009.json   a version the trainer ranks hold themselves (shards.py): only
                                  its manifest is here, engines read its bytes from the ranks
    root/payloads/v7-zstd-tp2r1/...             the slices rank 1 of a 2-rank tensor-parallel
                                                engine holds (slices.py), built on first request

Versions and payloads appear by renaming a finished folder into place, so a server in another
process (or a crash half-way) never sees a partial one; the folder listing is the index, so a
server sees what a trainer process publishes without being told. Payloads are built on first
request and kept until their version is pruned.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import safetensors.torch
import torch

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import UnknownVersionError, WeightsError
from rollflow.runtime.weights.io import Manifest, VersionList
from rollflow.runtime.weights.payload import chunk_file, encode_payload
from rollflow.runtime.weights.shards import ShardedManifest
from rollflow.runtime.weights.slices import shard_state
from rollflow.runtime.weights.tensors import StateDict, as_cpu_contiguous, state_digest

logger = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^v(\d{8})$")
_SHARDED_FILE = re.compile(r"^v(\d{8})\.json$")
MAX_VERSION = 10**8 - 1
"""Versions are stored as v%08d folders: a larger one could be written but never listed or served."""
PAYLOAD_ID = re.compile(r"^v(\d+)-([a-z0-9-]+?)(?:-from(\d+))?(?:-tp(\d+)r(\d+))?$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_FILES_BYTES = 1 << 20


class WeightStore:
    """Versions of a model's weights, and their encoded payloads, under one folder."""

    def __init__(
        self,
        root: str | Path,
        *,
        keep_versions: int = 4,
        chunk_bytes: int = 4 << 20,
        zstd_level: int = 3,
        delta_block_bytes: int = 64 << 10,
        default_codec: CodecSpec | str = "zstd",
    ) -> None:
        """`keep_versions` newest versions stay (older ones and their payloads are pruned), so
        an engine up to that many versions behind still gets a delta."""
        if keep_versions < 1:
            raise WeightsError(f"keep_versions must be at least 1 (got {keep_versions})")
        if chunk_bytes < 1024 or delta_block_bytes < 8 or delta_block_bytes % 8:
            raise WeightsError("chunk_bytes must be >= 1024 and delta_block_bytes a positive multiple of 8")
        self.root = Path(root)
        self.keep_versions = keep_versions
        self.chunk_bytes = chunk_bytes
        self.zstd_level = zstd_level
        self.delta_block_bytes = delta_block_bytes
        self.default_codec = _as_codec(default_codec)
        for sub in ("versions", "payloads", "sharded", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}

    def versions(self) -> VersionList:
        found = (_VERSION_DIR.match(p.name) for p in (self.root / "versions").iterdir())
        return VersionList(tuple(sorted(int(m.group(1)) for m in found if m)))

    def sharded_versions(self) -> VersionList:
        """Versions held by trainer ranks, whose manifests (not bytes) are here."""
        found = (_SHARDED_FILE.match(p.name) for p in (self.root / "sharded").iterdir())
        return VersionList(tuple(sorted(int(m.group(1)) for m in found if m)))

    def publish_sharded(self, manifest: ShardedManifest) -> None:
        """Keep the manifest of a version the trainer ranks hold (replacing one of the same
        version: a resumed trainer exports it again, at new addresses); the newest
        `keep_versions` stay."""
        if not 0 <= manifest.version <= MAX_VERSION:
            raise WeightsError(f"cannot publish version {manifest.version}: outside 0..{MAX_VERSION}")
        staging = self._staging()
        (staging / "manifest.json").write_text(manifest.to_json())
        (staging / "manifest.json").replace(self._sharded_file(manifest.version))
        staging.rmdir()
        for version in self.sharded_versions().versions[: -self.keep_versions]:
            self._sharded_file(version).unlink(missing_ok=True)
        logger.info(
            "published sharded weight version %d (%d tensors)", manifest.version, len(manifest.tensors)
        )

    def sharded(self, version: int | None = None) -> ShardedManifest:
        """The manifest of a version the trainer ranks hold (None: the newest)."""
        held = self.sharded_versions()
        version = held.latest if version is None else version
        if version is None or version not in held.versions:
            raise UnknownVersionError(
                f"no trainer ranks hold weight version {version} (sharded versions: {list(held.versions)})"
            )
        return ShardedManifest.from_json(self._sharded_file(version).read_bytes())

    def publish(
        self, version: int, state_dict: StateDict, *, files: Mapping[str, str] | None = None
    ) -> Manifest:
        """Store `state_dict` as `version` (greater than every version held) and return the
        manifest of its full payload in the default codec, built now so the first engine that
        asks does not wait. `files` are small text files (config.json, ...) pullers get too."""
        files = dict(files or {})
        _check_files(files)
        with self._lock:
            latest = self.versions().latest
            if not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
                raise WeightsError(
                    f"cannot publish version {version!r}: versions are integers that increase, within 0..{MAX_VERSION}"
                )
            if latest is not None and version <= latest:
                raise WeightsError(
                    f"cannot publish version {version!r}: versions are integers that increase "
                    f"(latest held: {latest})"
                )
            state = as_cpu_contiguous(state_dict)
            staging = self._staging()
            safetensors.torch.save_file(state, str(staging / "model.safetensors"))
            info = {
                "version": version,
                "state_digest": state_digest(state),
                "model_nbytes": sum(t.numel() * t.element_size() for t in state.values()),
                "files": files,
            }
            (staging / "version.json").write_text(json.dumps(info))
            staging.rename(self._version_dir(version))
        logger.info("published weight version %d (%d tensors)", version, len(state))
        manifest = self._build(version, self.default_codec, None, state, None, None)
        self._prune()
        return manifest

    def manifest(
        self,
        version: int | None = None,
        codec: CodecSpec | str = "zstd",
        base_version: int | None = None,
        tp: tuple[int, int] | None = None,
    ) -> Manifest:
        """The manifest of `version` (None: the latest) in `codec`, building the payload if needed.

        With a delta codec, the payload holds only what changed since `base_version`; when the
        store lacks that base (never held, or pruned) the answer is the full payload, with
        `fallback_reason` saying why, so a puller always gets something it can load. With `tp`
        (tp_size, rank), the payload holds only that rank's slices (slices.py), of the version and
        of the base alike.
        """
        codec = _as_codec(codec)
        tp = _check_tp(tp)
        held = self.versions()
        if version is None:
            version = held.latest
            if version is None:
                raise UnknownVersionError("the weight store holds no version yet")
        if version not in held.versions:
            raise UnknownVersionError(
                f"weight version {version} is not in the store (holds {list(held.versions)})"
            )
        if not codec.delta:
            return self._build(version, codec, None, None, None, tp)
        if base_version is None:
            reason = "no base version was named"
        elif base_version not in held.versions:
            reason = f"base version {base_version} is not in the store (holds {list(held.versions)})"
        else:
            return self._build(version, codec, base_version, None, None, tp)
        full = self._build(version, codec.without_delta(), None, None, None, tp)
        return dataclasses.replace(full, fallback_reason=reason)

    def chunk_path(self, payload_id: str, index: int) -> Path:
        """Path of a built payload's chunk; UnknownVersionError if it is not (or no longer) there."""
        if not PAYLOAD_ID.match(payload_id):
            raise UnknownVersionError(f"no payload named {payload_id!r}")
        path = chunk_file(self.root / "payloads" / payload_id, index)
        if index < 0 or not path.is_file():
            raise UnknownVersionError(f"payload {payload_id} has no chunk {index}")
        return path

    def chunk_paths(self, payload_id: str) -> list[Path]:
        """Every chunk of a built payload, in order; UnknownVersionError if it is not (or no longer) there."""
        paths = [self.chunk_path(payload_id, 0)]
        while (path := chunk_file(paths[0].parent, len(paths))).is_file():
            paths.append(path)
        return paths

    def load(self, version: int) -> dict[str, torch.Tensor]:
        """The exact tensors of a held version."""
        path = self._version_dir(version) / "model.safetensors"
        if not path.is_file():
            raise UnknownVersionError(f"weight version {version} is not in the store")
        return safetensors.torch.load_file(str(path))

    def _build(
        self,
        version: int,
        codec: CodecSpec,
        base_version: int | None,
        state: StateDict | None,
        base: StateDict | None,
        tp: tuple[int, int] | None,
    ) -> Manifest:
        payload_id = f"v{version}-{codec.name.replace('+', '-')}" + (
            f"-from{base_version}" if base_version is not None else ""
        )
        payload_id += f"-tp{tp[0]}r{tp[1]}" if tp is not None else ""
        final = self.root / "payloads" / payload_id
        with self._lock:
            build_lock = self._build_locks.setdefault(payload_id, threading.Lock())
        with build_lock:
            if (final / "manifest.json").is_file():
                return Manifest.from_json((final / "manifest.json").read_bytes())
            info = json.loads((self._version_dir(version) / "version.json").read_text())
            state = state if state is not None else self.load(version)
            if base_version is not None and base is None:
                base = self.load(base_version)
            if tp is not None:
                try:
                    state = shard_state(state, *tp)
                    base = shard_state(base, *tp) if base is not None else None
                except ValueError as exc:
                    raise WeightsError(
                        f"cannot split version {version} for tensor parallelism: {exc}"
                    ) from None
                info |= {
                    "state_digest": state_digest(state),
                    "model_nbytes": sum(t.numel() * t.element_size() for t in state.values()),
                }
            staging = self._staging()
            encoded = encode_payload(
                state,
                codec,
                base,
                staging,
                chunk_bytes=self.chunk_bytes,
                zstd_level=self.zstd_level,
                block_bytes=self.delta_block_bytes,
            )
            manifest = Manifest(
                payload_id=payload_id,
                version=version,
                codec=codec.name,
                base_version=base_version,
                fallback_reason=None,
                state_digest=info["state_digest"],
                lossless=codec.lossless,
                model_nbytes=info["model_nbytes"],
                payload_digest=encoded.payload_digest,
                tensors=encoded.tensors,
                chunks=encoded.chunks,
                files=info["files"],
                tp=tp,
            )
            (staging / "manifest.json").write_text(manifest.to_json())
            try:
                staging.rename(final)
            except OSError:  # another process built the same payload first; theirs is as good
                shutil.rmtree(staging, ignore_errors=True)
                return Manifest.from_json((final / "manifest.json").read_bytes())
        logger.info(
            "built payload %s: %d -> %d bytes", payload_id, manifest.model_nbytes, manifest.wire_nbytes
        )
        return manifest

    def _prune(self) -> None:
        held = self.versions().versions
        dropped = set(held[: -self.keep_versions])
        if not dropped:
            return
        for payload in (self.root / "payloads").iterdir():
            match = PAYLOAD_ID.match(payload.name)
            if match and {int(match.group(1)), int(match.group(3) or -1)} & dropped:
                shutil.rmtree(payload, ignore_errors=True)
        for version in dropped:
            shutil.rmtree(self._version_dir(version), ignore_errors=True)
        logger.info("pruned weight versions %s", sorted(dropped))

    def _sharded_file(self, version: int) -> Path:
        return self.root / "sharded" / f"v{version:08d}.json"

    def _version_dir(self, version: int) -> Path:
        return self.root / "versions" / f"v{version:08d}"

    def _staging(self) -> Path:
        path = self.root / "tmp" / uuid.uuid4().hex
        path.mkdir()
        return path


def _check_tp(tp: tuple[int, int] | None) -> tuple[int, int] | None:
    """`tp` as (tp_size, rank) of a split payload, None for whole tensors (tp_size 1 is whole too)."""
    if tp is None:
        return None
    tp_size, rank = tp
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise WeightsError(
            f"tp_rank must be in 0..tp_size-1 with tp_size >= 1 (got tp_size {tp_size}, rank {rank})"
        )
    return None if tp_size == 1 else (tp_size, rank)


def _as_codec(codec: CodecSpec | str) -> CodecSpec:
    return codec if isinstance(codec, CodecSpec) else CodecSpec.parse(codec)


def _check_files(files: Mapping[str, str]) -> None:
    for name, text in files.items():
        if not _FILE_NAME.match(name) or name == "model.safetensors" or not isinstance(text, str):
            raise WeightsError(f"published file {name!r} needs a plain file name and text content")
    if sum(len(text.encode()) for text in files.values()) > MAX_FILES_BYTES:
        raise WeightsError(f"published files exceed {MAX_FILES_BYTES} bytes; they are for small configs")
