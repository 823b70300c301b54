"""The built-in engine's prefix cache: the KV of computed prefixes, reused by later requests.

GRPO sends each prompt n times and agents resend a growing context, so most prompts start with
tokens the engine has computed before. After a request's prompt is computed, and again when it
finishes (its answer too: an agent's next turn resends it, as SGLang's radix cache assumes), the
KV of its first `block_size`-aligned tokens is kept as an entry; a request whose prompt starts with a kept prefix
starts from a copy of that KV and computes only the rest (at least its last token, which yields
the first output token), as SGLang's radix cache and vLLM's automatic prefix caching do.

Prefixes are found by block: the hash of block k chains the hash of block k-1 with block k's tokens
(as vLLM's block hashes), each hash points at an entry holding that prefix, and a hit is checked
against the entry's tokens. Entries are evicted least recently used first once they hold more than
`max_tokens`. Owned by the generation thread alone (no locks).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.token_blocks import block_hashes


@dataclass
class _Entry:
    token_ids: tuple[int, ...]  # the cached prefix, a whole number of blocks
    kv: Any  # a transformers cache holding exactly `token_ids`
    hashes: list[int] = field(default_factory=list)  # block hashes that point at this entry


class PrefixCache:
    def __init__(self, max_tokens: int, block_size: int = 16) -> None:
        self.max_tokens = max_tokens
        self.block_size = block_size
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._by_hash: dict[int, int] = {}  # block hash -> entry id
        self._next_id = 0
        self.num_tokens = 0  # tokens held by all entries
        self.num_hit_tokens = 0  # prompt tokens served from the cache so far
        self.num_lookup_tokens = 0  # prompt tokens looked up so far

    def lookup(self, token_ids: Sequence[int]) -> tuple[int, Any]:
        """(tokens reused, a private copy of their KV) for the longest cached prefix of `token_ids`
        that leaves at least one token to compute; (0, None) on a miss."""
        self.num_lookup_tokens += len(token_ids)
        best: tuple[int, int] | None = None  # (tokens, entry id)
        for num_blocks, block_hash in enumerate(block_hashes(token_ids, self.block_size), start=1):
            entry_id = self._by_hash.get(block_hash)
            if entry_id is None:
                break
            best = (num_blocks * self.block_size, entry_id)
        if best is None:
            return 0, None
        # a prompt cached whole still computes its last token, which yields the first output token
        num_tokens, entry_id = min(best[0], len(token_ids) - 1), best[1]
        if num_tokens <= 0:
            return 0, None
        entry = self._entries[entry_id]
        if entry.token_ids[:num_tokens] != tuple(token_ids[:num_tokens]):  # a hash collision
            return 0, None
        self._entries.move_to_end(entry_id)
        kv = copy.deepcopy(entry.kv)
        kv.crop(num_tokens - kv.get_seq_length())  # a negative crop drops that many tokens
        self.num_hit_tokens += num_tokens
        return num_tokens, kv

    def insert(self, token_ids: Sequence[int], kv: Any) -> None:
        """Keep the KV of the block-aligned part of `token_ids` (whose KV `kv` holds, maybe with more
        tokens after them), unless the cache holds that prefix already."""
        hashes = block_hashes(token_ids, self.block_size)
        if not hashes or self.max_tokens < len(hashes) * self.block_size:
            return
        if hashes[-1] in self._by_hash:
            self._entries.move_to_end(self._by_hash[hashes[-1]])
            return
        num_tokens = len(hashes) * self.block_size
        kept = copy.deepcopy(kv)
        kept.crop(num_tokens - kept.get_seq_length())
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = _Entry(tuple(token_ids[:num_tokens]), kept, hashes)
        for block_hash in hashes:
            self._by_hash[block_hash] = entry_id  # the newest entry serves every prefix it holds
        self.num_tokens += num_tokens
        while self.num_tokens > self.max_tokens:
            self._evict_oldest()

    def clear(self) -> None:
        """Drop everything (the weights changed: every kept KV is stale)."""
        self._entries.clear()
        self._by_hash.clear()
        self.num_tokens = 0

    def _evict_oldest(self) -> None:
        entry_id, entry = self._entries.popitem(last=False)
        for block_hash in entry.hashes:
            if self._by_hash.get(block_hash) == entry_id:
                del self._by_hash[block_hash]
        self.num_tokens -= len(entry.token_ids)
