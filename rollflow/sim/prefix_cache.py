"""A replica's prefix cache over its KV blocks, as vLLM's automatic prefix caching keeps it.

A full block is named by a hash that chains its parent block's hash and its tokens, so equal
hashes mean equal prefixes. Requests carry their tokens compactly as segments (content id,
length): a shared system prompt, a GRPO prompt, a session's earlier turns and answers are each
one segment, and a block's tokens are the slices of the segments it covers.

Each cached block has a reference count (requests using it). A block nobody references stays
cached but is evictable: it counts as free memory, and when the allocator needs it back the
least recently released goes first (a request releases its blocks tail first, so a prefix's
deepest blocks go before its root, as in vLLM). Shared blocks are held once, however many
requests reference them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from rollflow.token_blocks import chained

Segments = tuple[tuple[int, int], ...]  # (content id, number of tokens), in order


def block_hashes(segments: Segments, num_tokens: int, block_size: int) -> list[int]:
    """Hashes of the full blocks among the first `num_tokens` tokens of `segments`."""
    return chained(_blocks(segments, num_tokens - num_tokens % block_size, block_size))


def _blocks(segments: Segments, limit: int, block_size: int) -> Iterator[tuple[tuple[int, int, int], ...]]:
    """The first `limit` tokens of `segments` in blocks, each as the (content id, start, end)
    slices of the segments it covers."""
    pieces: list[tuple[int, int, int]] = []  # slices in the current block
    filled = 0
    seen = 0
    for content, length in segments:
        start = 0
        while start < length and seen < limit:
            take = min(length - start, block_size - filled, limit - seen)
            pieces.append((content, start, start + take))
            start += take
            filled += take
            seen += take
            if filled == block_size:
                yield tuple(pieces)
                pieces.clear()
                filled = 0
        if seen >= limit:
            break


class PrefixCache:
    """Cached full blocks of one replica: hash -> references, plus the LRU of unreferenced ones."""

    def __init__(self) -> None:
        self.ref_counts: dict[int, int] = {}  # every cached block
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, oldest release first
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self.ref_counts)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.ref_counts

    def match(self, hashes: list[int]) -> int:
        """How many leading blocks of `hashes` are cached (the longest cached prefix)."""
        refs = self.ref_counts
        count = 0
        for block_hash in hashes:
            if block_hash not in refs:
                break
            count += 1
        return count

    def num_referenced_among(self, hashes: list[int]) -> int:
        """Blocks of `hashes` already held by some request (taking them allocates nothing)."""
        refs = self.ref_counts
        return sum(1 for h in hashes if refs.get(h, 0) > 0)

    def acquire(self, hashes: list[int]) -> int:
        """Reference every block of `hashes`, caching the new ones; returns how many blocks this
        newly takes out of free memory (new blocks, and cached ones that were evictable)."""
        refs, evictable = self.ref_counts, self.evictable
        taken = 0
        for block_hash in hashes:
            count = refs.get(block_hash, 0)
            if count == 0:
                taken += 1
                evictable.pop(block_hash, None)
            refs[block_hash] = count + 1
        return taken

    def release(self, hashes: list[int]) -> int:
        """Drop one reference to each block (tail first); returns how many became evictable."""
        refs, evictable = self.ref_counts, self.evictable
        freed = 0
        for block_hash in reversed(hashes):
            count = refs[block_hash] - 1
            refs[block_hash] = count
            if count == 0:
                evictable[block_hash] = None
                freed += 1
        return freed

    def discard_unreferenced(self, hashes: list[int]) -> None:
        """Forget blocks of `hashes` nobody references (registered, never computed)."""
        refs, evictable = self.ref_counts, self.evictable
        for block_hash in hashes:
            if refs.get(block_hash) == 0:
                del refs[block_hash]
                evictable.pop(block_hash, None)

    def insert_evictable(self, hashes: list[int]) -> int:
        """Cache blocks a request computed and just gave up (its output); returns how many were new."""
        refs, evictable = self.ref_counts, self.evictable
        added = 0
        for block_hash in reversed(hashes):
            if block_hash not in refs:
                refs[block_hash] = 0
                evictable[block_hash] = None
                added += 1
        return added

    def evict_to(self, max_evictable: int) -> None:
        """Evict least recently released blocks until at most `max_evictable` remain."""
        evictable, refs = self.evictable, self.ref_counts
        while len(evictable) > max_evictable:
            block_hash, _ = evictable.popitem(last=False)
            del refs[block_hash]
            self.num_evictions += 1
