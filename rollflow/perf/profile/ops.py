"""`rollflow profile ops`: time a model's operators over a grid and write Vidur-format tables.

Every measurement is appended to the progress file (`progress.py`) as soon as it is taken, under a
header that records what is being profiled (model shape, device, dtype, grid, timing settings), so
an interrupted profile resumes. The CSVs are written from the progress file once every point is
measured.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollflow.perf.profile.grid import GridName, ProfileGrid, build_grid
from rollflow.perf.profile.hf_config import ProfiledModel, check_tensor_parallel
from rollflow.perf.profile.operators import ATTENTION_OPS, MLP_OPS, LayerShard
from rollflow.perf.profile.progress import ProgressLog
from rollflow.perf.profile.timing import STATS, time_call


@dataclass(frozen=True)
class ProfileSettings:
    device: str  # "cpu" or "cuda"
    dtype: str  # torch dtype name: float32, float16, bfloat16
    tensor_parallel: tuple[int, ...]  # shard counts to profile, each as its sharded shapes
    grid: GridName
    block_size: int  # KV-cache block size written into attention.csv (the simulator matches on it)
    max_model_len: int  # longest context profiled (prefix + chunk, KV length)
    max_batch_size: int
    max_kv_tokens: int  # cap on batch_size x kv_len for decode points (memory)
    warmup: int
    repeats: int


@dataclass(frozen=True)
class ProfileResult:
    out_dir: Path
    num_points: int  # measurements in the grid, all tensor-parallel sizes together
    num_resumed: int  # of which were already in the progress file
    measured_s: float  # time spent measuring in this run


Point = tuple[
    Any, ...
]  # ("mlp", tp, num_tokens) | ("decode", tp, batch, kv) | ("prefill", tp, chunk, prefix)


def profile_ops(
    model: ProfiledModel,
    settings: ProfileSettings,
    out_dir: str | Path,
    on_point: Callable[[int, int], None] = lambda done, total: None,
) -> ProfileResult:
    """Measure every grid point not yet in the progress file, then write mlp.csv and attention.csv."""
    for tp in settings.tensor_parallel:
        check_tensor_parallel(model, tp)
    grid = build_grid(settings.grid, settings.max_model_len, settings.max_batch_size, settings.max_kv_tokens)
    points = [p for tp in settings.tensor_parallel for p in _points(grid, tp)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    progress = ProgressLog(out, {"model": asdict(model), "settings": asdict(settings)})
    resumed = sum(1 for p in points if p in progress)
    started = time.perf_counter()
    on_point(resumed, len(points))
    import torch

    dtype = getattr(torch, settings.dtype)
    with progress, torch.inference_mode():
        shards: dict[int, LayerShard] = {}
        count = resumed
        for point in points:
            if point in progress:
                continue
            tp = point[1]
            if tp not in shards:
                shards = {tp: LayerShard(model, tp, settings.device, dtype)}
            progress.record(point, _measure(shards[tp], point, settings))
            count += 1
            on_point(count, len(points))
    measured_s = time.perf_counter() - started
    _write_tables(out, model, settings, points, progress)
    return ProfileResult(out, len(points), resumed, measured_s)


def _points(grid: ProfileGrid, tp: int) -> Iterator[Point]:
    for n in grid.num_tokens:
        yield ("mlp", tp, n)
    for b, s in grid.decode:
        yield ("decode", tp, b, s)
    for c, p in grid.prefill:
        yield ("prefill", tp, c, p)


def _measure(shard: LayerShard, point: Point, settings: ProfileSettings) -> dict[str, dict[str, float]]:
    def timed(fn: Callable[[], object]) -> dict[str, float]:
        return time_call(fn, settings.device, settings.warmup, settings.repeats)

    kind = point[0]
    if kind == "mlp":
        return {op: timed(call) for op, call in shard.mlp_calls(point[2]).items()}
    if kind == "decode":
        _, _, batch, kv = point
        return {
            "attn_decode": timed(shard.decode_call(batch, kv)),
            "attn_kv_cache_save": timed(shard.kv_save_call(batch, settings.block_size)),
        }
    _, _, chunk, prefix = point
    return {
        "attn_prefill": timed(shard.prefill_call(chunk, prefix)),
        "attn_kv_cache_save": timed(shard.kv_save_call(chunk, settings.block_size)),
    }


def _stat_columns(ops: tuple[str, ...]) -> list[str]:
    return [f"time_stats.{op}.{stat}" for op in ops for stat in STATS]


def _stat_values(stats: dict[str, dict[str, float]], ops: tuple[str, ...]) -> list[Any]:
    return [stats[op][stat] if op in stats else "" for op in ops for stat in STATS]


def _write_tables(
    out: Path, model: ProfiledModel, settings: ProfileSettings, points: list[Point], done: ProgressLog
) -> None:
    mlp_columns = [
        *_stat_columns(MLP_OPS),
        "n_head",
        "n_kv_head",
        "n_embd",
        "n_expanded_embd",
        "vocab_size",
        "use_gated_mlp",
        "num_tokens",
        "num_tensor_parallel_workers",
    ]
    attention_columns = [
        *_stat_columns(ATTENTION_OPS),
        "n_embd",
        "n_q_head",
        "n_kv_head",
        "block_size",
        "num_tensor_parallel_workers",
        "max_model_len",
        "batch_size",
        "prefill_chunk_size",
        "kv_cache_size",
        "is_prefill",
        "attention_backend",
    ]
    with (
        (out / "mlp.csv").open("w", newline="") as mlp_file,
        (out / "attention.csv").open("w", newline="") as attention_file,
    ):
        mlp, attention = csv.writer(mlp_file), csv.writer(attention_file)
        mlp.writerow(mlp_columns)
        attention.writerow(attention_columns)
        for point in points:
            stats = done[point]
            kind, tp = point[0], point[1]
            if kind == "mlp":
                mlp.writerow(
                    [
                        *_stat_values(stats, MLP_OPS),
                        model.num_q_heads,
                        model.num_kv_heads,
                        model.embedding_dim,
                        model.mlp_hidden_dim,
                        model.vocab_size,
                        True,
                        point[2],
                        tp,
                    ]
                )
                continue
            batch, chunk, kv = (point[2], 0, point[3]) if kind == "decode" else (1, point[2], point[3])
            attention.writerow(
                [
                    *_stat_values(stats, ATTENTION_OPS),
                    model.embedding_dim,
                    model.num_q_heads,
                    model.num_kv_heads,
                    settings.block_size,
                    tp,
                    settings.max_model_len,
                    batch,
                    chunk,
                    kv,
                    kind == "prefill",
                    "torch_sdpa",
                ]
            )
