"""Writes a simulation's output folder and prints its summary table.

DIR/summary.json       latency percentiles, throughput, per-replica utilization
DIR/requests.csv       one row per completed request
DIR/chrome_trace.json  one slice per batch (a decode run is one slice), opens in Perfetto
DIR/plots/*.png        latency CDFs; queue depth and KV use over time
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson

from rollflow.native import extension
from rollflow.sim.metrics import LATENCY_METRICS, RequestTable
from rollflow.sim.simulator import SimResult

REQUEST_COLUMNS = (
    "id",
    "replica",
    "arrived_at",
    "scheduled_at",
    "first_token_at",
    "completed_at",
    "prompt_tokens",
    "output_tokens",
    "preemptions",
    "ttft",
    "tpot",
    "e2e",
    "scheduling_delay",
)


def write_summary(out_dir: Path, summary: dict) -> Path:
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def write_outputs(
    out_dir: Path,
    table: RequestTable,
    result: SimResult,
    *,
    requests_csv: bool = True,
    chrome_trace: bool = True,
    plots: bool = True,
) -> list[Path]:
    """Everything but summary.json, which is written last so that it can carry the wall time."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if requests_csv:
        written.append(_write_requests(out_dir / "requests.csv", table))
    if chrome_trace:
        written.append(_write_chrome_trace(out_dir / "chrome_trace.json", result))
    if plots:
        from rollflow.sim.plots import plot_latency_cdfs, plot_replica_timelines

        plot_dir = out_dir / "plots"
        plot_dir.mkdir(exist_ok=True)
        written.append(plot_latency_cdfs(plot_dir / "latency_cdf.png", table))
        written.append(plot_replica_timelines(plot_dir / "queue_and_kv.png", result))
    return written


def _write_requests(path: Path, table: RequestTable) -> Path:
    """Every value as Python's `repr` writes it (exact floats); no csv quoting, since every column
    is a number."""
    columns = [number_texts(table.columns[name]) for name in REQUEST_COLUMNS]
    if columns[0]:
        columns[-1] = [text + "\n" for text in columns[-1]]
    with path.open("w") as handle:
        handle.write(",".join(REQUEST_COLUMNS) + "\n")
        handle.writelines(map(",".join, zip(*columns, strict=True)))
    return path


def number_texts(values: np.ndarray) -> list[str]:
    """`list(map(repr, values.tolist()))`, a twentieth of the time.

    orjson writes a float as the same shortest digits that round-trip as `repr` does (both pick
    the closest to the exact value), in the same text for 1e-4 <= |x| < 1e16 and 0; below that it
    writes 1.5e-5 as 0.000015 and NaN or inf as null, so those few values are written by `repr`.
    tests/sim/test_report.py checks the two agree over every range.
    """
    if not len(values):
        return []
    values = np.ascontiguousarray(values)
    texts = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")
    if values.dtype.kind == "f":
        magnitude = np.abs(values)
        odd = ~np.isfinite(values) | ((magnitude < 1e-4) & (values != 0)) | (magnitude >= 1e16)
        for i in np.flatnonzero(odd).tolist():
            texts[i] = repr(float(values[i]))
    return texts


def _write_chrome_trace(path: Path, result: SimResult) -> Path:
    """Streamed per replica: runs have hundreds of thousands of batches. Timestamps are
    microseconds to the nanosecond. The events' text comes from C (`rollflow.sim._trace`) where
    it is built, else from `_replica_events`, the reference, which gives the same bytes."""
    compiled = extension("rollflow.sim._trace")
    replica_events = compiled.replica_events if compiled is not None else _replica_events
    with path.open("w") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for replica in result.replicas:
            pid = replica.id
            out.write(
                f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "replica {pid}"}}}}'
            )
            out.write(replica_events(pid, replica.stats.batches, replica.stats.kv_samples))
            out.write(",\n")
        out.write('{"name": "trace_end", "ph": "i", "pid": 0, "ts": 0, "s": "g"}\n]}\n')
    return path


