"""The manager's journal: its state in SQLite (WAL mode), so a manager killed mid-batch restarts
where it was, and the tokens its engines generated are not generated again.

One writer thread owns the connection; the event loop never waits on disk, and pays per streamed
chunk a count and a mark of its sample, no lock, no copy. The loop notes what changed on its own (the
samples with new tokens; the latest row of each sample changed; other statements in order) and hands
it to the writer as one round (each marked sample's tokens past what it journaled taken from its own
lists then, once a round) every `journal_flush_interval_ms`, or as soon as half of
`journal_max_unflushed_tokens` has gathered; the writer commits what it was handed as one
transaction, a round's tokens as one row (journal_file.py). While more than
`journal_max_unflushed_tokens` tokens are not yet committed the manager's streams pause, which bounds
what a crash can lose. A round is handed at once, too, when a caller needs what it is about to
answer to be on disk first (`durable()`: a line of the sample stream, a micro-batch handed to a
client that does not keep the record of its hand-outs itself; one that does, as `ManagerClient`
does, is answered at once, see `RolloutManager.adopt_handouts`).

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
import contextlib
import itertools
import json
import logging
import operator
import sqlite3
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.durability.journal_events import NoJournal
from rollflow.runtime.manager.durability.journal_file import BATCH_TABLES, OWNED_TABLES, SESSION_OWNER, pack

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""While writes fail, the writer tries again this often (not at every round: each try redoes them all)..."""

RETRY_PAUSE = 10
"""...or, when a try takes long (a large backlog held), it waits this many times as long as the last
try took: retrying takes the process's CPU at most a tenth of the time, however much is held."""

REPORT_S = 5.0
"""While writes fail, the failure is logged again this often."""


def owner(sample: Sample) -> str | None:
    """Whose rows a sample's are: its batch's, its session's (the running turn), or none (a single
    `/generate` request, whose caller's connection ends with the manager anyway)."""
    if sample.batch_id is not None:
        return sample.batch_id
    return f"{SESSION_OWNER}{sample.session_id}#{sample.seq}" if sample.session_id is not None else None


@dataclass
class _Round:
    """What the loop hands the writer at once: all that changed since the last round, written in this
    order (a compaction of an owner's rows ends its round, so it comes after all it should delete)."""

    # the round's new tokens as runs (a run: one sample's tokens in one span), in flat lists
    sample_ids: list[str]  # each run's sample
    starts: array  # where in its sample's output the run starts
    counts: array  # its number of tokens
    spans: list[tuple]  # the runs that opened a span: (run index, attempt, engine id, url, version)
    token_ids: list[int]  # the runs' tokens, one run's after another
    logprobs: list[float]  # and their logprobs
    owners: set[str]  # the owners of the runs' samples
    rows: dict[str, tuple]  # sample id -> its row (`sample_values`), the latest
    attempts: dict[str, tuple | None]  # sample id -> its attempt running (owner, rid, url); None: ended
    ops: list[tuple[str, tuple]]  # other statements, in the order they were queued
    num_tokens: int  # tokens streamed in the round (the bound's count)
    waiters: list[asyncio.Future]  # durable() callers, answered once the round is committed

    def __bool__(self) -> bool:
        return bool(self.sample_ids or self.rows or self.attempts or self.ops or self.waiters)


STATE_NAMES = {state: state.name.lower() for state in SampleState}

# a round's rows of a table go in one statement, from one JSON array: the writer thread takes the GIL
# back after every statement SQLite runs, and while the loop is busy each time costs it the switch
# interval (5 ms): with a statement per row a commit took tens of milliseconds
SAMPLES_SQL = (  # rows as JSON arrays (`sample_values`), each kept as its body (journal_file.SAMPLE_FIELDS)
    "INSERT OR REPLACE INTO samples SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), value "
    "FROM json_each(?)"
)
ATTEMPTS_SQL = (
    "INSERT OR REPLACE INTO attempts SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]') FROM json_each(?)"
)
ATTEMPTS_ENDED_SQL = "DELETE FROM attempts WHERE sample_id IN (SELECT value FROM json_each(?))"
OWNERS_SQL = "INSERT INTO token_log_owners SELECT ?, value FROM json_each(?)"


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


