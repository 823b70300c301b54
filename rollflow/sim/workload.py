"""Request streams: trace replay, synthetic (lengths x intervals), and RL rollout bursts.

Every generator is a pure function of its config and seed and returns requests sorted by
arrival time, with prompt + output <= the workload's max_tokens.
"""

from __future__ import annotations

import csv
import math
import random
from itertools import islice
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
from rollflow.sim.prefix_cache import Segments
from rollflow.sim.request import SimRequest


class WorkloadError(UserError):
    """A trace file that cannot be replayed; the message names the file and the problem."""


def build_requests(workload: WorkloadConfig, seed: int) -> list[SimRequest]:
    if isinstance(workload, TraceWorkload):
        arrivals, prompts, outputs = replay_trace(workload)
    elif isinstance(workload, SyntheticWorkload):
        if _shares_prefixes(workload):
            return shared_prefix_requests(workload, seed)
        arrivals, prompts, outputs = synthesize(workload, seed)
    else:
        return _burst_requests(workload, seed)
    order = np.argsort(arrivals, kind="stable")
    rows = zip(arrivals[order].tolist(), prompts[order].tolist(), outputs[order].tolist(), strict=True)
    return [SimRequest(i, arrival, prompt, output) for i, (arrival, prompt, output) in enumerate(rows)]


def _shares_prefixes(workload: SyntheticWorkload) -> bool:
    return workload.system_prompt_tokens > 0 or workload.groups is not None or workload.sessions is not None


def _numbered(specs: list[tuple[float, int, int, Segments, int]]) -> list[SimRequest]:
    """(arrival, prompt, output, segments, prefix key) -> requests numbered in arrival order."""
    specs.sort(key=lambda spec: spec[0])  # stable: a group keeps its order
    return [
        SimRequest(i, arrival, prompt, output, segments, key)
        for i, (arrival, prompt, output, segments, key) in enumerate(specs)
    ]


def shared_prefix_requests(workload: SyntheticWorkload, seed: int) -> list[SimRequest]:
    """Synthetic traffic whose requests share prefixes, with their token identity as segments.

    Content ids: 0 is the system prompt, each prompt, answer and turn gets its own. Lengths are
    drawn as for plain synthetic traffic with room left for the system prompt; a group's samples
    take their group's prompt and their own outputs; a session's turns draw their outputs.
    """
    system = workload.system_prompt_tokens
    budget = workload.max_tokens - system
    arrivals, _, _ = synthesize(workload, seed)
    rng = np.random.default_rng(seed + 1)
    per_arrival = (
        workload.groups.size if workload.groups else workload.sessions.turns if workload.sessions else 1
    )
    prompts, outputs = _lengths(workload.lengths, len(arrivals) * per_arrival, budget, rng)
    head: Segments = ((0, system),) if system else ()
    next_id = 1
    specs: list[tuple[float, int, int, Segments, int]] = []
    for index, arrival in enumerate(arrivals.tolist()):
        base = index * per_arrival
        prompt_id, next_id = next_id, next_id + 1
        context = (*head, (prompt_id, int(prompts[base])))
        if workload.sessions is None:
            for k in range(per_arrival):  # a group (or a lone request) on one prompt
                output = min(int(outputs[base + k]), budget - int(prompts[base]))
                answer, next_id = next_id, next_id + 1
                specs.append(
                    (arrival, system + int(prompts[base]), output, (*context, (answer, output)), index + 1)
                )
            continue
        sessions = workload.sessions
        for turn in range(per_arrival):
            prompt = sum(length for _, length in context)
            output = int(outputs[base + turn])
            if prompt + output > workload.max_tokens:
                break
            answer, next_id = next_id, next_id + 1
            at = arrival + turn * sessions.think_time_s
            specs.append((at, prompt, output, (*context, (answer, output)), index + 1))
            context = (*context, (answer, output), (next_id, sessions.turn_tokens))
            next_id += 1
    return _numbered(specs)


def _burst_requests(workload: RolloutBurstWorkload, seed: int) -> list[SimRequest]:
    """An RL burst with token identity: the samples of a prompt share it (content id per prompt)."""
    arrivals, prompts, outputs = rollout_burst(workload, seed)
    group = workload.samples_per_prompt
    return [
        SimRequest(
            i,
            float(arrivals[i]),
            int(prompts[i]),
            int(outputs[i]),
            ((i // group, int(prompts[i])), (-1 - i, int(outputs[i]))),
            i // group + 1,
        )
        for i in range(len(arrivals))
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
        rows = list(reader if limit is None else islice(reader, limit))
    if not rows:
        raise WorkloadError(f"{path} has no data rows")
    try:  # column by column: a few C-level passes instead of a Python loop per row
        return {
            name: np.fromiter(map(float, [row[i] for row in rows]), float, len(rows))
            for name, i in zip(columns, index, strict=True)
        }
    except (ValueError, IndexError):
        for number, row in enumerate(rows, start=2):
            try:
                [float(row[i]) for i in index]
            except (ValueError, IndexError):
                raise WorkloadError(f"{path}:{number}: expected numbers in {', '.join(columns)}") from None
        raise


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
    if workload.rng == "vidur":
        return _vidur_draws(workload, seed)
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


def _vidur_draws(workload: SyntheticWorkload, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The list Vidur's SyntheticRequestGenerator makes for `seed`, draw for draw.

    Vidur seeds Python's `random` with the seed and takes one `random.random()` per gap, and
    shuffles the length trace with pandas' `sample(frac=1, random_state=seed)`, which is numpy's
    legacy RandomState(seed).permutation; request i takes the i-th shuffled row.
    """
    count = workload.num_requests or 1
    intervals = workload.intervals
    if isinstance(intervals, PoissonIntervals):
        draws = random.Random(seed)
        cap = math.inf if intervals.max_gap_factor is None else intervals.max_gap_factor / intervals.qps
        gaps = [min(-math.log(1.0 - draws.random()) / intervals.qps, cap) for _ in range(count)]
        arrivals = np.cumsum(gaps)
    else:
        arrivals = np.zeros(count)
    legacy = np.random.RandomState(seed)  # Vidur's shuffle draws from the legacy generator
    prompts, outputs = _lengths(workload.lengths, count, workload.max_tokens, legacy)
    return arrivals, prompts, outputs


def _duration_budget(workload: SyntheticWorkload) -> int:
    qps = getattr(workload.intervals, "qps", 1.0)
    return int(workload.duration_s * qps * 2 + 100)


def _intervals(config: object, rng: np.random.Generator, count: int) -> np.ndarray:
    if isinstance(config, PoissonIntervals):
        gaps = rng.exponential(1.0 / config.qps, count)
        if config.max_gap_factor is not None:
            gaps = np.minimum(gaps, config.max_gap_factor / config.qps)
        return gaps
    if isinstance(config, GammaIntervals):
        shape = 1.0 / config.cv**2
        return rng.gamma(shape, 1.0 / (config.qps * shape), count)
    if isinstance(config, StaticIntervals):
        return np.zeros(count)
    raise TypeError(f"unknown interval config {config!r}")


def _lengths(
    config: object, count: int, max_tokens: int, rng: np.random.Generator | np.random.RandomState
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
    total = prompts + outputs
    excess = np.maximum(total - max_tokens, 0)  # taken from both in proportion, as Vidur does
    prompts, outputs = (
        np.maximum(prompts - np.ceil(excess * (prompts / total)).astype(np.int64), 1),
        np.maximum(outputs - np.ceil(excess * (outputs / total)).astype(np.int64), 1),
    )
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
