"""Writes a simulation's output folder and prints its summary table.

DIR/summary.json       latency percentiles, throughput, per-replica utilization
DIR/requests.csv       one row per completed request
DIR/chrome_trace.json  one slice per batch (a decode run is one slice), opens in Perfetto
DIR/plots/*.png        latency CDFs; queue depth and KV use over time
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

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
    """Every value as Python writes it (`repr`: exact floats); one string join, no csv quoting,
    since every column is a number."""
    columns = [list(map(repr, table.columns[name].tolist())) for name in REQUEST_COLUMNS]
    with path.open("w") as handle:
        handle.write(",".join(REQUEST_COLUMNS) + "\n")
        handle.writelines(",".join(row) + "\n" for row in zip(*columns, strict=True))
    return path


def _write_chrome_trace(path: Path, result: SimResult) -> Path:
    """Streamed per replica, each event %-formatted from one template: runs have hundreds of
    thousands of batches. Timestamps are microseconds to the nanosecond."""
    with path.open("w") as out:
        out.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for replica in result.replicas:
            pid = replica.id
            out.write(
                f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "replica {pid}"}}}}'
            )
            batch = (
                ',\n{"name": "%s", "ph": "X", "pid": ' + str(pid) + ', "tid": 0, "ts": %.3f, "dur": %.3f, '
                '"args": {"batch_size": %d, "tokens_per_iteration": %d, "prefill_tokens": %d, "iterations": %d}}'
            )
            out.write(
                "".join(
                    [
                        batch % (_batch_name(tokens, prefill, iterations), start * 1e6, duration * 1e6, size,
                                 tokens, prefill, iterations)
                        for start, duration, size, tokens, prefill, iterations in replica.stats.batches
                    ]
                )
            )  # fmt: skip
            load = (
                ',\n{"name": "load", "ph": "C", "pid": ' + str(pid) + ', "ts": %.3f, '
                '"args": {"kv_use_pct": %.2f, "waiting": %d, "resident": %d}}'
            )
            out.write(
                "".join(
                    [
                        load % (time * 1e6, 100 * kv_use, waiting, resident)
                        for time, kv_use, waiting, resident in replica.stats.kv_samples
                    ]
                )
            )
            out.write(",\n")
        out.write('{"name": "trace_end", "ph": "i", "pid": 0, "ts": 0, "s": "g"}\n]}\n')
    return path


def _batch_name(tokens: int, prefill_tokens: int, iterations: int) -> str:
    kind = "prefill" if prefill_tokens == tokens else "decode" if prefill_tokens == 0 else "mixed"
    return f"{kind} x{iterations}" if iterations > 1 else kind


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="Latency (seconds)", title_justify="left")
    table.add_column("metric")
    keys = [key for key in summary[LATENCY_METRICS[0]] if key != "mean"]
    for key in keys:
        table.add_column(key, justify="right")
    table.add_column("mean", justify="right")
    for name in LATENCY_METRICS:
        dist = summary[name]
        table.add_row(name, *(f"{dist[key]:.4f}" for key in keys), f"{dist['mean']:.4f}")
    console.print(table)

    replicas = Table(title="Replicas", title_justify="left")
    for column in (
        "replica",
        "requests",
        "busy%",
        "MFU%",
        "KV avg%",
        "KV max%",
        "iters",
        "preempted",
    ):
        replicas.add_column(column, justify="right")
    for rep in summary["replicas"]:
        replicas.add_row(
            str(rep["replica"]),
            str(rep["num_requests"]),
            f"{rep['busy_pct']:.1f}",
            f"{rep['mfu_pct']:.1f}",
            f"{rep['kv_use_mean_pct']:.1f}",
            f"{rep['kv_use_max_pct']:.1f}",
            str(rep["iterations"]),
            str(rep["preemptions"]),
        )
    console.print(replicas)
    batch = summary["batch_size"]
    console.print(f"execution times: {summary['execution_model']}")
    console.print(
        f"{summary['num_completed']}/{summary['num_requests']} requests completed in "
        f"{summary['simulated_time_s']:.1f} s simulated; {summary['output_tokens_per_s']:.0f} output tokens/s; "
        f"batch size p50 {batch['p50']:.0f}, mean {batch['mean']:.1f}; "
        f"simulation loop {summary['sim_loop_s']:.2f} s "
        f"({summary['requests_per_cpu_second']:.0f} requests per CPU-second), wall {summary['wall_time_s']:.2f} s"
    )
    console.print(
        f"prefill tokens computed {summary['prefill_tokens_computed']}; "
        f"prefix cache hit rate {summary['prefix_hit_rate']:.3f}"
    )
