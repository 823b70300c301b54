"""The manager's journal: its state in SQLite (WAL mode), so a manager killed mid-batch restarts
where it was, and the tokens its engines generated are not generated again.

One writer thread owns the connection. The event loop hands it small operations (an SQL statement
and its parameters) through a list under a lock, and the tokens engines stream as one entry per
sample per round (a chunk that continues its sample's run extends that entry; a round is written as
one row); it never waits on disk. The thread commits
what has gathered every `journal_flush_interval_ms`, at once when more than `journal_max_unflushed_tokens`
tokens wait (the manager's streams then pause until they are written, which bounds what a crash can
lose), or when a caller needs what it is about to answer to be on disk first (`durable()`: a line
of the sample stream, a micro-batch handed to a client that does not keep the record of its
hand-outs itself; one that does, as `ManagerClient` does, is answered at once, see
`RolloutManager.adopt_handouts`).

Sessions (sessions.py) are journaled beside batches: a row per session (its pin, whether it is
closed, the turn it is running), a row per finished turn (its input and its output with spans), and
the running turn's sample as a batch's samples are (its rows owned by `session:<id>#<seq>`,
compacted once the turn ends). A session's open and close, and every turn's answer, are on disk before the caller
hears of them, so a caller never holds a context the journal does not.

A crash loses only what was not yet committed; SQLite's WAL replays to the last whole transaction,
so a journal cut off mid-write (power loss, a truncated WAL) opens at its last commit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import operator
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollflow.errors import UserError
from rollflow.runtime.manager.samples import Sample

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Bumped whenever a table changes shape; a journal of another version is refused, never guessed at."""

UNFINGERPRINTED_KEYS = frozenset(
    {"host", "port", "token", "journal", "journal_flush_interval_ms", "journal_max_unflushed_tokens"}
)
"""Config keys a restart may change (where it listens, its secret, how it journals); any other change
means another manager's journal."""

BATCH_TABLES = ("batches", "handouts")
"""Tables whose rows belong to one batch (a `batch_id` column), compacted away with it."""

OWNED_TABLES = ("samples", "attempts", "token_log_owners")
"""Tables of samples' rows, by their owner (a batch id, or `session:<id>` for a session's running turn),
compacted away with it; the token log's rows go once no owner of theirs is left."""

SESSION_OWNER = "session:"
"""Prefix of a session turn's owner (`session:<session id>#<sample seq>`: one per turn tried, so a turn
ended and the next begun in one flush never share rows); batch ids hold no `:`, so the two never meet."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    sample_id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS token_log (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS token_log_owners (log_id INTEGER NOT NULL, owner TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS token_log_owners_by_owner ON token_log_owners (owner);
CREATE TABLE IF NOT EXISTS attempts (
    sample_id TEXT PRIMARY KEY, owner TEXT NOT NULL, rid TEXT NOT NULL, engine_url TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS handouts (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, groups TEXT NOT NULL, PRIMARY KEY (batch_id, idx));
CREATE TABLE IF NOT EXISTS engines (url TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (session_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS session_turns (
    session_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (session_id, idx));
"""


class JournalRefused(UserError):
    """A journal this manager must not continue from (another config, another schema, unreadable)."""


@dataclass
class Chunk:
    """Tokens one attempt streamed, as journaled: enough to rebuild the sample's spans exactly."""

    start: int
    attempt: int
    engine_id: int
    engine_url: str
    weight_version: int | None
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class Snapshot:
    """What a journal holds, read back at start."""

    path: str  # the journal's file
    restarts: int  # how many managers opened this journal before this one
    batches: dict[str, dict] = field(default_factory=dict)  # batch id -> its submission
    samples: dict[str, dict] = field(default_factory=dict)  # sample id -> its scalar state
    chunks: dict[str, list[Chunk]] = field(default_factory=dict)  # sample id -> chunks in order
    attempts: list[dict] = field(default_factory=list)  # attempts running when the manager stopped
    handouts: dict[str, list[list[int]]] = field(default_factory=dict)  # batch id -> group indexes
    engines: list[dict] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # balancer, step reports, id counters
    sessions: dict[str, dict] = field(default_factory=dict)  # session id -> its row (running turn too)
    session_turns: dict[str, list[dict]] = field(default_factory=dict)  # session id -> finished turns


