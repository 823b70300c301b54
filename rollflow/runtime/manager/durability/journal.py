"""The manager's journal: its state in SQLite (WAL mode), so a manager killed mid-batch restarts
where it was, and the tokens its engines generated are not generated again.

One writer thread owns the connection; the event loop never waits on disk, and pays per streamed
chunk a count and a mark of its sample, no lock, no copy. The loop notes what changed on its own (the
samples with new tokens; the latest row of each sample changed; other statements in order) and hands
it to the writer as one round (each marked sample's tokens past what it journaled taken from its own
lists then, once a round) every `journal_flush_interval_ms`, or as soon as half of
`journal_max_unflushed_tokens` has gathered; the writer commits what it was handed as one
transaction, a round's tokens as one row (journal_file.py; the writer is journal_writer.py). While more than
`journal_max_unflushed_tokens` tokens are not yet committed the manager's streams pause, which bounds
what a crash can lose. A round is handed at once, too, when a caller needs what it is about to
answer to be on disk first (`durable()`: a line of the sample stream, a micro-batch handed to a
client that does not keep the record of its hand-outs itself; one that does, as `ManagerClient`
does, is answered at once, see `BatchBook.adopt_handouts`).

A batch delivered or deleted within the round it was submitted in is dropped from that round, not
written and then deleted (`batch_gone`): the file is the same after the round, and a crash before it
loses what it would have lost anyway (none of the batch was committed). A small batch served within one
flush interval costs the writer nothing.

Sessions (sessions.py) are journaled beside batches: a row per session (its pin, whether it is
closed, the turn it is running), a row per finished turn (its input and its output with spans), and
the running turn's sample as a batch's samples are (its rows owned by `session:<id>#<seq>`,
compacted once the turn ends). A session's open and close, and every turn's answer, are on disk before the caller
hears of them, so a caller never holds a context the journal does not.

A crash loses only what was not yet committed; SQLite's WAL replays to the last whole transaction,
so a journal cut off mid-write (power loss, a truncated WAL) opens at its last commit.

A write that fails (a full disk, a file gone read-only) loses nothing and stops nothing already running:
the writer keeps the rounds it could not commit, in order, and tries them again, all of them in one
transaction, every `RETRY_S` (or longer, see `RETRY_PAUSE`) until one commits, so the file stays a prefix of what the manager noted
and never holds a gap. Meanwhile `error` names the failure (the manager answers `/health` and new
batches and sessions with 503 naming it), the streams do not wait on the bound (what they receive is
held in memory instead), `durable()` does not wait (a caller is answered as without a journal), and the
failure is logged again every `REPORT_S` while it lasts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from array import array
from collections.abc import Callable
from typing import Any

from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.durability.journal_events import NoJournal
from rollflow.runtime.manager.durability.journal_file import BATCH_TABLES, OWNED_TABLES, SESSION_OWNER
from rollflow.runtime.manager.durability.journal_writer import BATCH_SQL, JournalWriter, Round

log = logging.getLogger(__name__)


def owner(sample: Sample) -> str | None:
    """Whose rows a sample's are: its batch's, its session's (the running turn), or none (a single
    `/generate` request, whose caller's connection ends with the manager anyway)."""
    if sample.batch_id is not None:
        return sample.batch_id
    return f"{SESSION_OWNER}{sample.session_id}#{sample.seq}" if sample.session_id is not None else None


STATE_NAMES = {state: state.name.lower() for state in SampleState}


def sample_values(sample: Sample, name: str | None, completed: int | None = None) -> tuple:
    """A sample's row as plain values, taken on the loop: its id, owner, then `SAMPLE_FIELDS` (sent
    as JSON, and kept as it was sent: building an object of it took SQLite twice as long)."""
    return (
        sample.sample_id,
        name,
        sample.seq,
        sample.group_index,
        STATE_NAMES[sample.state],
        sample.finish_reason,
        sample.error,
        sample.attempts,
        sample.resumes,
        sample.request_failures,
        sample.regenerated_tokens,
        completed,
    )


