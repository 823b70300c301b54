"""Repeated timing of one operator call: warm-up, then `repeats` measured calls.

On CUDA each call is bracketed by CUDA events (kernel time on the stream, without the host's
launch jitter), as Vidur's profiler does; on the CPU by `time.perf_counter`, the calls being
synchronous there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

STATS = ("min", "max", "mean", "median", "std")


def time_call(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> dict[str, float]:
    """Milliseconds per call: min, max, mean, median and (population) std over `repeats` calls."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        samples = _cuda_samples(fn, repeats)
    else:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    return {
        "min": min(samples),
        "max": max(samples),
        "mean": statistics.fmean(samples),
        "median": statistics.median(samples),
        "std": statistics.pstdev(samples),
    }


def _cuda_samples(fn: Callable[[], object], repeats: int) -> list[float]:
    # Unverified on a GPU in this project so far (no GPU was lent when this was written).
    import torch

    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]
