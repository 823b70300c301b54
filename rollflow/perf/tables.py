"""Vidur-format GPU profile tables -> operator time grids, by interpolation.

Vidur fits a random forest per operator (about 25 minutes cold) and then evaluates it on a
dense grid. The tables are already dense along the axes the simulator queries, so rollflow
interpolates them directly: the same inputs, in well under a second.

Files (any path; `{DEVICE}`, `{MODEL}`, `{NETWORK_DEVICE}` are substituted):
- `mlp.csv`: per-layer token-parallel operators by `num_tokens` and tensor-parallel size.
- `attention.csv`: prefill by (`kv_cache_size`, `prefill_chunk_size`) and decode by
  (`batch_size`, `kv_cache_size`). Vidur's public data has none, so the attention path may be
  `roofline` (ATTENTION_FROM_ROOFLINE): attention then comes from the roofline model of the GPU,
  and the times' `source` says so.
- `all_reduce.csv`, `send_recv.csv`: collectives by message `size` in bytes.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollflow.errors import UserError
from rollflow.perf.optimes import OperatorTimes, PrefillGrid, interp_grid
from rollflow.perf.roofline import RooflineEfficiency, roofline_operator_times
from rollflow.perf.specs import GpuSpec, ModelSpec, NodeSpec, ParallelLayout

# The attention path that means "no table: take attention from the roofline model".
ATTENTION_FROM_ROOFLINE = "roofline"

# Operators of one layer whose time depends only on the number of tokens in the batch.
LINEAR_OPS = (
    "attn_pre_proj",
    "attn_post_proj",
    "attn_rope",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "input_layernorm",
    "add",
)


class ProfileTableError(UserError):
    """A table is missing, malformed, or has no rows for the configured model and sharding."""


@dataclass(frozen=True)
class TablePaths:
    compute: str
    attention: str
    all_reduce: str
    send_recv: str

    def resolve(self, model: str, device: str, network_device: str) -> TablePaths:
        def sub(path: str) -> str:
            return (
                path.replace("{DEVICE}", device)
                .replace("{MODEL}", model)
                .replace("{NETWORK_DEVICE}", network_device)
            )

        return TablePaths(sub(self.compute), sub(self.attention), sub(self.all_reduce), sub(self.send_recv))


@dataclass(frozen=True)
class CommOverheads:
    """CPU-side costs Vidur adds to each tensor-parallel all-reduce (ms)."""

    nccl_cpu_launch_ms: float = 0.02
    nccl_cpu_skew_per_device_ms: float = 0.0


class _Table:
    """A CSV table read column-wise: filters and columns are whole-array operations, not per-row
    dicts (the attention table has tens of thousands of rows)."""

    def __init__(self, path: str) -> None:
        file = Path(path)
        if not file.is_file():
            raise ProfileTableError(f"profile table not found: {path}")
        with file.open(newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            rows = list(reader)
        width = len(header)
        for number, row in enumerate(rows, start=2):
            if len(row) != width:
                raise ProfileTableError(
                    f"{path} is not a Vidur-format table: line {number} has {len(row)} fields, "
                    f"the header {width}"
                )
        self.path = path
        self._rows = rows
        self._index = {name: k for k, name in enumerate(header)}
        self._numbers: dict[str, np.ndarray] = {}
        self.selected = np.ones(len(rows), dtype=bool)  # the rows `where` kept

    def __len__(self) -> int:
        return int(np.count_nonzero(self.selected))

    def strings(self, name: str) -> list[str]:
        """Every row's value of column `name`, as written."""
        k = self._index.get(name)
        if k is None:
            raise ProfileTableError(f"{self.path} has no column {name!r}")
        return [row[k] for row in self._rows]

    def numbers(self, name: str) -> np.ndarray:
        """Every row's value of column `name` as a float (NaN where empty)."""
        values = self._numbers.get(name)
        if values is None:
            column = self.strings(name)
            if "" in column:
                column = [v if v != "" else "nan" for v in column]
            try:
                values = np.fromiter(map(float, column), float, len(column))
            except ValueError as exc:
                raise ProfileTableError(f"{self.path} is not a Vidur-format table: {exc}") from None
            self._numbers[name] = values
        return values

    def column(self, name: str) -> np.ndarray:
        """Column `name` of the selected rows, as floats."""
        return self.numbers(name)[self.selected]

    def has_column(self, name: str) -> bool:
        return name in self._index

    def where(self, mask: np.ndarray) -> _Table:
        """Keep the rows `mask` selects (later columns are of those rows only)."""
        self.selected = mask
        return self


