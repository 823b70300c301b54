"""Per-operator time grids that every execution-time source (profile tables, roofline) produces.

A grid is indexed directly by the quantity the batch scheduler knows (tokens in the batch,
decode batch size and mean KV length, prefill chunk and cached prefix), so a prediction is an
array lookup, not a model evaluation. That is what makes the simulator's hot path cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PrefillGrid:
    """Attention-prefill time (ms per layer) sampled per chunk size along the cached-prefix length.

    Lookups interpolate linearly along the prefix and in chunk_size**2 between the two nearest
    sampled chunk sizes (the cost is quadratic in the chunk), and clamp outside the sampled range,
    as a tree model trained on the same table would.
    """

    chunk_sizes: np.ndarray  # sorted sampled chunk sizes
    kv_points: tuple[np.ndarray, ...]  # per chunk size: sorted cached-prefix lengths
    times_ms: tuple[np.ndarray, ...]  # per chunk size: time at each prefix length
    _cache: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def lookup(self, kv_cache_size: int, chunk_size: int) -> float:
        key = (kv_cache_size, chunk_size)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        sizes = self.chunk_sizes
        hi = int(np.searchsorted(sizes, chunk_size))
        if hi == 0 or hi == len(sizes):
            idx = 0 if hi == 0 else len(sizes) - 1
            value = self._along_kv(idx, kv_cache_size)
        else:
            lo = hi - 1
            c0, c1 = float(sizes[lo]), float(sizes[hi])
            weight = (chunk_size**2 - c0**2) / (c1**2 - c0**2)
            value = (1 - weight) * self._along_kv(lo, kv_cache_size) + weight * self._along_kv(
                hi, kv_cache_size
            )
        self._cache[key] = value
        return value

    def _along_kv(self, idx: int, kv_cache_size: int) -> float:
        return float(np.interp(kv_cache_size, self.kv_points[idx], self.times_ms[idx]))


@dataclass(frozen=True)
class OperatorTimes:
    """Per-layer times (ms) of one replica shard's operators, on direct-index grids."""

    # [num_tokens] projections, MLP, norms, rope, residual add and the TP all-reduces of one layer
    linear_ms: np.ndarray
    # [num_tokens] writing new K/V into the paged cache (exact token count, not rounded)
    kv_save_ms: np.ndarray
    # [num_tokens] activations sent to the next pipeline stage (once per stage, not per layer)
    send_recv_ms: np.ndarray
    # [decode_batch_size, kv_bucket] attention over the cache for decode tokens
    decode_ms: np.ndarray
    prefill: PrefillGrid
    # KV lengths are bucketed (rounded up) to this many tokens before decode/prefill lookups
    kv_granularity: int = 64
    # where the numbers came from, for reports
    source: str = ""


def interp_grid(xs: np.ndarray, ys: np.ndarray, size: int) -> np.ndarray:
    """Sample (xs, ys) at 0..size-1 by linear interpolation, clamped at both ends."""
    order = np.argsort(xs, kind="stable")
    xs_sorted, ys_sorted = np.asarray(xs, float)[order], np.asarray(ys, float)[order]
    unique_x, inverse = np.unique(xs_sorted, return_inverse=True)
    mean_y = np.bincount(inverse, weights=ys_sorted) / np.bincount(inverse)
    return np.interp(np.arange(size, dtype=float), unique_x, mean_y)