@dataclass
class _Failure:
    """The writer's note of a failure that lasts (writer thread)."""

    since: float  # monotonic time of the first failed write
    num_errors: int = 0  # failed writes since
    reported_at: float = 0.0  # monotonic time of the last log line
    try_s: float = 0.0  # how long the last try took


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
        self._conn = conn
        self.path = path
        self._on_write = on_write
        self.error: str | None = None  # why the journal cannot write, while it cannot (loop)
        self._interval_s = flush_interval_ms / 1000
        self.max_unflushed_tokens = max_unflushed_tokens
        # a round is handed once half the bound has gathered, so that the bound itself (the streams'
        # pause) is reached only when the writer falls behind, not while a round waits for its time
        self._round_tokens = max(1, max_unflushed_tokens // 2)
        self._taken = 0  # tokens in rounds handed to the writer (loop)
        self._written = 0  # tokens committed (writer thread: the loop sees a commit at once)
        self._room = asyncio.Event()  # set while the streams may read on (see room())
        self._room.set()
        self.num_commits = 0
        # noted on the loop since the last round (the loop's alone)
        # samples with tokens past what they journaled (`Sample.journaled`), by id, in order
        self._dirty: dict[str, Sample] = {}
        self._rows: dict[str, tuple] = {}
        self._attempts: dict[str, tuple | None] = {}
        self._ops: list[tuple[str, tuple]] = []
        self._num_tokens = 0
        # a streamed chunk's only test: below `_limit` tokens in the round nothing else is due (the
        # round's timer is armed, the round is not half the bound, the bound is not reached); 0 while
        # no timer is armed, so the round's first tokens arm it (`_noted`)
        self._limit = 0
        self._waiters: list[asyncio.Future] = []
        self._next_round: asyncio.TimerHandle | asyncio.Handle | None = None
        self._soon = False  # the next round is due at once (a durable()), not at the interval
        # handed to the writer, under the lock (once per round)
        self._lock = threading.Condition()
        self._rounds: list[_Round] = []
        self._wake = False
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_forever, name="rollflow-journal", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Write what is queued and close the file."""
        if self._thread is None:
            return
        if self._next_round is not None:
            self._next_round.cancel()
            self._next_round = None
        self._hand(self._take())
        with self._lock:
            self._closing = True
            self._lock.notify()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._conn.close()

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
        return self._taken + self._num_tokens - self._written

    @property
    def full(self) -> bool:
        """More tokens than the bound wait to be written: streams should `await room()`."""
        return (
            self._taken + self._num_tokens - self._written >= self.max_unflushed_tokens and self.error is None
        )

    # ------------------------------------------------------------------ the manager's events

    def batch_submitted(self, batch_id: str, submission: dict, samples: list[Sample]) -> None:
        self.put("INSERT OR REPLACE INTO batches VALUES (?, ?)", (batch_id, json.dumps(submission)))
        for sample in samples:
            self.sample_changed(sample)

    def batch_offloaded(self, batch_id: str) -> None:
        self.put(
            "UPDATE batches SET body = json_set(body, '$.offloaded', json('true')) WHERE batch_id = ?",
            (batch_id,),
        )

    def batch_gone(self, batch_id: str) -> None:
        """Compaction: a delivered or deleted batch leaves nothing behind."""
        ops = [(f"DELETE FROM {table} WHERE batch_id = ?", (batch_id,)) for table in BATCH_TABLES]
        self._compact(*ops, *self._owner_gone(batch_id))

    def _compact(self, *ops: tuple[str, tuple]) -> None:
        """Deletes of an owner's rows end their round: what was noted before them is written before them
        (and deleted), what comes after them (a batch id submitted again) after them."""
        self._put(*ops)
        self._hand(self._take(), wake=False)  # the round's timer, still armed, wakes the writer

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
            self.max_unflushed_tokens - (self._taken - self._written)
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
        self.put(
            "INSERT OR REPLACE INTO handouts VALUES (?, ?, ?)", (batch_id, index, json.dumps(group_indexes))
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
        if self._thread is None or self.error is not None:
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
        while self.full and self._thread is not None:
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
        self._hand(self._take())

    def _take(self) -> _Round:
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
        taken = _Round(
            sample_ids,
            starts,
            counts,
            spans,
            token_ids,
            logprobs,
            owners,
            self._rows,
            self._attempts,
            self._ops,
            self._num_tokens,
            self._waiters,
        )
        self._dirty = {}
        self._taken += self._num_tokens
        self._rows, self._attempts, self._ops, self._num_tokens, self._waiters = {}, {}, [], 0, []
        self._limit = 0
        return taken

    def _hand(self, taken: _Round, wake: bool = True) -> None:
        with self._lock:
            if taken:
                self._rounds.append(taken)
            if wake and self._rounds:
                self._wake = True
                self._lock.notify()

    def _committed(self, rounds: list[_Round]) -> None:
        for done in rounds:
            for waiter in done.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if not self._room.is_set() and not self.full:
            self._room.set()

    # ------------------------------------------------------------------ writing (writer thread)

    def _write_forever(self) -> None:
        held: list[_Round] = []  # rounds handed and not committed, in order: the next commit's
        failure: _Failure | None = None  # while writes fail
        while True:
            with self._lock:
                if failure is None:
                    while not self._wake and not self._closing:
                        self._lock.wait()
                else:  # the next try at the retry interval (or at close), not at every round handed
                    retry_at = time.monotonic() + max(RETRY_S, RETRY_PAUSE * failure.try_s)
                    while not self._closing and (wait := retry_at - time.monotonic()) > 0:
                        self._lock.wait(wait)
                held += self._rounds
                self._rounds = []
                self._wake = False
                closing = self._closing
            started = time.monotonic()
            try:
                self._commit(held)
            except Exception as exc:  # a full disk, a file gone read-only: kept, and tried again
                self._rollback()
                failure = failure or _Failure(started)
                failure.try_s = time.monotonic() - started
                self._failed(failure, exc, held, closing)
                if closing:
                    return
                continue
            if failure is not None:
                log.warning(
                    "journal %s writes again after %.1fs; what it held meanwhile is written",
                    self.path,
                    time.monotonic() - failure.since,
                )
                failure = None
                self._loop.call_soon_threadsafe(self._write_state, None, [])
            self._loop.call_soon_threadsafe(self._committed, held)
            held = []
            if closing:
                return

    def _rollback(self) -> None:
        """End the failed transaction, if SQLite has not already, so that the next try starts clean."""
        if self._conn.in_transaction:  # (SQLite ends it on its own after some errors)
            with contextlib.suppress(sqlite3.Error):  # a rollback failing too: the next try says so
                self._conn.execute("ROLLBACK")

    def _failed(self, failure: _Failure, exc: Exception, held: list[_Round], closing: bool) -> None:
        """A failed write (writer thread): counted and said on the loop, logged at once the first time,
        then every REPORT_S, and at close with what is lost."""
        failure.num_errors += 1
        error = f"journal {self.path} cannot write ({exc})"
        tokens = sum(taken.num_tokens for taken in held)
        now = time.monotonic()
        if closing:
            log.error(
                "%s; closing with %d tokens and what changed since %.1fs ago not written",
                error,
                tokens,
                now - failure.since,
            )
        elif failure.num_errors == 1:
            log.error(
                "%s; new batches and sessions are refused until it can; what it cannot write is held in "
                "memory and written once it can (tried again every %gs, less often when much is held)",
                error,
                RETRY_S,
                exc_info=not isinstance(exc, sqlite3.Error),  # not SQLite's: a bug, with its traceback
            )
            failure.reported_at = now
        elif now - failure.reported_at >= REPORT_S:
            log.error(
                "%s, still, for %.0fs: %d writes failed; %d tokens held in memory",
                error,
                now - failure.since,
                failure.num_errors,
                tokens,
            )
            failure.reported_at = now
        waiters = [waiter for taken in held for waiter in taken.waiters]
        self._loop.call_soon_threadsafe(self._write_state, error, waiters)

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

    def _commit(self, rounds: list[_Round]) -> None:
        """All rounds handed since the last commit, in one transaction, each in its own order."""
        if not any(r.sample_ids or r.rows or r.attempts or r.ops for r in rounds):
            # tokens counted whose sample threw them away before its round: none left to write, but
            # counted as written all the same, or the bound would pause the streams for good
            self._written += sum(taken.num_tokens for taken in rounds)
            return
        conn = self._conn
        conn.execute("BEGIN")
        for taken in rounds:
            if taken.sample_ids:  # first: a compaction of the round takes its owner's tokens with it
                log_id = conn.execute(
                    "INSERT INTO token_log (sample_ids, spans, starts, counts, token_ids, logprobs) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        json.dumps(taken.sample_ids),
                        json.dumps(taken.spans),
                        pack("q", taken.starts),
                        pack("q", taken.counts),
                        pack("q", taken.token_ids),
                        pack("d", taken.logprobs),
                    ),
                ).lastrowid
                conn.execute(OWNERS_SQL, (log_id, json.dumps(list(taken.owners))))
            if taken.rows:
                conn.execute(SAMPLES_SQL, (json.dumps(list(taken.rows.values())),))
            started = [[sample_id, *attempt] for sample_id, attempt in taken.attempts.items() if attempt]
            if started:
                conn.execute(ATTEMPTS_SQL, (json.dumps(started),))
            ended = [sample_id for sample_id, attempt in taken.attempts.items() if attempt is None]
            if ended:
                conn.execute(ATTEMPTS_ENDED_SQL, (json.dumps(ended),))
            # a run of the same statement is one executemany: in order, so the same as one by one
            for sql, run in itertools.groupby(taken.ops, key=operator.itemgetter(0)):
                conn.executemany(sql, [params for _, params in run])
        conn.execute("COMMIT")
        self.num_commits += 1  # first: a count of tokens written never runs ahead of it
        self._written += sum(taken.num_tokens for taken in rounds)
