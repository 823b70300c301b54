"""Blocks of tokens named as vLLM names its KV blocks: block k's hash chains block k-1's with
block k's tokens, so it names the whole prefix up to there and one lookup per block finds the
longest prefix two sequences share. The simulator's prefix cache (blocks of segments), the
built-in engine's prefix cache and the manager's record of what each engine holds (blocks of
token ids) all name blocks through `chained`."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence


def chained(blocks: Iterable[Hashable]) -> list[int]:
    """One hash per block, each chaining the previous block's hash with this block's content."""
    hashes, previous = [], 0
    for block in blocks:
        previous = hash((previous, block))
        hashes.append(previous)
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the whole blocks of `token_ids` (a partial last block has none)."""
    whole = len(token_ids) // block_size * block_size
    return chained(tuple(token_ids[start : start + block_size]) for start in range(0, whole, block_size))
