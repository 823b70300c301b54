"""Operator grids built from profile tables, kept on disk between runs.

Parsing a replica shape's tables (the attention table alone has tens of thousands of rows) is
most of a sim command's start-up. A later run with the same tables (same paths, sizes and
modification times) and the same arguments loads the grids from an .npz instead, bit for bit
what the tables gave, as Vidur keeps its trained predictors in its cache folder.

ROLLFLOW_CACHE_DIR names the folder (default `$XDG_CACHE_HOME/rollflow` or `~/.cache/rollflow`);
an empty value turns the cache off. It keeps the last MAX_ENTRIES grids written. A cache that
cannot be read or written is skipped, with a logged note: it never fails a run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rollflow.perf.optimes import OperatorTimes, PrefillGrid

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "ROLLFLOW_CACHE_DIR"
FORMAT = 1  # bump when OperatorTimes or the way tables become grids changes
MAX_ENTRIES = 64  # beyond this, a write removes the least recently written entries


def cache_dir() -> Path | None:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rollflow"


def cached_operator_times(
    files: Sequence[str], arguments: object, build: Callable[[], OperatorTimes]
) -> OperatorTimes:
    """`build()`'s grids, from the cache when `files` (as they are now) and `arguments` (by repr)
    were seen before."""
    folder = cache_dir()
    if folder is None:
        return build()
    path = folder / "grids" / f"{_key(files, arguments)}.npz"
    if path.is_file():
        try:
            return _load(path)
        except (OSError, ValueError, KeyError) as exc:
            logger.info("ignoring unreadable grid cache %s: %s", path, exc)
    times = build()
    try:
        _save(path, times)
    except OSError as exc:
        logger.info("grid cache not written (%s): %s", path, exc)
    return times


def _key(files: Sequence[str], arguments: object) -> str:
    stamps = []
    for name in files:
        try:
            stat = os.stat(name)
            stamps.append((os.path.abspath(name), stat.st_size, stat.st_mtime_ns))
        except OSError:
            stamps.append((os.path.abspath(name), None, None))
    return hashlib.sha256(repr((FORMAT, stamps, arguments)).encode()).hexdigest()[:32]


def _save(path: Path, times: OperatorTimes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    prefill = times.prefill
    arrays = {
        "linear_ms": times.linear_ms,
        "kv_save_ms": times.kv_save_ms,
        "send_recv_ms": times.send_recv_ms,
        "decode_ms": times.decode_ms,
        "chunk_sizes": prefill.chunk_sizes,
        "kv_granularity": np.array(times.kv_granularity),
        "source": np.array(times.source),
    }
    for i, (points, values) in enumerate(zip(prefill.kv_points, prefill.times_ms, strict=True)):
        arrays[f"kv_points_{i}"] = points
        arrays[f"prefill_ms_{i}"] = values
    # Written aside and renamed: a concurrent run reads a whole file or none.
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as handle:
        np.savez(handle, **arrays)
    os.replace(handle.name, path)
    entries = sorted(path.parent.glob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
    for stale in entries[:-MAX_ENTRIES]:
        stale.unlink(missing_ok=True)


def _load(path: Path) -> OperatorTimes:
    with np.load(path, allow_pickle=False) as data:
        count = len(data["chunk_sizes"])
        prefill = PrefillGrid(
            data["chunk_sizes"],
            tuple(data[f"kv_points_{i}"] for i in range(count)),
            tuple(data[f"prefill_ms_{i}"] for i in range(count)),
        )
        return OperatorTimes(
            linear_ms=data["linear_ms"],
            kv_save_ms=data["kv_save_ms"],
            send_recv_ms=data["send_recv_ms"],
            decode_ms=data["decode_ms"],
            prefill=prefill,
            kv_granularity=int(data["kv_granularity"]),
            source=str(data["source"]),
        )