def _replica_events(pid: int, batches: list[tuple], kv_samples: list[tuple]) -> str:
    """A replica's batch slices and load counters, each after ",\n", %-formatted from one template."""
    batch = (
        ',\n{"name": "%s", "ph": "X", "pid": ' + str(pid) + ', "tid": 0, "ts": %.3f, "dur": %.3f, '
        '"args": {"batch_size": %d, "tokens_per_iteration": %d, "prefill_tokens": %d, "iterations": %d}}'
    )
    load = (
        ',\n{"name": "load", "ph": "C", "pid": ' + str(pid) + ', "ts": %.3f, '
        '"args": {"kv_use_pct": %.2f, "waiting": %d, "resident": %d}}'
    )
    return "".join(
        [
            batch % (_batch_name(tokens, prefill, iterations), start * 1e6, duration * 1e6, size, tokens,
                     prefill, iterations)
            for start, duration, size, tokens, prefill, iterations in batches
        ]
        + [
            load % (time * 1e6, 100 * kv_use, waiting, resident)
            for time, kv_use, waiting, resident in kv_samples
        ]
    )  # fmt: skip


def _batch_name(tokens: int, prefill_tokens: int, iterations: int) -> str:
    kind = "prefill" if prefill_tokens == tokens else "decode" if prefill_tokens == 0 else "mixed"
    return f"{kind} x{iterations}" if iterations > 1 else kind


def print_summary(summary: dict) -> None:
    """The latency and replica tables and a few totals, on stdout."""
    keys = [key for key in summary[LATENCY_METRICS[0]] if key != "mean"]
    latency_rows = [
        [name, *(f"{summary[name][key]:.4f}" for key in keys), f"{summary[name]['mean']:.4f}"]
        for name in LATENCY_METRICS
    ]
    print(format_table("Latency (seconds)", ["metric", *keys, "mean"], latency_rows, left=1))
    replica_rows = [
        [
            str(rep["replica"]),
            str(rep["num_requests"]),
            f"{rep['busy_pct']:.1f}",
            f"{rep['mfu_pct']:.1f}",
            f"{rep['kv_use_mean_pct']:.1f}",
            f"{rep['kv_use_max_pct']:.1f}",
            str(rep["iterations"]),
            str(rep["preemptions"]),
        ]
        for rep in summary["replicas"]
    ]
    headers = ["replica", "requests", "busy%", "MFU%", "KV avg%", "KV max%", "iters", "preempted"]
    print(format_table("Replicas", headers, replica_rows))
    batch = summary["batch_size"]
    print(f"execution times: {summary['execution_model']}")
    print(
        f"{summary['num_completed']}/{summary['num_requests']} requests completed in "
        f"{summary['simulated_time_s']:.1f} s simulated; {summary['output_tokens_per_s']:.0f} output tokens/s; "
        f"batch size p50 {batch['p50']:.0f}, mean {batch['mean']:.1f}; "
        f"simulation loop ({summary['sim_loop']}) {summary['sim_loop_s']:.2f} s "
        f"({summary['requests_per_cpu_second']:.0f} requests per CPU-second), wall {summary['wall_time_s']:.2f} s"
    )
    print(
        f"prefill tokens computed {summary['prefill_tokens_computed']}; "
        f"prefix cache hit rate {summary['prefix_hit_rate']:.3f}"
    )


def format_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> str:
    """A boxed text table, as rich draws one, without importing rich (30 ms of every run's start);
    the first `left` columns are left-aligned, the rest right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str], bar: str) -> str:
        padded = (
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )
        return bar + "".join(f" {cell} {bar}" for cell in padded)

    def rule(start: str, fill: str, cross: str, end: str) -> str:
        return start + cross.join(fill * (width + 2) for width in widths) + end

    return "\n".join(
        [
            title,
            rule("┏", "━", "┳", "┓"),
            line(headers, "┃"),
            rule("┡", "━", "╇", "┩"),
            *(line(row, "│") for row in rows),
            rule("└", "─", "┴", "┘"),
        ]
    )
