"""Which shapes a profile measures: token counts for the per-token operators, (batch size, KV length)
for decode attention and (chunk size, cached prefix) for prefill attention.

The simulator interpolates between sampled points (`rollflow/perf/tables.py`), so the grids are
dense where time changes shape (small counts, powers of two) and sparse elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GridName = Literal["small", "default"]


@dataclass(frozen=True)
class ProfileGrid:
    # num_tokens at which the per-token (MLP, projection, norm) operators are timed
    num_tokens: tuple[int, ...]
    # (batch_size, kv_cache_size) points of decode attention
    decode: tuple[tuple[int, int], ...]
    # (prefill_chunk_size, kv_cache_size) points of prefill attention; kv_cache_size = cached prefix
    prefill: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return len(self.num_tokens) + len(self.decode) + len(self.prefill)


def build_grid(name: GridName, max_model_len: int, max_batch_size: int, max_kv_tokens: int) -> ProfileGrid:
    """The named grid, clipped to the model's context length and a KV budget (batch x KV tokens)."""
    if name == "small":
        tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        batches = [1, 2, 4, 8]
        kv_lengths = [64, 128, 256, 512]
        chunks = [16, 64, 256]
        prefixes = [0, 128, 512]
    else:
        tokens = sorted({1, 2, 4, *range(8, 1025, 8), *range(1024, 4097, 64)})
        batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
        kv_lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
        chunks = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
        prefixes = [0, 256, 512, 1024, 2048, 4096, 8192]
    tokens = [n for n in tokens if n <= max(max_model_len, max_batch_size)]
    decode = [
        (b, s)
        for b in batches
        for s in kv_lengths
        if b <= max_batch_size and s <= max_model_len and b * s <= max_kv_tokens
    ]
    prefill = [(c, p) for c in chunks for p in prefixes if c + p <= max_model_len]
    return ProfileGrid(tuple(tokens), tuple(decode), tuple(prefill))
