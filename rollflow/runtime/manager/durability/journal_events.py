"""What the manager tells its journal, as one interface: `NoJournal` hears every change and keeps
none (a manager without `journal:`); `Journal` overrides each method to keep it. The manager holds
one or the other and tells it every change, so no change site tests whether a journal exists, and
one that forgets to tell it is as visible with a journal as without."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollflow.runtime.manager.core.samples import Sample


class NoJournal:
    enabled = False  # changes are kept: a restart restores them
    error: str | None = None  # why the journal cannot write, while it cannot
    unflushed_tokens = 0  # tokens received and not yet committed: what a crash now would lose

    def start(self) -> None:
        """Start writing (in the running loop)."""

    async def close(self) -> None:
        """Write what is queued and close the file."""

    def batch_submitted(self, batch_id: str, submission: dict, samples: list[Sample]) -> None: ...

    def batch_offloaded(self, batch_id: str) -> None: ...

    def batch_gone(self, batch_id: str) -> None:
        """A delivered or deleted batch: it leaves nothing behind."""

    def sample_changed(self, sample: Sample, completed: int | None = None) -> None:
        """A sample's state changed (`completed`: its place in its batch's completion order)."""

    def tokens(self, sample: Sample, num_tokens: int, ended: bool) -> bool:
        """`sample` just recorded `num_tokens` tokens (`ended`: its attempt ends with them); True when
        more tokens than the journal's bound wait to be written (the stream then awaits `room`)."""
        return False

    def output_discarded(self, sample: Sample) -> None:
        """A restart-from-prompt resume dropped the sample's tokens."""

    def attempt_started(self, sample: Sample, rid: str, engine_url: str) -> None: ...

    def attempt_ended(self, sample: Sample) -> None: ...

    def handed_out(self, batch_id: str, index: int, group_indexes: list[int]) -> None:
        """A micro-batch of the batch's groups went to the trainer: a restart never hands them out again."""

    def engine_registered(self, url: str, record: dict) -> None: ...

    def engine_removed(self, url: str) -> None: ...

    def session_changed(self, session_id: str, row: dict, running: Sample | None = None) -> None:
        """A session opened, closed, or is starting a turn (`running`: the turn's sample)."""

    def turn_ended(
        self, session_id: str, row: dict, sample: Sample, index: int | None = None, turn: dict | None = None
    ) -> None:
        """A session's running turn ended: finished (`turn`, the `index`th, joins its context) or not."""

    def session_forgotten(self, session_id: str) -> None:
        """A closed session dropped from the manager's memory."""

    def set_state(self, key: str, value: Any) -> None:
        """One of the manager's counters (step reports, the next engine id)."""

    async def durable(self) -> None:
        """Return once everything noted so far is committed."""

    def flush_soon(self) -> None:
        """Start writing what was noted now, not at the next interval."""

    async def room(self) -> None:
        """Wait while more tokens than the bound are unwritten."""
