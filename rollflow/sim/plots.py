"""PNG figures of a simulation: latency CDFs, and queue depth and KV use over time per replica."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from rollflow.sim.engine import SimResult
from rollflow.sim.metrics import RequestTable

CDF_PANELS = (
    ("ttft", "time to first token (s)"),
    ("tpot", "time per output token (s)"),
    ("e2e", "end-to-end (s)"),
)


def plot_latency_cdfs(path: Path, table: RequestTable) -> Path:
    fig, axes = plt.subplots(1, len(CDF_PANELS), figsize=(13, 3.6))
    for ax, (column, label) in zip(axes, CDF_PANELS, strict=True):
        values = np.sort(table.columns[column])
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), lw=1.6)
            for q in (50, 90, 99):
                ax.axvline(np.percentile(values, q), ls=":", lw=0.8, color="grey")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(f"Latency CDFs ({len(table)} requests; dotted: p50, p90, p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_replica_timelines(path: Path, result: SimResult) -> Path:
    fig, (ax_queue, ax_kv) = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
    for replica in result.replicas:
        samples = np.array(replica.stats.kv_samples) if replica.stats.kv_samples else np.zeros((0, 4))
        if not len(samples):
            continue
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
