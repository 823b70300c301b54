"""Token ids named by block, as vLLM names its KV blocks: block k's hash chains block k-1's with
block k's tokens, so it names the whole prefix up to there and one lookup per block finds the
longest prefix two sequences share. The built-in engine's prefix cache and the manager's record of
what each engine holds both name blocks this way."""

from __future__ import annotations

from collections.abc import Sequence


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the whole blocks of `token_ids` (a partial last block has none)."""
    hashes, previous = [], 0
    for start in range(0, len(token_ids) // block_size * block_size, block_size):
        previous = hash((previous, *token_ids[start : start + block_size]))
        hashes.append(previous)
    return hashes
