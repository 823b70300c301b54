"""Request streams: trace replay, synthetic (lengths x intervals), and RL rollout bursts.

Every generator is a pure function of its config and seed and returns requests sorted by
arrival time, with prompt + output <= the workload's max_tokens.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from rollflow.errors import UserError
from rollflow.sim.config import (
    FixedLengths,
    GammaIntervals,
    PoissonIntervals,
    RolloutBurstWorkload,
    StaticIntervals,
    SyntheticWorkload,
    TraceLengths,
    TraceWorkload,
    UniformLengths,
    WorkloadConfig,
    ZipfLengths,
)
from rollflow.sim.request import SimRequest


class WorkloadError(UserError):
    """A trace file that cannot be replayed; the message names the file and the problem."""


def build_requests(workload: WorkloadConfig, seed: int) -> list[SimRequest]:
    if isinstance(workload, TraceWorkload):
        arrivals, prompts, outputs = replay_trace(workload)
    elif isinstance(workload, SyntheticWorkload):
        arrivals, prompts, outputs = synthesize(workload, seed)
    else:
        arrivals, prompts, outputs = rollout_burst(workload, seed)
    order = np.argsort(arrivals, kind="stable")
    return [
        SimRequest(i, float(arrivals[j]), int(prompts[j]), int(outputs[j]))
        for i, j in enumerate(order.tolist())
    ]


def read_trace_columns(
    path: str, columns: tuple[str, ...], limit: int | None = None
) -> dict[str, np.ndarray]:
    file = Path(path)
    if not file.is_file():
        raise WorkloadError(f"trace file not found: {path}")
    with file.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None) or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise WorkloadError(f"{path} lacks column(s) {', '.join(missing)}; it has: {', '.join(header)}")
        index = [header.index(c) for c in columns]
        rows = []
        for number, row in enumerate(reader, start=2):
            if limit is not None and len(rows) >= limit:
                break
            try:
                rows.append([float(row[i]) for i in index])
            except (ValueError, IndexError):
                raise WorkloadError(f"{path}:{number}: expected numbers in {', '.join(columns)}") from None
    if not rows:
        raise WorkloadError(f"{path} has no data rows")
    data = np.array(rows)
    return {name: data[:, k] for k, name in enumerate(columns)}


def replay_trace(workload: TraceWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vidur's trace replay: scale, floor to ints, at least one token each, then trim prompts to fit."""
    cols = read_trace_columns(
        workload.file, ("arrived_at", "num_prefill_tokens", "num_decode_tokens"), workload.num_requests
    )
    prompts = np.maximum((cols["num_prefill_tokens"] * workload.prefill_scale).astype(np.int64), 1)
    outputs = np.maximum((cols["num_decode_tokens"] * workload.decode_scale).astype(np.int64), 1)
    prompts = prompts - np.maximum(prompts + outputs - workload.max_tokens, 0)
    if (prompts < 1).any():
        raise WorkloadError(f"{workload.file}: some outputs alone exceed max_tokens={workload.max_tokens}")
    return cols["arrived_at"] * workload.time_scale, prompts, outputs


def synthesize(workload: SyntheticWorkload, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if workload.duration_s is not None:
        intervals = _intervals(workload.intervals, rng, _duration_budget(workload))
        arrivals = np.cumsum(intervals)
        arrivals = arrivals[arrivals < workload.duration_s]
        if isinstance(workload.intervals, StaticIntervals):
            arrivals = np.zeros(workload.num_requests or 1)
    else:
        arrivals = np.cumsum(_intervals(workload.intervals, rng, workload.num_requests or 1))
    prompts, outputs = _lengths(workload.lengths, len(arrivals), workload.max_tokens, rng)
    return arrivals, prompts, outputs


def _duration_budget(workload: SyntheticWorkload) -> int:
    qps = getattr(workload.intervals, "qps", 1.0)
    return int(workload.duration_s * qps * 2 + 100)


def _intervals(config: object, rng: np.random.Generator, count: int) -> np.ndarray:
    if isinstance(config, PoissonIntervals):
        return rng.exponential(1.0 / config.qps, count)
    if isinstance(config, GammaIntervals):
        shape = 1.0 / config.cv**2
        return rng.gamma(shape, 1.0 / (config.qps * shape), count)
    if isinstance(config, StaticIntervals):
        return np.zeros(count)
    raise TypeError(f"unknown interval config {config!r}")


def _lengths(
    config: object, count: int, max_tokens: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(config, FixedLengths):
        prompts = np.full(count, config.prefill_tokens)
        outputs = np.full(count, config.decode_tokens)
    elif isinstance(config, UniformLengths):
        total = rng.uniform(config.min_tokens, max_tokens, count)
        outputs = np.ceil(total / (1 + config.prefill_to_decode_ratio))
        prompts = total - outputs
    elif isinstance(config, ZipfLengths):
        values = np.arange(config.min_tokens, max_tokens + 1)
        weights = 1.0 / np.power(np.arange(1, len(values) + 1), config.theta)
        total = values[np.searchsorted(np.cumsum(weights) / weights.sum(), rng.random(count))]
        outputs = total / (1 + config.prefill_to_decode_ratio)
        prompts = total - outputs
    elif isinstance(config, TraceLengths):
        cols = read_trace_columns(config.file, ("num_prefill_tokens", "num_decode_tokens"))
        picks = rng.permutation(len(cols["num_prefill_tokens"]))
        picks = np.resize(picks, count)
        prompts = cols["num_prefill_tokens"][picks] * config.prefill_scale
        outputs = cols["num_decode_tokens"][picks] * config.decode_scale
    else:
        raise TypeError(f"unknown length config {config!r}")
    prompts = np.maximum(np.asarray(prompts).astype(np.int64), 1)
    outputs = np.maximum(np.asarray(outputs).astype(np.int64), 1)
    excess = np.maximum(prompts + outputs - max_tokens, 0)
    share = prompts / (prompts + outputs)
    prompts = np.maximum(prompts - np.ceil(excess * share).astype(np.int64), 1)
    outputs = np.maximum(outputs - np.ceil(excess * (1 - share)).astype(np.int64), 1)
    return prompts, outputs


def rollout_burst(workload: RolloutBurstWorkload, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """B prompts x G samples at one instant; samples of a prompt share its length, outputs differ."""
    rng = np.random.default_rng(seed)
    jitter = workload.prompt_jitter
    low = max(1, int(workload.prompt_tokens * (1 - jitter)))
    high = max(low, int(workload.prompt_tokens * (1 + jitter)))
    prompt_lengths = rng.integers(low, high + 1, workload.num_prompts)
    count = workload.num_prompts * workload.samples_per_prompt
    if workload.output == "lognormal":
        outputs = rng.lognormal(np.log(workload.output_median_tokens), workload.output_sigma, count)
    else:
        decode = read_trace_columns(workload.output_trace or "", ("num_decode_tokens",))["num_decode_tokens"]
        outputs = rng.choice(decode, count)
    outputs = np.clip(np.round(outputs), 1, workload.max_new_tokens).astype(np.int64)
    prompts = np.repeat(prompt_lengths, workload.samples_per_prompt)
    return np.full(count, workload.arrival_s), prompts, outputs
