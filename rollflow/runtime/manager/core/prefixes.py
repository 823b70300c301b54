"""What each engine probably caches: the manager's own record of the tokens it sent where.

Engines do not say which prefixes they hold, so the manager records, per engine, the blocks of
every prompt it sent there and of every answer that came back (SGLang's radix cache and vLLM's
prefix caching keep generated tokens too), as chained block hashes the way vLLM names its KV
blocks: a request's cached tokens on an engine are its leading blocks found there. This is the
approximate radix tree of sgl-router's cache-aware policy, kept as a flat set: a system prompt
shared by many groups is found on every engine that served one, and turn k of an agent's session
finds turn k-1's whole context on the engine that answered it. The record forgets the least
recently sent blocks past `max_blocks`, as an engine's cache evicts.

A request's prefix key says which requests belong together: a batch sample's is its GRPO group
(or its session), a single request's is its whole prompt, so only identical prompts (the n samples
of a group sent one by one, as slime sends them) share one.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from rollflow.token_blocks import block_hashes

BLOCK_TOKENS = 16  # as the built-in engine's prefix cache and vLLM's default block
MAX_BLOCKS = 1 << 16  # per engine: a million tokens of prompts and answers


def prefix_key(group: str | None, group_index: int, prompt_ids: Sequence[int]) -> int:
    """A positive key (0 means none) stable across processes: the group of a batch sample (or its
    session), else the whole prompt."""
    source = f"{group}/{group_index}".encode() if group is not None else array("q", prompt_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(source, digest_size=8).digest(), "big") >> 1 or 1


def session_key(session_id: str) -> int:
    """The prefix key of a session's requests: the one every turn of it is routed by."""
    return prefix_key(f"session/{session_id}", 0, ())


class PrefixRecord:
    """One engine's record: the block hashes of what was sent there, least recently sent first."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def sent(self, token_ids: Sequence[int]) -> None:
        """The engine computed (or will compute) these tokens' KV: it holds their whole blocks."""
        blocks = self._blocks
        for block_hash in block_hashes(token_ids, BLOCK_TOKENS):
            blocks[block_hash] = None
            blocks.move_to_end(block_hash)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def cached_tokens(self, hashes: Sequence[int]) -> int:
        """Tokens of a prompt (given by its `block_hashes`) the engine probably holds."""
        found = 0
        for block_hash in hashes:
            if block_hash not in self._blocks:
                break
            found += 1
        return found * BLOCK_TOKENS
