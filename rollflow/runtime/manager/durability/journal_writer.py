"""The journal's writer thread: it owns the SQLite connection and commits what the loop hands it
(journal.py notes it, a round at a time), everything handed since its last commit as one
transaction, a round's tokens as one row (journal_file.py).

A write that fails (a full disk, a file gone read-only) loses nothing: the writer keeps the rounds it
could not commit, in order, and tries them again, all of them in one transaction, every `RETRY_S` (or
longer, see `RETRY_PAUSE`) until one commits, so the file stays a prefix of what the manager noted
and never holds a gap; the failure is logged again every `REPORT_S` while it lasts. The loop hears of
each commit and of each failure through the two callbacks it gives the writer.
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

from rollflow.runtime.manager.durability.journal_file import pack

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""While writes fail, the writer tries again this often (not at every round: each try redoes them all)..."""

RETRY_PAUSE = 10
"""...or, when a try takes long (a large backlog held), it waits this many times as long as the last
try took: retrying takes the process's CPU at most a tenth of the time, however much is held."""

REPORT_S = 5.0
"""While writes fail, the failure is logged again this often."""


@dataclass
class Round:
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
        # a round of tokens alone (their batch gone before its first round) is handed too: the writer
        # counts them written, or the bound would hold them for good
        return bool(
            self.sample_ids or self.rows or self.attempts or self.ops or self.waiters or self.num_tokens
        )


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
BATCH_SQL = "INSERT OR REPLACE INTO batches VALUES (?, ?)"


@dataclass
class _Failure:
    """The writer's note of a failure that lasts (writer thread)."""

    since: float  # monotonic time of the first failed write
    num_errors: int = 0  # failed writes since
    reported_at: float = 0.0  # monotonic time of the last log line
    try_s: float = 0.0  # how long the last try took


class JournalWriter:
    """The writer thread and its hand-off: rounds are handed under the lock (once per round, from the
    loop), committed off the loop; `committed(rounds)` and `state(error, waiters)` are called on the
    loop after each commit and each failed or recovered write."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        committed: Callable[[list[Round]], None],
        state: Callable[[str | None, list[asyncio.Future]], None],
    ) -> None:
        self._conn = conn
        self.path = path
        self._committed = committed
        self._write_state = state
        self.written = 0  # tokens committed (writer thread: the loop sees a commit at once)
        self.num_commits = 0
        self._lock = threading.Condition()
        self._rounds: list[Round] = []
        self._wake = False
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._write_forever, name="rollflow-journal", daemon=True)
        self._thread.start()

    def hand(self, taken: Round, wake: bool = True) -> None:
        """Queue a round (loop thread); `wake`: the writer commits what is queued now."""
        with self._lock:
            if taken:
                self._rounds.append(taken)
            if wake and self._rounds:
                self._wake = True
                self._lock.notify()

    async def close(self) -> None:
        """Commit what is queued (or, while writes fail, try once more), then close the file."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._conn.close()

    def _write_forever(self) -> None:
        held: list[Round] = []  # rounds handed and not committed, in order: the next commit's
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

    def _failed(self, failure: _Failure, exc: Exception, held: list[Round], closing: bool) -> None:
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

    def _commit(self, rounds: list[Round]) -> None:
        """All rounds handed since the last commit, in one transaction, each in its own order."""
        if not any(r.sample_ids or r.rows or r.attempts or r.ops for r in rounds):
            # tokens counted whose sample threw them away before its round: none left to write, but
            # counted as written all the same, or the bound would pause the streams for good
            self.written += sum(taken.num_tokens for taken in rounds)
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
        self.written += sum(taken.num_tokens for taken in rounds)
