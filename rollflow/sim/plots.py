"""PNG figures of a simulation: latency CDFs, and queue depth and KV use over time per replica.

Curves are downsampled before they are drawn (a figure is about a thousand pixels wide; a run
has hundreds of thousands of samples), which keeps writing plots a small part of a run. Figures
are drawn on matplotlib's Agg canvas directly, without pyplot (a tenth of a second less to
import, no global figure registry), and with fixed margins: `tight_layout` would draw every
figure twice, once to measure its labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rollflow.sim.metrics import RequestTable
from rollflow.sim.simulator import SimResult

MAX_POINTS = 1000  # per curve

CDF_PANELS = (
    ("ttft", "time to first token (s)"),
    ("tpot", "time per output token (s)"),
    ("e2e", "end-to-end (s)"),
)


def plot_latency_cdfs(path: Path, table: RequestTable) -> Path:
    fig = Figure(figsize=(13, 3.6))
    axes = fig.subplots(1, len(CDF_PANELS))
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.15, top=0.88, wspace=0.22)
    for ax, (column, label) in zip(axes, CDF_PANELS, strict=True):
        values = np.sort(table.columns[column])
        if len(values):
            fractions = np.arange(1, len(values) + 1) / len(values)
            keep = _sample_indices(len(values))
            ax.plot(values[keep], fractions[keep], lw=1.6)
            for q in (50, 90, 99):
                ax.axvline(np.percentile(values, q), ls=":", lw=0.8, color="grey")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Latency CDFs ({len(table)} requests; dotted: p50, p90, p99)")
    return _save(fig, path)


def plot_replica_timelines(path: Path, result: SimResult) -> Path:
    fig = Figure(figsize=(11, 5.5))
    ax_queue, ax_kv = fig.subplots(2, 1, sharex=True)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.09, top=0.93, hspace=0.08)
    for replica in result.replicas:
        samples = np.array(replica.stats.kv_samples) if replica.stats.kv_samples else np.zeros((0, 4))
        if not len(samples):
            continue
        samples = _downsample_steps(samples)
        ax_queue.step(samples[:, 0], samples[:, 2], where="post", lw=1, label=f"replica {replica.id}")
        ax_kv.step(samples[:, 0], 100 * samples[:, 1], where="post", lw=1, label=f"replica {replica.id}")
    ax_queue.set_ylabel("waiting requests")
    ax_kv.set_ylabel("KV blocks in use (%)")
    ax_kv.set_xlabel("simulated time (s)")
    for ax in (ax_queue, ax_kv):
        ax.grid(alpha=0.3)
    if len(result.replicas) <= 8:
        ax_queue.legend(loc="upper left", fontsize=8, ncol=4)
    fig.suptitle("Queue depth and KV-cache use over time")
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # the canvas attaches itself to the figure
    fig.savefig(path, dpi=110)
    return path


def _sample_indices(n: int) -> np.ndarray:
    """At most MAX_POINTS evenly spaced indices of n, always with the first and the last."""
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64))


def _downsample_steps(samples: np.ndarray) -> np.ndarray:
    """Rows of (time, kv_use, waiting, resident) reduced to MAX_POINTS time bins.

    Each bin keeps its row with the most waiting requests and its row with the highest KV use,
    so peaks survive, as a pixel column of the full plot would show them.
    """
    if len(samples) <= MAX_POINTS:
        return samples
    edges = np.linspace(samples[0, 0], samples[-1, 0], MAX_POINTS // 2 + 1)
    bins = np.searchsorted(edges, samples[:, 0], side="right")
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    keep = {len(samples) - 1}
    for lo, hi in zip(starts, np.r_[starts[1:], len(samples)], strict=True):
        keep.add(lo + int(np.argmax(samples[lo:hi, 2])))
        keep.add(lo + int(np.argmax(samples[lo:hi, 1])))
    return samples[sorted(keep)]
