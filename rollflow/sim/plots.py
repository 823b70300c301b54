"""PNG figures of a simulation: latency CDFs, and queue depth and KV use over time per replica.

Curves are downsampled before they are drawn (a figure is about a thousand pixels wide; a run
has hundreds of thousands of samples), and drawn by `rollflow.sim.chart` on Pillow rather than
matplotlib: the two figures took 0.75 CPU s of a run through matplotlib, about 0.1 now.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rollflow.sim.chart import Figure
from rollflow.sim.metrics import RequestTable, percentiles, rows_array
from rollflow.sim.simulator import SimResult

MAX_POINTS = 1000  # per curve

CDF_PANELS = (
    ("ttft", "time to first token (s)"),
    ("tpot", "time per output token (s)"),
    ("e2e", "end-to-end (s)"),
)


def plot_latency_cdfs(path: Path, table: RequestTable) -> Path:
    fig = Figure(1430, 396)
    fig.title = f"Latency CDFs ({len(table)} requests; dotted: p50, p90, p99)"
    gap = 0.065  # room for the next panel's tick labels and y label
    width = (0.99 - 0.05 - gap * (len(CDF_PANELS) - 1)) / len(CDF_PANELS)
    for i, (column, label) in enumerate(CDF_PANELS):
        left = 0.05 + i * (width + gap)
        ax = fig.add_axes(left, 0.12, left + width, 0.85)
        values = np.sort(table.columns[column])
        if len(values):
            fractions = np.arange(1, len(values) + 1) / len(values)
            keep = _sample_indices(len(values))
            ax.plot(values[keep], fractions[keep], width=1.6)
            ax.vlines = percentiles(values, (50, 90, 99))
        ax.xlabel, ax.ylabel = label, "fraction of requests"
    return fig.save(path)


def plot_replica_timelines(path: Path, result: SimResult) -> Path:
    fig = Figure(1210, 605)
    fig.title = "Queue depth and KV-cache use over time"
    ax_queue = fig.add_axes(0.07, 0.07, 0.99, 0.49)
    ax_kv = fig.add_axes(0.07, 0.51, 0.99, 0.91)
    for replica in result.replicas:
        if not replica.stats.kv_samples:
            continue
        samples = _downsample_steps(rows_array(replica.stats.kv_samples, 4))
        ax_queue.step(samples[:, 0], samples[:, 2], label=f"replica {replica.id}")
        ax_kv.step(samples[:, 0], 100 * samples[:, 1], label=f"replica {replica.id}")
    ax_queue.ylabel, ax_queue.xticklabels = "waiting requests", False
    ax_kv.ylabel, ax_kv.xlabel = "KV blocks in use (%)", "simulated time (s)"
    if len(result.replicas) <= 8:
        ax_queue.legend_columns = 4
    return fig.save(path, shared_x=True)


def _sample_indices(n: int) -> np.ndarray:
    """At most MAX_POINTS evenly spaced indices of n, always with the first and the last (above
    MAX_POINTS they are at least one apart, so rounding makes no duplicates)."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64)


def _downsample_steps(samples: np.ndarray) -> np.ndarray:
    """Rows of (time, kv_use, waiting, resident) reduced to MAX_POINTS time bins.

    Each bin keeps its (first) row with the most waiting requests and its row with the highest KV
    use, so peaks survive, as a pixel column of the full plot would show them.
    """
    if len(samples) <= MAX_POINTS:
        return samples
    edges = np.linspace(samples[0, 0], samples[-1, 0], MAX_POINTS // 2 + 1)
    bins = np.searchsorted(edges, samples[:, 0], side="right")
    keep = [np.array([len(samples) - 1])]
    for column in (2, 1):
        order = np.lexsort((-samples[:, column], bins))  # by bin, largest first, then by row
        ordered_bins = bins[order]
        keep.append(order[np.r_[True, ordered_bins[1:] != ordered_bins[:-1]]])
    rows = np.sort(np.concatenate(keep))
    return samples[rows[np.r_[True, rows[1:] != rows[:-1]]]]  # np.unique would import numpy.ma (40 ms)
