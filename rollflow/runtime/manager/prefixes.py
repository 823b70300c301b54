"""What each engine probably caches: the manager's own record of the prompts it sent where.

Engines do not say which prefixes they hold, so the manager keeps, per engine, the last prompt it
sent there under each prefix key (a GRPO group: the samples of one prompt; a single request: its
first tokens, so the turns of a session or requests sharing a system prompt meet) and reads a
request's cached tokens off it as the common prefix with that prompt, as sgl-router's cache-aware
policy approximates each worker's radix tree. The record forgets the oldest keys past
`max_keys`, as an engine's cache evicts.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

KEY_TOKENS = 64  # a single request's key: its first this many prompt tokens
MAX_KEYS = 4096


def prefix_key(batch_id: str | None, group_index: int, prompt_ids: Sequence[int]) -> int:
    """A positive key (0 means none) stable across processes: the group of a batch sample, else
    the start of the prompt."""
    source = (
        f"{batch_id}/{group_index}" if batch_id is not None else ",".join(map(str, prompt_ids[:KEY_TOKENS]))
    )
    return int.from_bytes(hashlib.blake2b(source.encode(), digest_size=8).digest(), "big") >> 1 or 1


class PrefixRecord:
    """One engine's record: prefix key -> the prompt last sent there under it."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._prompts: OrderedDict[int, Sequence[int]] = OrderedDict()

    def sent(self, key: int, prompt_ids: Sequence[int]) -> None:
        self._prompts[key] = prompt_ids
        self._prompts.move_to_end(key)
        if len(self._prompts) > self.max_keys:
            self._prompts.popitem(last=False)

    def cached_tokens(self, key: int, prompt_ids: Sequence[int]) -> int:
        """Tokens of `prompt_ids` the engine probably holds: the common prefix with what was sent
        under `key`."""
        sent = self._prompts.get(key)
        if sent is None:
            return 0
        common = 0
        for a, b in zip(sent, prompt_ids, strict=False):
            if a != b:
                break
            common += 1
        return common
