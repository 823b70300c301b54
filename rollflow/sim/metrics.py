"""Per-request, per-batch and per-replica metrics of a finished simulation.

Latency definitions are Vidur's, so the two simulators' summaries compare directly:
- `ttft`: first token (prefill end) minus arrival (Vidur's `prefill_e2e_time`);
- `tpot`: (completion - first token) / output tokens (Vidur's
  `decode_time_execution_plus_preemption_normalized`; rollflow divides by the request's
  original output length, where Vidur divides by what was left at its last restart);
- `e2e`: completion minus arrival (`request_e2e_time`);
- `scheduling_delay`: first admission into a batch minus arrival (`request_scheduling_delay`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter

import numpy as np

from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import SimResult

LATENCY_METRICS = ("ttft", "tpot", "e2e", "scheduling_delay")
PERCENTILES = (50, 90, 99)


def percentile_key(p: float) -> str:
    """A percentile's key in the summary: p50, p95, p99.9."""
    return f"p{p:g}"


@dataclass(frozen=True)
class RequestTable:
    """Columns over completed requests, in request-id order."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["id"])


def request_table(result: SimResult) -> RequestTable:
    done = [r for r in result.requests if r.completed_at is not None]

    def column(name: str, dtype: type = float) -> np.ndarray:  # one C-level pass per attribute
        return np.fromiter(map(attrgetter(name), done), dtype, len(done))

    arrived = column("arrived_at")
    first_token = column("prefill_completed_at")
    completed = column("completed_at")
    scheduled = column("scheduled_at")
    outputs = column("output_tokens", np.int64)
    return RequestTable(
        {
            "id": column("id", np.int64),
            "replica": column("replica_id", np.int64),
            "arrived_at": arrived,
            "scheduled_at": scheduled,
            "first_token_at": first_token,
            "completed_at": completed,
            "prompt_tokens": column("prompt_tokens", np.int64),
            "output_tokens": outputs,
            "preemptions": column("num_restarts", np.int64),
            "ttft": first_token - arrived,
            "tpot": (completed - first_token) / np.maximum(outputs, 1),
            "e2e": completed - arrived,
            "scheduling_delay": scheduled - arrived,
        }
    )


def rows_array(rows: Sequence[tuple], width: int) -> np.ndarray:
    """A list of equal-length number tuples as a float array, without `np.array`'s per-tuple
    inspection (a quarter of the time on a run's batch records)."""
    flat = np.fromiter(chain.from_iterable(rows), float, len(rows) * width)
    return flat.reshape(len(rows), width)


def distribution(values: np.ndarray, points: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """The percentiles (numpy's linear interpolation between order statistics) and the mean."""
    if len(values) == 0:
        return {percentile_key(p): float("nan") for p in points} | {"mean": float("nan")}
    found = percentiles(values, points)
    return {percentile_key(p): v for p, v in zip(points, found, strict=True)} | {"mean": float(values.mean())}


def percentiles(values: np.ndarray, points: Sequence[float]) -> list[float]:
    """`np.percentile(values, points)` (its default, linear method), value for value.

    Written out because np.percentile imports numpy.ma (through np.unique) on its first call, 40 ms
    of every simulation's start-up. The same float operations in the same order: the virtual index
    (n - 1) * (p / 100), and numpy's lerp, which interpolates from the upper neighbour when the
    fraction is at least one half.
    """
    ordered = np.sort(values)
    n = len(ordered)
    if n == 0 or np.isnan(ordered[-1]):  # NaN sorts last; numpy returns NaN for every point
        return [float("nan")] * len(points)
    result = []
    for point in points:
        index = (n - 1) * (point / 100)
        if index >= n - 1:
            result.append(float(ordered[-1]))
            continue
        below = math.floor(index)
        a, b = float(ordered[below]), float(ordered[below + 1])
        fraction = index - below
        diff = b - a
        result.append(b - diff * (1 - fraction) if fraction >= 0.5 else a + diff * fraction)
    return result


def summarize(
    result: SimResult, table: RequestTable, sim_loop_s: float, percentiles: Sequence[float] = PERCENTILES
) -> dict:
    """The summary.json document; the caller adds `setup_s` and `wall_time_s`, known only at the end.
    Latencies are summarised at `percentiles`; batch shapes at p50/p90/p99."""
    simulated = result.simulated_time_s
    cols = table.columns
    generated = int(cols["output_tokens"].sum())
    replicas = []
    all_batches = []
    for replica in result.replicas:
        stats = replica.stats
        kv_samples = stats.kv_samples
        kv = (
            np.fromiter(map(itemgetter(1), kv_samples), float, len(kv_samples)) if kv_samples else np.zeros(1)
        )
        busy = stats.busy_s / replica.num_stages
        replicas.append(
            {
                "replica": replica.id,
                "busy_pct": 100.0 * busy / simulated if simulated else 0.0,
                "mfu_pct": 100.0 * stats.flops / (stats.busy_s * result.peak_flops_by_replica[replica.id])
                if stats.busy_s
                else 0.0,
                "kv_use_mean_pct": 100.0 * float(kv.mean()),
                "kv_use_max_pct": 100.0 * float(kv.max()),
                "iterations": stats.num_iterations,
                "preemptions": replica.scheduler.num_preemptions,
                "num_requests": int((cols["replica"] == replica.id).sum()),
            }
        )
        all_batches.extend(stats.batches)
    batch_arr = rows_array(all_batches, 6)
    weights = batch_arr[:, 5] if len(batch_arr) else np.zeros(0)
    return {
        **{name: distribution(cols[name], percentiles) for name in LATENCY_METRICS},
        "num_requests": len(result.requests),
        "num_completed": len(table),
        "simulated_time_s": simulated,
        "sim_loop_s": sim_loop_s,
        "requests_per_cpu_second": len(result.requests) / sim_loop_s if sim_loop_s else float("inf"),
        "num_events": result.num_events,
        "sim_loop": "compiled" if result.compiled_loop else "python",
        "output_tokens_per_s": generated / simulated if simulated else 0.0,
        "preempted_requests": int((cols["preemptions"] > 0).sum()),
        "prefix_hit_rate": prefix_hit_rate(result.requests),
        "prefill_tokens_computed": int((batch_arr[:, 4] * batch_arr[:, 5]).sum()) if len(batch_arr) else 0,
        "batch_size": _weighted_distribution(batch_arr[:, 2], weights),
        "batch_tokens": _weighted_distribution(batch_arr[:, 3], weights),
        "replicas": replicas,
        "execution_model": result.operator_source,
    }


def prefix_hit_rate(requests: list[SimRequest]) -> float:
    """Prompt tokens found in a prefix cache at first admission over all prompt tokens admitted."""
    admitted = [r for r in requests if r.scheduled_at is not None]
    prompt = sum(r.prompt_tokens for r in admitted)
    return sum(r.cached_tokens for r in admitted) / prompt if prompt else 0.0


def _weighted_distribution(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Per-iteration distribution of per-batch values, a decode run counting once per iteration."""
    if len(values) == 0:
        return distribution(values)
    order = np.argsort(values, kind="stable")
    sorted_values, cumulative = values[order], np.cumsum(weights[order])
    total = cumulative[-1]
    result = {
        f"p{p}": float(sorted_values[np.searchsorted(cumulative, total * p / 100.0)]) for p in PERCENTILES
    }
    return result | {"mean": float((values * weights).sum() / total)}