def _read_rows(path: str, where: Callable[[_Table], np.ndarray]) -> _Table:
    """The rows of `path` that `where` (a mask over the whole table) selects."""
    table = _Table(path)
    return table.where(np.asarray(where(table), dtype=bool))


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique without its import of numpy.ma, 30 ms of start-up)."""
    return np.array(sorted(set(values.tolist())), dtype=float)


def _truthy(values: list[str]) -> np.ndarray:
    return np.array([value.strip().lower() in {"true", "1"} for value in values], dtype=bool)


def load_operator_times(
    paths: TablePaths,
    model: ModelSpec,
    layout: ParallelLayout,
    node: NodeSpec,
    block_size: int,
    max_tokens: int,
    max_batch_size: int,
    kv_granularity: int = 64,
    overheads: CommOverheads = CommOverheads(),
    gpu: GpuSpec | None = None,
    efficiency: RooflineEfficiency | None = None,
) -> OperatorTimes:
    """Build the grids for one replica shape from Vidur-format tables.

    `gpu` and `efficiency` are used only when `paths.attention` is ATTENTION_FROM_ROOFLINE.
    """
    tp = layout.tensor_parallel
    size = max_tokens + 9  # token counts are rounded up to a multiple of 8

    def same_model(table: _Table) -> np.ndarray:
        return (
            (table.numbers("n_head") == model.num_q_heads)
            & (table.numbers("n_kv_head") == model.num_kv_heads)
            & (table.numbers("n_embd") == model.embedding_dim)
            & (table.numbers("n_expanded_embd") == model.mlp_hidden_dim)
            & (_truthy(table.strings("use_gated_mlp")) == model.use_gated_mlp)
            & (table.numbers("vocab_size") == model.vocab_size)
            & (np.trunc(table.numbers("num_tensor_parallel_workers")) == tp)
        )

    mlp_rows = _read_rows(paths.compute, same_model)
    if not len(mlp_rows):
        raise ProfileTableError(f"{paths.compute} has no rows for {model.name} at tensor_parallel={tp}")
    tokens = mlp_rows.column("num_tokens")
    ops = [*LINEAR_OPS, "post_attention_layernorm"] if model.post_attn_norm else list(LINEAR_OPS)
    linear = np.zeros(size)
    for op in ops:
        values = np.nan_to_num(mlp_rows.column(f"time_stats.{op}.median"))
        linear += interp_grid(tokens, values, size)

    if tp > 1:
        linear += 2 * _all_reduce_ms(paths.all_reduce, model, tp, size, overheads)

    if paths.attention == ATTENTION_FROM_ROOFLINE:
        if gpu is None:
            raise ValueError("attention from the roofline needs the GPU spec")
        roofline = roofline_operator_times(
            model,
            gpu,
            layout,
            node,
            max_tokens,
            max_batch_size,
            kv_granularity,
            efficiency or RooflineEfficiency(),
        )
        attention = (roofline.kv_save_ms, roofline.decode_ms, roofline.prefill)
        attention_source = f"attention from the roofline on {gpu.name} (no attention table)"
    else:
        attention = _attention_times(
            paths.attention, model, tp, block_size, size, max_batch_size, kv_granularity
        )
        attention_source = paths.attention
    send_recv = (
        _send_recv_ms(paths.send_recv, model, layout, node, size)
        if layout.pipeline_stages > 1
        else np.zeros(size)
    )
    return OperatorTimes(
        linear_ms=linear,
        kv_save_ms=attention[0],
        send_recv_ms=send_recv,
        decode_ms=attention[1],
        prefill=attention[2],
        kv_granularity=kv_granularity,
        source=f"tables: {paths.compute}, {attention_source}",
    )


def _all_reduce_ms(path: str, model: ModelSpec, tp: int, size: int, overheads: CommOverheads) -> np.ndarray:
    rows = _read_rows(
        path,
        lambda t: (
            (t.numbers("num_workers") == tp)
            & (t.numbers("devices_per_node") == tp)
            & (np.array(t.strings("collective")) == "all_reduce")
        ),
    )
    if not len(rows):
        raise ProfileTableError(f"{path} has no all_reduce rows for {tp} workers on one node")
    tokens = rows.column("size") / model.embedding_dim / 2
    grid = interp_grid(tokens, rows.column("time_stats.all_reduce.median"), size)
    return grid + overheads.nccl_cpu_launch_ms + overheads.nccl_cpu_skew_per_device_ms * tp**1.25


def _send_recv_ms(
    path: str, model: ModelSpec, layout: ParallelLayout, node: NodeSpec, size: int
) -> np.ndarray:
    # A hop between stages crosses machines once the replica outgrows one node.
    devices_per_node = 1 if layout.world_size > node.num_devices_per_node else 2
    rows = _read_rows(
        path,
        lambda t: (
            (np.array(t.strings("collective")) == "send_recv")
            & (t.numbers("devices_per_node") == devices_per_node)
        ),
    )
    if not len(rows):
        raise ProfileTableError(f"{path} has no send_recv rows with devices_per_node={devices_per_node}")
    tokens = rows.column("size") / model.embedding_dim / 2
    return interp_grid(tokens, rows.column("time_stats.send_recv.median"), size)


def _attention_times(
    path: str,
    model: ModelSpec,
    tp: int,
    block_size: int,
    size: int,
    max_batch_size: int,
    kv_granularity: int,
) -> tuple[np.ndarray, np.ndarray, PrefillGrid]:
    rows = _read_rows(
        path,
        lambda t: (
            (t.numbers("n_embd") == model.embedding_dim)
            & (t.numbers("n_q_head") == model.num_q_heads)
            & (t.numbers("n_kv_head") == model.num_kv_heads)
            & (t.numbers("block_size") == block_size)
            & (np.trunc(t.numbers("num_tensor_parallel_workers")) == tp)
        ),
    )
    if not len(rows):
        raise ProfileTableError(
            f"{path} has no rows for {model.name} at tensor_parallel={tp}, block_size={block_size}"
        )
    chunk = rows.column("prefill_chunk_size")
    batch = rows.column("batch_size")
    kv = rows.column("kv_cache_size")
    is_decode = chunk == 0

    if rows.has_column("time_stats.attn_kv_cache_save.median"):
        num_tokens = np.maximum(chunk, batch)
        save = np.nan_to_num(rows.column("time_stats.attn_kv_cache_save.median"))
        kv_save = interp_grid(num_tokens, save, size)
    else:
        kv_save = np.zeros(size)

    decode_time = rows.column("time_stats.attn_decode.median")
    num_buckets = (size - 1) // kv_granularity + 2
    kv_axis = np.arange(num_buckets) * kv_granularity
    decode = np.zeros((max_batch_size + 1, num_buckets))
    sampled_batches = _distinct(batch[is_decode])
    if len(sampled_batches) == 0:
        raise ProfileTableError(f"{path} has no decode rows (prefill_chunk_size == 0)")
    per_batch = []
    for b in sampled_batches:
        mask = is_decode & (batch == b)
        per_batch.append(interp_grid(kv[mask], decode_time[mask], int(kv_axis[-1]) + 1)[kv_axis])
    per_batch_arr = np.array(per_batch)
    batch_axis = np.arange(1, max_batch_size + 1)
    for k in range(num_buckets):
        decode[1:, k] = np.interp(batch_axis, sampled_batches, per_batch_arr[:, k])
    decode[0] = decode[1]

    prefill_time = rows.column("time_stats.attn_prefill.median")
    sizes = _distinct(chunk[~is_decode])
    if len(sizes) == 0:
        raise ProfileTableError(f"{path} has no prefill rows (prefill_chunk_size > 0)")
    kv_points, times = [], []
    for c in sizes:
        mask = ~is_decode & (chunk == c)
        order = np.argsort(kv[mask], kind="stable")
        kv_points.append(kv[mask][order])
        times.append(prefill_time[mask][order])
    return kv_save, decode, PrefillGrid(sizes, tuple(kv_points), tuple(times))