def fingerprint(config_dump: dict) -> dict:
    """The part of a manager config that must match for a journal to be continued."""
    return {key: value for key, value in config_dump.items() if key not in UNFINGERPRINTED_KEYS}


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a commit survives the process being killed; only power loss may undo the
    # last commits, and the database stays whole either way
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def open_journal(path: str, config_dump: dict) -> tuple[sqlite3.Connection, Snapshot]:
    """Open (or create) the journal at `path` for a manager of this config; blocking (run off the loop).

    Raises JournalRefused naming the file when it belongs to another config or schema version, or
    cannot be read as a journal at all.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    if not file.exists():
        file.touch(mode=0o600)  # it holds engines' api keys
    expected = fingerprint(config_dump)
    try:
        conn = _connect(file)
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise JournalRefused(f"journal {path} cannot be read ({exc}); move it away to start afresh") from None
    version = int(meta.get("schema_version", "-1")) if meta else SCHEMA_VERSION
    if version != SCHEMA_VERSION:  # before any table is made: another version's file stays as it was
        conn.close()
        raise JournalRefused(
            f"journal {path} has schema version {version}; this rollflow reads version {SCHEMA_VERSION}. "
            "Finish its run with the rollflow that wrote it, or move it away to start afresh"
        )
    conn.executescript(SCHEMA)
    if not meta:
        with conn:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("INSERT INTO meta VALUES ('config', ?)", (json.dumps(expected, sort_keys=True),))
            conn.execute("INSERT INTO meta VALUES ('restarts', '0')")
        return conn, Snapshot(path, restarts=0)
    written = json.loads(meta["config"])
    differs = sorted(key for key in expected.keys() | written.keys() if expected.get(key) != written.get(key))
    if differs:
        conn.close()
        raise JournalRefused(
            f"journal {path} was written by a manager with another config (differs in: {', '.join(differs)}); "
            "restart with that config, or give this one a journal of its own"
        )
    snapshot = _read(conn, path, restarts=int(meta["restarts"]) + 1)
    with conn:
        conn.execute("BEGIN")
        conn.execute("UPDATE meta SET value = ? WHERE key = 'restarts'", (str(snapshot.restarts),))
    return conn, snapshot


def _read(conn: sqlite3.Connection, path: str, restarts: int) -> Snapshot:
    snapshot = Snapshot(path, restarts=restarts)
    for batch_id, body in conn.execute("SELECT batch_id, body FROM batches"):
        snapshot.batches[batch_id] = json.loads(body)
    for sample_id, body in conn.execute("SELECT sample_id, body FROM samples"):
        snapshot.samples[sample_id] = json.loads(body)
    for (body,) in conn.execute("SELECT body FROM token_log ORDER BY id"):
        for sample_id, start, attempt, engine_id, url, version, tokens, logprobs in json.loads(body):
            chunk = Chunk(start, attempt, engine_id, url, version, tokens, logprobs)
            snapshot.chunks.setdefault(sample_id, []).append(chunk)
    for sample_id, rid, url in conn.execute("SELECT sample_id, rid, engine_url FROM attempts"):
        snapshot.attempts.append({"sample_id": sample_id, "rid": rid, "engine_url": url})
    for batch_id, _, groups in conn.execute(
        "SELECT batch_id, idx, groups FROM handouts ORDER BY batch_id, idx"
    ):
        snapshot.handouts.setdefault(batch_id, []).append(json.loads(groups))
    snapshot.engines = [json.loads(body) for (body,) in conn.execute("SELECT body FROM engines")]
    snapshot.state = {key: json.loads(value) for key, value in conn.execute("SELECT key, value FROM state")}
    for session_id, body in conn.execute("SELECT session_id, body FROM sessions"):
        snapshot.sessions[session_id] = json.loads(body)
    for session_id, _, body in conn.execute(
        "SELECT session_id, idx, body FROM session_turns ORDER BY session_id, idx"
    ):
        snapshot.session_turns.setdefault(session_id, []).append(json.loads(body))
    return snapshot


def owner(sample: Sample) -> str | None:
    """Whose rows a sample's are: its batch's, its session's (the running turn), or none (a single
    `/generate` request, whose caller's connection ends with the manager anyway)."""
    if sample.batch_id is not None:
        return sample.batch_id
    return f"{SESSION_OWNER}{sample.session_id}#{sample.seq}" if sample.session_id is not None else None


