"""The trainer's batches: their samples by group, what was handed out, and why deleted ones went."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rollflow.runtime.manager.core.packing import GroupPacker
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.durability.journal_events import NoJournal
from rollflow.runtime.wire.base import SamplingParams

log = logging.getLogger(__name__)

DELETED_BATCHES_KEPT = 1024  # deleted batch ids remembered, each with the message of its deletion


def sample_sampling(sampling: SamplingParams, group: int, index: int) -> SamplingParams:
    """A batch's seed made one per sample (the samples of a group must differ), derived from the seed
    and the sample's place in the batch, so a batch submitted twice draws the same samples."""
    if sampling.seed is None:
        return sampling
    digest = hashlib.blake2b(f"{sampling.seed}:{group}:{index}".encode(), digest_size=8).digest()
    return dataclasses.replace(sampling, seed=int.from_bytes(digest, "little"))


@dataclass
class Batch:
    batch_id: str
    groups: list[list[Sample]]
    packer: GroupPacker
    budget_s: float | None  # local time budget; None when offloading is off
    offloaded: bool = False
    completed: list[Sample] = field(default_factory=list)  # samples in completion order
    deleted: str | None = None  # why the batch went away (DELETE /batches/{id}), once it did
    handouts: list[list[int]] = field(default_factory=list)  # group indexes of each micro-batch handed out
    _waiters: list[asyncio.Future] = field(default_factory=list)

    @classmethod
    def of_prompts(
        cls,
        batch_id: str,
        prompts: list[list[int]],
        n: int,
        budget_s: float | None,
        make_sample: Callable[[str, list[int], int, int], Sample],
    ) -> Batch:
        """`n` samples per prompt, each made by `make_sample(sample_id, prompt, group, index)` (a new
        one, or one restored from the journal); the ids are the same whichever."""
        groups = [
            [make_sample(f"{batch_id}-{g}-{i}", prompt, g, i) for i in range(n)]
            for g, prompt in enumerate(prompts)
        ]
        return cls(batch_id, groups, GroupPacker(groups), budget_s)

    def changed(self) -> asyncio.Future:
        """A future that completes at the next change (a sample done, the batch deleted).

        Each caller takes its own before reading the batch, so a change that lands while it
        reads or writes is never lost (as a shared event cleared after reading would lose it).
        """
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def samples(self) -> list[Sample]:
        return [sample for group in self.groups for sample in group]

    @property
    def done(self) -> bool:
        return len(self.completed) == sum(len(group) for group in self.groups)

    def sample_completed(self, sample: Sample) -> int:
        """Note one of the batch's samples done; its place in completion order."""
        self.completed.append(sample)
        self.packer.sample_done(sample)
        self.notify()
        return len(self.completed) - 1

    def hand_out(self, groups: list[list[Sample]]) -> list[int]:
        """Note a micro-batch of `groups` handed to the trainer: the group indexes it holds."""
        self.handouts.append([group[0].group_index for group in groups])
        return self.handouts[-1]

    def adopt_handouts(self, received: list[list[int]]) -> list[list[int]]:
        """Take the client's word for the micro-batches it holds beyond those noted here (handed out
        by a manager that died before journaling them): the new ones, noted. ValueError when
        `received` contradicts what was handed out (another client took them, or a wrong batch)."""
        known = self.handouts
        if received[: len(known)] != known[: len(received)]:
            raise ValueError(
                f"received does not match the micro-batches of batch {self.batch_id} handed out so far"
            )
        new = [list(handout) for handout in received[len(known) :]]
        if not new:
            return new
        indexes = [index for handout in new for index in handout]
        if not all(new) or len(set(indexes)) != len(indexes):
            raise ValueError("received holds an empty micro-batch or a group twice")
        for index in indexes:
            if not 0 <= index < len(self.groups) or self.packer.delivered(index):
                raise ValueError(
                    f"received holds group {index}: batch {self.batch_id} has no such group, or "
                    "handed it out in another micro-batch"
                )
        known.extend(new)
        self.packer.mark_delivered(indexes)
        return new

    def status(self) -> dict:
        states = {state.name.lower(): 0 for state in SampleState}
        for sample in self.samples:
            states[sample.state.name.lower()] += 1
        return {
            "batch_id": self.batch_id,
            "num_groups": len(self.groups),
            "num_samples": sum(len(group) for group in self.groups),
            "states": states,
            "offloaded": self.offloaded,
            "budget_s": self.budget_s,
        }


class BatchBook:
    """The batches the manager holds for the trainer, and why the latest deleted ones went: a `/next`
    or a stream that reaches the manager just after its batch's DELETE (a race of two of the
    trainer's own calls) is told so."""

    def __init__(self) -> None:
        self._batches: dict[str, Batch] = {}
        self._deleted: OrderedDict[str, str] = OrderedDict()
        self.journal: NoJournal = NoJournal()  # the manager's (`use_journal`): hand-outs are journaled

    async def hand_out(self, batch: Batch, groups: list[list[Sample]], client_keeps: bool = False) -> None:
        """Note a micro-batch handed to the trainer, so that a restarted manager never hands those
        groups out again. With a journal it is on disk before the trainer hears of it, unless the
        client keeps the record itself (`client_keeps`: it sends the hand-outs it holds with its next
        call, see `adopt_handouts`); then it rides the journal's next flush."""
        if not groups:
            return
        handout = batch.hand_out(groups)
        self.journal.handed_out(batch.batch_id, len(batch.handouts) - 1, handout)
        if not client_keeps:
            await self.journal.durable()

    def adopt_handouts(self, batch: Batch, received: list[list[int]]) -> None:
        """Take the client's word for the micro-batches it holds beyond those this manager knows of
        (`Batch.adopt_handouts`), and journal them."""
        first = len(batch.handouts)
        new = batch.adopt_handouts(received)
        for index, handout in enumerate(new, start=first):
            self.journal.handed_out(batch.batch_id, index, handout)
        if new:
            log.info(
                "batch %s: %d micro-batches the client holds were handed out before a restart, not journaled",
                batch.batch_id,
                len(new),
            )

    def get(self, batch_id: str | None) -> Batch | None:
        return self._batches.get(batch_id) if batch_id is not None else None

    def __iter__(self) -> Iterator[Batch]:
        return iter(self._batches.values())

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, batch: Batch) -> None:
        """Hold a new batch (an id used again names the new batch, not a deleted one)."""
        self._deleted.pop(batch.batch_id, None)
        self._batches[batch.batch_id] = batch

    def remove(self, batch_id: str, deleted: str | None = None) -> Batch:
        """Drop a batch; `deleted` says why one was dropped unfinished: its waiting `next` calls and
        sample streams end with that message."""
        batch = self._batches.pop(batch_id)
        if deleted is not None:
            batch.deleted = deleted
            batch.packer.cancel(deleted)
            batch.notify()
            self._deleted[batch_id] = deleted
            if len(self._deleted) > DELETED_BATCHES_KEPT:
                self._deleted.popitem(last=False)
        return batch

    def why_deleted(self, batch_id: str) -> str | None:
        """The message of a recently deleted batch's deletion."""
        return self._deleted.get(batch_id)

    def samples(self) -> Iterator[Sample]:
        return (sample for batch in self._batches.values() for sample in batch.samples)
