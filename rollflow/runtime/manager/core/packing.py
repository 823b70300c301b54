"""Finished samples -> micro-batches for a streaming trainer.

The unit of packing is a *group*: the n samples of one prompt. GRPO computes advantages
within a group, so a trainer that receives whole groups can compute rewards and advantages
per micro-batch, as they arrive, without waiting for the batch. A micro-batch holds between
`min_groups` and `max_groups` groups: `next()` blocks while fewer are ready (the dynamic
lower bound), `flush()` hands over whatever is ready, and the last micro-batch of a batch may
be smaller than the bound because nothing more will come.
"""

from __future__ import annotations

import asyncio
from collections import deque

from rollflow.runtime.deadline import within
from rollflow.runtime.manager.core.samples import Sample, SampleState


class BatchDeleted(Exception):
    """The batch was deleted while a caller waited for its groups; the message says so."""


class GroupPacker:
    def __init__(self, groups: list[list[Sample]]) -> None:
        self._groups = groups
        self._unfinished = [len(group) for group in groups]
        self._ready: deque[int] = deque()  # group indexes, in completion order
        self._delivered: set[int] = set()  # group indexes handed to the trainer
        self._changed = asyncio.Event()
        self.deleted: str | None = None  # why the batch went away, once it did

    def cancel(self, message: str) -> None:
        """The batch is gone: every waiting and later `next()` raises BatchDeleted(message)."""
        self.deleted = message
        self._changed.set()

    @property
    def num_groups(self) -> int:
        return len(self._groups)

    @property
    def exhausted(self) -> bool:
        """Every group has been handed to the trainer."""
        return len(self._delivered) == len(self._groups)

    def sample_done(self, sample: Sample) -> None:
        assert sample.state >= SampleState.FINISHED
        self._unfinished[sample.group_index] -= 1
        if self._unfinished[sample.group_index] == 0 and sample.group_index not in self._delivered:
            self._ready.append(sample.group_index)
            self._changed.set()

    async def next(self, min_groups: int, max_groups: int, timeout_s: float | None) -> list[list[Sample]]:
        """Wait until `min_groups` are ready (or all that remain are), then take up to `max_groups`.

        Returns an empty list on timeout, and once the batch is exhausted; raises BatchDeleted
        once the batch is deleted.
        """
        wanted = max(1, min(min_groups, len(self._groups) - len(self._delivered)))
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        while len(self._ready) < wanted and not self.exhausted:
            if self.deleted is not None:
                raise BatchDeleted(self.deleted)
            self._changed.clear()
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return []
            try:
                await within(self._changed.wait(), remaining)
            except TimeoutError:
                return []
        return self._take(max_groups)

    def mark_delivered(self, group_indexes: list[int]) -> None:
        """These groups were handed out already (by a manager before a restart), finished here or not:
        they are never handed out again."""
        self._delivered.update(group_indexes)
        self._ready = deque(index for index in self._ready if index not in self._delivered)

    def delivered(self, group_index: int) -> bool:
        return group_index in self._delivered

    def flush(self, max_groups: int | None = None) -> list[list[Sample]]:
        """Whatever groups are ready now, without waiting."""
        return self._take(max_groups if max_groups is not None else len(self._ready))

    def _take(self, max_groups: int) -> list[list[Sample]]:
        taken = []
        while self._ready and len(taken) < max_groups:
            index = self._ready.popleft()
            self._delivered.add(index)
            taken.append(self._groups[index])
        return taken