class Journal:
    """The loop's side of the writer: every method only queues (a few microseconds), except `durable`
    and `room`, which await the writer without blocking the loop."""

    def __init__(self, conn: sqlite3.Connection, flush_interval_ms: int, max_unflushed_tokens: int) -> None:
        self._conn = conn
        self._interval_s = flush_interval_ms / 1000
        self.max_unflushed_tokens = max_unflushed_tokens
        self._mutex = threading.Lock()  # taken per streamed chunk: the C lock, not the Condition's wrapper
        self._lock = threading.Condition(self._mutex)
        self._ops: list[tuple[str, tuple]] = []
        # tokens as the engines stream them: (owner, [sample id, start, attempt, engine id, engine
        # url, weight version, token ids, logprobs]), one entry per sample and round while its chunks
        # run on (`_open`: sample id -> its entry of this round), written as one row per flush
        self._chunks: list[tuple[str, list]] = []
        self._open: dict[str, list] = {}
        self._urgent = False
        self._closing = False
        self._waiters: list[asyncio.Future] = []  # durable() callers of ops queued so far
        self.unflushed_tokens = 0  # tokens queued or being written (loop side)
        self.num_commits = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._write_forever, name="rollflow-journal", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Write what is queued and close the file."""
        if self._thread is None:
            return
        with self._lock:
            self._closing = True
            self._lock.notify()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._conn.close()

    # ------------------------------------------------------------------ queueing (loop thread)

    def _put(self, *ops: tuple[str, tuple]) -> None:
        if self._failed is not None:
            return  # the writer stopped (logged when it did); the manager serves on without a journal
        with self._lock:
            self._ops.extend(ops)

    def put(self, sql: str, params: tuple = ()) -> None:
        self._put((sql, params))

    @property
    def full(self) -> bool:
        """More tokens than the bound wait to be written: streams should `await room()`."""
        return self.unflushed_tokens >= self.max_unflushed_tokens

    # ------------------------------------------------------------------ the manager's events

    def batch_submitted(self, batch_id: str, submission: dict, samples: list[Sample]) -> None:
        ops = [("INSERT OR REPLACE INTO batches VALUES (?, ?)", (batch_id, json.dumps(submission)))]
        ops += [self.sample_row(sample) for sample in samples]
        self._put(*ops)

    def batch_offloaded(self, batch_id: str) -> None:
        self.put(
            "UPDATE batches SET body = json_set(body, '$.offloaded', json('true')) WHERE batch_id = ?",
            (batch_id,),
        )

    def batch_gone(self, batch_id: str) -> None:
        """Compaction: a delivered or deleted batch leaves nothing behind."""
        ops = [(f"DELETE FROM {table} WHERE batch_id = ?", (batch_id,)) for table in BATCH_TABLES]
        self._put(*ops, *self._owner_gone(batch_id))

    @staticmethod
    def _owner_gone(name: str) -> list[tuple[str, tuple]]:
        ops = [(f"DELETE FROM {table} WHERE owner = ?", (name,)) for table in OWNED_TABLES]
        ops.append(("DELETE FROM token_log WHERE id NOT IN (SELECT log_id FROM token_log_owners)", ()))
        return ops

    @staticmethod
    def sample_row(sample: Sample, completed: int | None = None) -> tuple[str, tuple]:
        body = {
            "seq": sample.seq,
            "group_index": sample.group_index,
            "state": sample.state.name.lower(),
            "finish_reason": sample.finish_reason,
            "error": sample.error,
            "attempts": sample.attempts,
            "resumes": sample.resumes,
            "request_failures": sample.request_failures,
            "regenerated_tokens": sample.regenerated_tokens,
            "completed": completed,
        }
        return "INSERT OR REPLACE INTO samples VALUES (?, ?, ?)", (
            sample.sample_id,
            owner(sample),
            json.dumps(body),
        )

    def sample_changed(self, sample: Sample, completed: int | None = None) -> None:
        if owner(sample) is None:
            return
        self._put(self.sample_row(sample, completed))

    def tokens(self, sample: Sample, start: int, engine_id: int, engine_url: str, ended: bool) -> None:
        """The tokens `sample` holds from `start` on, just recorded; `ended`: the attempt ends with them
        (the sample's finish reason goes in the same transaction, so a restart never resumes a sample
        that had finished). Called for every chunk every engine streams: it only appends."""
        name = owner(sample)
        if name is None or self._failed is not None:
            return
        num_tokens = len(sample.output_ids) - start
        if num_tokens:
            version = sample.spans[-1].weight_version
            with self._mutex:  # not while the writer takes this round's entries
                entry = self._open.get(sample.sample_id)
                if (
                    entry is not None
                    and entry[1] + len(entry[6]) == start
                    and entry[2] == sample.attempts
                    and entry[3] == engine_id
                    and entry[5] == version
                ):  # the same run of tokens: one entry (and one span) however many chunks it took
                    entry[6] += sample.output_ids[start:]
                    entry[7] += sample.output_logprobs[start:]
                else:
                    entry = [
                        sample.sample_id,
                        start,
                        sample.attempts,
                        engine_id,
                        engine_url,
                        version,
                        sample.output_ids[start:],
                        sample.output_logprobs[start:],
                    ]
                    self._open[sample.sample_id] = entry
                    self._chunks.append((name, entry))
            self.unflushed_tokens += num_tokens
            if self.full and not self._urgent:
                with self._lock:
                    self._urgent = True
                    self._lock.notify()
        if ended or not num_tokens:
            self._put(self.sample_row(sample))  # after its tokens, so in their transaction or a later one

    def output_discarded(self, sample: Sample) -> None:
        if owner(sample) is None:
            return
        # the token log is append-only: the sample's next tokens, from 0 again, replace these at restore
        self._put(self.sample_row(sample))

    def attempt_started(self, sample: Sample, rid: str, engine_url: str) -> None:
        if owner(sample) is None:
            return
        self._put(
            (
                "INSERT OR REPLACE INTO attempts VALUES (?, ?, ?, ?)",
                (sample.sample_id, owner(sample), rid, engine_url),
            ),
            self.sample_row(sample),
        )

    def attempt_ended(self, sample: Sample) -> None:
        if owner(sample) is None:
            return
        self.put("DELETE FROM attempts WHERE sample_id = ?", (sample.sample_id,))

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
        ops = [("INSERT OR REPLACE INTO sessions VALUES (?, ?)", (session_id, json.dumps(row)))]
        if running is not None:
            ops.append(self.sample_row(running))
        self._put(*ops)

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
        self._put(*ops, *self._owner_gone(owner(sample)))

    def session_forgotten(self, session_id: str) -> None:
        """A closed session dropped from the manager's memory: from the journal too."""
        self._put(
            ("DELETE FROM sessions WHERE session_id = ?", (session_id,)),
            ("DELETE FROM session_turns WHERE session_id = ?", (session_id,)),
        )

    def set_state(self, key: str, value: Any) -> None:
        self.put("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, json.dumps(value)))

    async def durable(self) -> None:
        """Return once everything queued so far is committed."""
        waiter = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._thread is None or self._failed is not None:
                return
            # a round of its own even when nothing is queued: ops taken by a commit still running
            # are durable only once that commit ends, and rounds run one after another
            self._waiters.append(waiter)
            self._urgent = True
            self._lock.notify()
        await waiter

    def flush_soon(self) -> None:
        """Start a round now, not waiting for it: for what should reach the disk before the next
        interval though no caller waits on it (a turn cancelled by its caller's going away)."""
        with self._lock:
            self._urgent = True
            self._lock.notify()

    async def room(self) -> None:
        """Wait while more tokens than the bound are unwritten: the streams' back-pressure."""
        while (
            self.unflushed_tokens >= self.max_unflushed_tokens
            and self._thread is not None
            and not self._failed
        ):
            await self.durable()

    # ------------------------------------------------------------------ writing (writer thread)

    def _write_forever(self) -> None:
        while True:
            with self._lock:
                # a round every interval, sooner when woken for a bound or a durable() (queueing an
                # op wakes no one: a wake-up per flush would cost the loop more than the op itself)
                deadline = time.monotonic() + self._interval_s
                while not self._urgent and not self._closing and (left := deadline - time.monotonic()) > 0:
                    self._lock.wait(left)
                ops, self._ops = self._ops, []
                # after the ops: every chunk appended before an op (its sample's end) is in this round
                chunks, self._chunks = self._chunks, []
                self._open = {}
                waiters, self._waiters = self._waiters, []
                self._urgent = False
                closing = self._closing
            tokens = sum(len(entry[6]) for _, entry in chunks)
            if not ops and not chunks and not waiters and not closing:
                continue
            if ops or chunks:
                try:
                    self._commit(ops, chunks)
                except Exception as exc:  # a full disk, a file removed: logged, then journaling stops
                    log.exception("journal write failed; the manager goes on without it")
                    with self._lock:
                        self._failed = exc
                        waiters += self._waiters
                    self._loop.call_soon_threadsafe(self._committed, tokens, waiters)
                    return
            self._loop.call_soon_threadsafe(self._committed, tokens, waiters)
            if closing:
                with self._lock:
                    if not self._ops:
                        return

    def _commit(self, ops: list[tuple[str, tuple]], chunks: list[tuple[str, list]]) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        if chunks:  # first: an owner compacted by this round's ops takes its tokens with it
            log_id = conn.execute(
                "INSERT INTO token_log (body) VALUES (?)", (json.dumps([entry for _, entry in chunks]),)
            ).lastrowid
            owners = {name for name, _ in chunks}
            conn.executemany(
                "INSERT INTO token_log_owners VALUES (?, ?)", [(log_id, name) for name in owners]
            )
        # a run of the same statement (the sample rows of a round, mostly) is one executemany: in
        # order, so the same as one by one, with one call from Python instead of one per row
        for sql, run in itertools.groupby(ops, key=operator.itemgetter(0)):
            conn.executemany(sql, [params for _, params in run])
        conn.execute("COMMIT")
        self.num_commits += 1

    def _committed(self, tokens: int, waiters: list[asyncio.Future]) -> None:
        self.unflushed_tokens -= tokens
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