class Journal(NoJournal):
    """The loop's side of the writer. Its methods run on the event loop and only note what changed (no
    lock, no disk, no JSON for a streamed chunk); `durable` and `room` await the writer without
    blocking the loop."""

    enabled = True

    def __init__(
        self,
        conn: sqlite3.Connection,
        flush_interval_ms: int,
        max_unflushed_tokens: int,
        path: str = "",
        on_write: Callable[[str | None], None] = lambda error: None,
    ) -> None:
        """`on_write` is called on the loop after every failed write with its error, and once with None
        when writes succeed again (the manager's metrics)."""
        self.path = path
        self._on_write = on_write
        self.error: str | None = None  # why the journal cannot write, while it cannot (loop)
        self._interval_s = flush_interval_ms / 1000
        self.max_unflushed_tokens = max_unflushed_tokens
        # a round is handed once half the bound has gathered, so that the bound itself (the streams'
        # pause) is reached only when the writer falls behind, not while a round waits for its time
        self._round_tokens = max(1, max_unflushed_tokens // 2)
        self._taken = 0  # tokens in rounds handed to the writer (loop)
        self._room = asyncio.Event()  # set while the streams may read on (see room())
        self._room.set()
        # noted on the loop since the last round (the loop's alone)
        # samples with tokens past what they journaled (`Sample.journaled`), by id, in order
        self._dirty: dict[str, Sample] = {}
        self._rows: dict[str, tuple] = {}
        self._attempts: dict[str, tuple | None] = {}
        self._ops: list[tuple[str, tuple]] = []
        # batches submitted since the last round was taken, nothing of theirs handed to the writer yet:
        # batch id -> its submission (encoded once the round is taken), its own statements since (held
        # apart until then) and its samples, so that a batch gone before its first round costs no
        # encoding, leaves nothing to write and nothing to delete (`batch_gone`)
        self._fresh: dict[str, tuple[dict, list[tuple[str, tuple]], list[Sample]]] = {}
        self._num_tokens = 0
        # a streamed chunk's only test: below `_limit` tokens in the round nothing else is due (the
        # round's timer is armed, the round is not half the bound, the bound is not reached); 0 while
        # no timer is armed, so the round's first tokens arm it (`_noted`)
        self._limit = 0
        self._waiters: list[asyncio.Future] = []
        self._next_round: asyncio.TimerHandle | asyncio.Handle | None = None
        self._soon = False  # the next round is due at once (a durable()), not at the interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer = JournalWriter(conn, path, self._committed, self._write_state)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._writer.start(self._loop)

    async def close(self) -> None:
        """Write what is queued and close the file."""
        if not self._writer.running:
            return
        if self._next_round is not None:
            self._next_round.cancel()
            self._next_round = None
        self._writer.hand(self._take())
        await self._writer.close()

    @property
    def num_commits(self) -> int:
        """Transactions committed so far."""
        return self._writer.num_commits

    # ------------------------------------------------------------------ noting (loop thread)

    def _put(self, *ops: tuple[str, tuple]) -> None:
        self._ops.extend(ops)
        if self._next_round is None:
            self._arm()

    def put(self, sql: str, params: tuple = ()) -> None:
        self._put((sql, params))

    @property
    def unflushed_tokens(self) -> int:
        """Tokens received and not yet committed: what a crash now would lose."""
        return self._taken + self._num_tokens - self._writer.written

    @property
    def full(self) -> bool:
        """More tokens than the bound wait to be written: streams should `await room()`."""
        return (
            self._taken + self._num_tokens - self._writer.written >= self.max_unflushed_tokens
            and self.error is None
        )

    # ------------------------------------------------------------------ the manager's events

    def batch_submitted(self, batch_id: str, submission: dict, samples: list[Sample]) -> None:
        self._fresh[batch_id] = (submission, [], samples)
        for sample in samples:
            self.sample_changed(sample)
        if self._next_round is None:
            self._arm()

    def _put_batch(self, batch_id: str, sql: str, params: tuple) -> None:
        """A statement of one batch's rows: held with the batch while it is fresh (see `batch_gone`)."""
        fresh = self._fresh.get(batch_id)
        if fresh is None:
            self.put(sql, params)
        else:
            fresh[1].append((sql, params))

    def batch_offloaded(self, batch_id: str) -> None:
        self._put_batch(
            batch_id,
            "UPDATE batches SET body = json_set(body, '$.offloaded', json('true')) WHERE batch_id = ?",
            (batch_id,),
        )

    def batch_gone(self, batch_id: str) -> None:
        """Compaction: a delivered or deleted batch leaves nothing behind. A batch gone within the round
        it was submitted in (a small batch served within one flush interval) never reaches the disk:
        what was noted of it is dropped, and there is nothing to delete. A crash meanwhile loses the same
        as without it (none of the batch was committed), and after the round the file is the same."""
        fresh = self._fresh.pop(batch_id, None)
        if fresh is not None:
            for sample in fresh[2]:
                self._rows.pop(sample.sample_id, None)
                self._attempts.pop(sample.sample_id, None)
                self._dirty.pop(sample.sample_id, None)  # its tokens stay counted: written with the round
            return
        ops = [(f"DELETE FROM {table} WHERE batch_id = ?", (batch_id,)) for table in BATCH_TABLES]
        self._compact(*ops, *self._owner_gone(batch_id))

    def _compact(self, *ops: tuple[str, tuple]) -> None:
        """Deletes of an owner's rows end their round: what was noted before them is written before them
        (and deleted), what comes after them (a batch id submitted again) after them."""
        self._put(*ops)
        self._writer.hand(self._take(), wake=False)  # the round's timer, still armed, wakes the writer

    @staticmethod
    def _owner_gone(name: str) -> list[tuple[str, tuple]]:
        ops = [(f"DELETE FROM {table} WHERE owner = ?", (name,)) for table in OWNED_TABLES]
        ops.append(("DELETE FROM token_log WHERE id NOT IN (SELECT log_id FROM token_log_owners)", ()))
        return ops

    def sample_changed(self, sample: Sample, completed: int | None = None) -> None:
        """Its row is written as it is at the next round (the latest change of a round wins)."""
        name = owner(sample)
        if name is None:
            return
        self._rows[sample.sample_id] = sample_values(sample, name, completed)
        if self._next_round is None:
            self._arm()

    def tokens(self, sample: Sample, num_tokens: int, ended: bool) -> bool:
        """`sample` just recorded `num_tokens` tokens; `ended`: its attempt ends with them (its finish
        reason goes in their round, so a restart never resumes a sample that had finished). Returns
        `full`: the stream should `await room()`. Called for every chunk every engine streams, so it
        only counts and marks the sample, and tests one count: the round takes the sample's tokens
        past what it journaled from its own lists, once per round (`_take`)."""
        if sample.batch_id is None and sample.session_id is None:
            return False  # a single /generate request
        if ended:
            self.sample_changed(sample)
        if not num_tokens:
            return False
        self._dirty[sample.sample_id] = sample
        self._num_tokens += num_tokens
        return self._num_tokens >= self._limit and self._noted()

    def _noted(self) -> bool:
        """`tokens` at its limit: arm the round's timer, hand the round at half the bound, say whether
        the bound is reached; else the next limit (a commit meanwhile only leaves it low: this again)."""
        if self._num_tokens >= self._round_tokens:
            self._end_round()  # the limit is 0 again: the next tokens arm the next round's timer
            return self.full
        if self._next_round is None:
            self._arm()
        if self.full:
            return True
        # (while writes fail the bound is off: the round's size alone hands it)
        room = (
            self.max_unflushed_tokens - (self._taken - self._writer.written)
            if self.error is None
            else self._round_tokens
        )
        self._limit = min(self._round_tokens, room)
        return False

    def output_discarded(self, sample: Sample) -> None:
        # the token log is append-only: the sample's next tokens, from 0 again, replace these at restore
        sample.journaled = 0
        self.sample_changed(sample)

    def attempt_started(self, sample: Sample, rid: str, engine_url: str) -> None:
        name = owner(sample)
        if name is None:
            return
        self._attempts[sample.sample_id] = (name, rid, engine_url)
        self.sample_changed(sample)

    def attempt_ended(self, sample: Sample) -> None:
        if owner(sample) is None:
            return
        self._attempts[sample.sample_id] = None
        if self._next_round is None:
            self._arm()

    def handed_out(self, batch_id: str, index: int, group_indexes: list[int]) -> None:
        self._put_batch(
            batch_id,
            "INSERT OR REPLACE INTO handouts VALUES (?, ?, ?)",
            (batch_id, index, json.dumps(group_indexes)),
        )

    def engine_registered(self, url: str, record: dict) -> None:
        self.put("INSERT OR REPLACE INTO engines VALUES (?, ?)", (url, json.dumps(record)))

    def engine_removed(self, url: str) -> None:
        self.put("DELETE FROM engines WHERE url = ?", (url,))

    def session_changed(self, session_id: str, row: dict, running: Sample | None = None) -> None:
        """A session opened, closed, or starting a turn (`running`: the turn's sample, journaled as a
        batch's sample is from here on)."""
        self.put("INSERT OR REPLACE INTO sessions VALUES (?, ?)", (session_id, json.dumps(row)))
        if running is not None:
            self.sample_changed(running)

    def turn_ended(
        self, session_id: str, row: dict, sample: Sample, index: int | None = None, turn: dict | None = None
    ) -> None:
        """A session's running turn (`sample`) ended: finished (`turn`, the `index`th, joins its
        context) or not; either way its sample's rows go, in the same transaction."""
        ops = [("INSERT OR REPLACE INTO sessions VALUES (?, ?)", (session_id, json.dumps(row)))]
        if turn is not None:
            ops.append(
                (
                    "INSERT OR REPLACE INTO session_turns VALUES (?, ?, ?)",
                    (session_id, index, json.dumps(turn)),
                )
            )
        self._compact(*ops, *self._owner_gone(owner(sample)))

    def session_forgotten(self, session_id: str) -> None:
        """A closed session dropped from the manager's memory: from the journal too."""
        self._put(
            ("DELETE FROM sessions WHERE session_id = ?", (session_id,)),
            ("DELETE FROM session_turns WHERE session_id = ?", (session_id,)),
        )

    def set_state(self, key: str, value: Any) -> None:
        self.put("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, json.dumps(value)))

    async def durable(self) -> None:
        """Return once everything noted so far is committed (at once while writes fail)."""
        if not self._writer.running or self.error is not None:
            return
        # a round of its own even when nothing is noted: what the writer is committing now is durable
        # only once that commit ends, and rounds are committed one after another
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        self._round_soon()
        await waiter

    def flush_soon(self) -> None:
        """Start a round now, not waiting for it: for what should reach the disk before the next
        interval though no caller waits on it (a turn cancelled by its caller's going away)."""
        self._round_soon()

    async def room(self) -> None:
        """Wait while more tokens than the bound are unwritten: the streams' back-pressure (all of
        them wait on one event, set by the commit that makes room)."""
        while self.full and self._writer.running:
            if self._room.is_set():
                self._room.clear()
                self._end_round()  # what waits goes now, not at the interval
            await self._room.wait()

    # ------------------------------------------------------------------ rounds (loop thread)

    def _arm(self) -> None:
        self._next_round = self._loop.call_later(self._interval_s, self._end_round)

    def _round_soon(self) -> None:
        if self._soon:
            return  # callers in one pass of the loop share a round
        if self._next_round is not None:
            self._next_round.cancel()
        self._next_round = self._loop.call_soon(self._end_round)
        self._soon = True

    def _end_round(self) -> None:
        if self._next_round is not None:
            self._next_round.cancel()  # (a no-op when it is what runs this)
            self._next_round = None
        self._soon = False
        self._writer.hand(self._take())

    def _take(self) -> Round:
        """What was noted since the last round, as a round; the loop starts noting afresh. Each marked
        sample's new tokens are taken from its own lists here, a run per span they fall in: once per
        sample a round, not once per streamed chunk. With many samples streaming a round holds only a
        few tokens of each, so the common case (all of them in the span the last round left open) takes
        no more than a run's three appends and the two slices."""
        sample_ids: list[str] = []
        starts, counts = array("q"), array("q")
        spans: list[tuple] = []
        token_ids: list[int] = []
        logprobs: list[float] = []
        owners: set[str] = set()
        add_id, add_start, add_count = sample_ids.append, starts.append, counts.append
        for sample in self._dirty.values():
            first = sample.journaled
            output_ids = sample.output_ids
            end = len(output_ids)
            if end <= first:
                continue  # thrown away (`resume: restart`) since it was marked
            sample_spans = sample.spans
            if sample_spans[-1].start < first:  # all of them in the last span, opened by an earlier run
                add_id(sample.sample_id)
                add_start(first)
                add_count(end - first)
            else:
                index = len(sample_spans) - 1
                while index > 0 and sample_spans[index].start > first:
                    index -= 1  # the span the new tokens begin in
                for span in sample_spans[index:]:
                    start = max(span.start, first)
                    if start == span.start:  # the run opens its span: the rest of it runs in the same
                        spans.append(
                            (
                                len(sample_ids),
                                span.attempt,
                                span.engine_id,
                                span.engine_url,
                                span.weight_version,
                            )
                        )
                    add_id(sample.sample_id)
                    add_start(start)
                    add_count(span.end - start)
            token_ids += output_ids[first:end]
            logprobs += sample.output_logprobs[first:end]
            batch_id = sample.batch_id
            owners.add(batch_id if batch_id is not None else owner(sample))
            sample.journaled = end
        ops = self._ops
        if self._fresh:  # the fresh batches' statements first: nothing noted before them touches their rows
            fresh = []
            for batch_id, (submission, statements, _) in self._fresh.items():
                fresh.append((BATCH_SQL, (batch_id, json.dumps(submission))))
                fresh += statements
            ops = fresh + ops
            self._fresh = {}
        taken = Round(
            sample_ids,
            starts,
            counts,
            spans,
            token_ids,
            logprobs,
            owners,
            self._rows,
            self._attempts,
            ops,
            self._num_tokens,
            self._waiters,
        )
        self._dirty = {}
        self._taken += self._num_tokens
        self._rows, self._attempts, self._ops, self._num_tokens, self._waiters = {}, {}, [], 0, []
        self._limit = 0
        return taken

    def _committed(self, rounds: list[Round]) -> None:
        for done in rounds:
            for waiter in done.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if not self._room.is_set() and not self.full:
            self._room.set()

    def _write_state(self, error: str | None, waiters: list[asyncio.Future]) -> None:
        """On the loop: a write failed (`error`) or writes succeed again (None). A failure answers the
        `durable()` callers of the rounds held and lets the streams waiting for room read on."""
        self.error = error
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if error is not None:
            self._room.set()
        self._on_write(error)
