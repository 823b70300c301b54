"""The manager's journal: its state in SQLite (WAL mode), so a manager killed mid-batch restarts
where it was, and the tokens its engines generated are not generated again.

One writer thread owns the connection; the event loop never waits on disk, and pays per streamed
chunk no more than a note of which sample grew. The loop notes what changed (the statements to run,
the samples whose rows or tokens changed) on its own, without a lock, and hands it to the writer as
one round every `journal_flush_interval_ms`; a round takes each noted sample's new tokens from the
sample's own lists, as runs of its spans, and is written as one transaction with one row of tokens
(logprobs packed as float64). A round is handed at once when more than `journal_max_unflushed_tokens`
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
import sys
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollflow.errors import UserError
from rollflow.runtime.manager.samples import Sample, SampleState

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
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
CREATE TABLE IF NOT EXISTS token_log (
    id INTEGER PRIMARY KEY, sample_ids TEXT NOT NULL, spans TEXT NOT NULL, starts BLOB NOT NULL,
    counts BLOB NOT NULL, token_ids BLOB NOT NULL, logprobs BLOB NOT NULL);
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
    spans: dict[str, list] = {}  # sample id -> the span its tokens run in: attempt, engine id, url, version
    for row in conn.execute(
        "SELECT sample_ids, spans, starts, counts, token_ids, logprobs FROM token_log ORDER BY id"
    ):
        _read_chunks(snapshot, spans, *row)
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


def _read_chunks(
    snapshot: Snapshot,
    spans: dict[str, list],
    sample_ids: str,
    opened: str,
    starts: bytes,
    counts: bytes,
    token_ids: bytes,
    logprobs: bytes,
) -> None:
    """One row of the token log: its chunks in the order they came, each run of a sample's tokens one
    `Chunk` (`spans`: sample id -> the span its tokens run in, from the chunk that opened it)."""
    opened_at = {index: span for index, *span in json.loads(opened)}
    token_ids, logprobs = _unpack("q", token_ids), _unpack("d", logprobs)
    end = 0
    for index, (sample_id, start, count) in enumerate(
        zip(json.loads(sample_ids), _unpack("q", starts), _unpack("q", counts), strict=True)
    ):
        first, end = end, end + count
        span = opened_at.get(index)
        if span is not None:
            spans[sample_id] = span
        elif sample_id not in spans:
            raise JournalRefused(
                f"journal {snapshot.path}: sample {sample_id} has tokens of no span; move it away to start afresh"
            )
        runs = snapshot.chunks.setdefault(sample_id, [])
        last = runs[-1] if runs else None
        if span is None and last is not None and last.start + len(last.token_ids) == start:
            last.token_ids += token_ids[first:end]
            last.logprobs += logprobs[first:end]
        else:
            runs.append(Chunk(start, *spans[sample_id], token_ids[first:end], logprobs[first:end]))


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

    # tokens as streamed, a chunk at a time, in flat lists: no object per chunk for the GC to chase
    sample_ids: list[str]  # each chunk's sample
    starts: array  # where in its sample's output the chunk starts
    counts: array  # its number of tokens
    spans: list[tuple]  # the chunks that opened a span: (chunk index, attempt, engine id, url, version)
    token_ids: list[int]  # the chunks' tokens, one chunk's after another
    logprobs: list[float]  # and their logprobs
    owners: set[str]  # the owners of the chunks' samples
    rows: dict[str, tuple]  # sample id -> its row (`sample_values`), the latest
    attempts: dict[str, tuple | None]  # sample id -> its attempt running (owner, rid, url); None: ended
    ops: list[tuple[str, tuple]]  # other statements, in the order they were queued
    num_tokens: int  # the chunks' tokens
    waiters: list[asyncio.Future]  # durable() callers, answered once the round is committed

    def __bool__(self) -> bool:
        return bool(self.sample_ids or self.rows or self.attempts or self.ops or self.waiters)


STATE_NAMES = {state: state.name.lower() for state in SampleState}

# a round's rows of a table go in one statement, from one JSON array: the writer thread takes the GIL
# back after every statement SQLite runs, and while the loop is busy each time costs it the switch
# interval (5 ms), so a statement per row would hold a commit back for seconds
SAMPLE_FIELDS = (
    "seq",
    "group_index",
    "state",
    "finish_reason",
    "error",
    "attempts",
    "resumes",
    "request_failures",
    "regenerated_tokens",
    "completed",
)
SAMPLES_SQL = (  # rows as JSON arrays (`sample_values`); SQLite makes each body an object
    "INSERT OR REPLACE INTO samples SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_object("
    + ", ".join(f"'{name}', json_extract(value, '$[{index}]')" for index, name in enumerate(SAMPLE_FIELDS, 2))
    + ") FROM json_each(?)"
)
ATTEMPTS_SQL = (
    "INSERT OR REPLACE INTO attempts SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]') FROM json_each(?)"
)
ATTEMPTS_ENDED_SQL = "DELETE FROM attempts WHERE sample_id IN (SELECT value FROM json_each(?))"
OWNERS_SQL = "INSERT INTO token_log_owners SELECT ?, value FROM json_each(?)"


def sample_values(sample: Sample, name: str | None, completed: int | None = None) -> tuple:
    """A sample's row as plain values, taken on the loop (the writer turns it into JSON)."""
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


def _pack(typecode: str, values: Iterable) -> bytes:
    """Integers (int64) or logprobs (float64), little-endian: exact, and written without a Python step
    per value (JSON's numbers cost some 5 to 30 times more)."""
    packed = array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, data: bytes) -> list:
    """What `_pack` wrote, as a list."""
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


class Journal:
    """The loop's side of the writer. Its methods run on the event loop and only note what changed: no
    lock, no disk, and for a streamed chunk not even a copy of its tokens. `durable` and `room` await
    the writer without blocking the loop."""

    def __init__(self, conn: sqlite3.Connection, flush_interval_ms: int, max_unflushed_tokens: int) -> None:
        self._conn = conn
        self._interval_s = flush_interval_ms / 1000
        self.max_unflushed_tokens = max_unflushed_tokens
        # a round is handed once half the bound has gathered, so that the bound itself (the streams'
        # pause) is reached only when the writer falls behind, not while a round waits for its time
        self._round_tokens = max(1, max_unflushed_tokens // 2)
        self._received = 0  # tokens noted (loop)
        self._written = 0  # tokens committed (writer thread: the loop sees a commit at once)
        self._room = asyncio.Event()  # set while the streams may read on (see room())
        self._room.set()
        self.num_commits = 0
        # noted on the loop since the last round (the loop's alone)
        self._sample_ids: list[str] = []  # the chunks, as in _Round
        self._starts = array("q")
        self._counts = array("q")
        self._spans: list[tuple] = []
        self._token_ids: list[int] = []
        self._logprobs: list[float] = []
        self._owners: set[str] = set()
        self._rows: dict[str, tuple] = {}
        self._attempts: dict[str, tuple | None] = {}
        self._ops: list[tuple[str, tuple]] = []
        self._num_tokens = 0
        self._waiters: list[asyncio.Future] = []
        self._next_round: asyncio.TimerHandle | asyncio.Handle | None = None
        self._soon = False  # the next round is due at once (a bound, a durable()), not at the interval
        # handed to the writer, under the lock (once per round)
        self._lock = threading.Condition()
        self._rounds: list[_Round] = []
        self._wake = False
        self._closing = False
        self._failed: BaseException | None = None
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
        if self._failed is not None:
            return  # the writer stopped (logged when it did); the manager serves on without a journal
        self._ops.extend(ops)
        if self._next_round is None:
            self._arm()

    def put(self, sql: str, params: tuple = ()) -> None:
        self._put((sql, params))

    @property
    def unflushed_tokens(self) -> int:
        """Tokens received and not yet committed: what a crash now would lose."""
        return self._received - self._written

    @property
    def full(self) -> bool:
        """More tokens than the bound wait to be written: streams should `await room()`."""
        return self._received - self._written >= self.max_unflushed_tokens and self._failed is None

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
        if name is None or self._failed is not None:
            return
        self._rows[sample.sample_id] = sample_values(sample, name, completed)
        if self._next_round is None:
            self._arm()

    def tokens(self, sample: Sample, token_ids: list[int], logprobs: list[float], ended: bool) -> None:
        """`sample` just recorded these tokens; `ended`: its attempt ends with them (its finish reason
        goes in their round, so a restart never resumes a sample that had finished). Called for every
        chunk every engine streams: it only appends, and the writer packs the round's chunks at once."""
        name = sample.batch_id
        if name is None:
            name = owner(sample)
            if name is None:
                return  # a single /generate request
        if token_ids:
            num_tokens = len(token_ids)
            start = len(sample.output_ids) - num_tokens
            span = sample.spans[-1]
            if span.start == start:  # the chunk opened a span: the rest of it runs in the same
                self._spans.append(
                    (
                        len(self._sample_ids),
                        span.attempt,
                        span.engine_id,
                        span.engine_url,
                        span.weight_version,
                    )
                )
            self._sample_ids.append(sample.sample_id)
            self._starts.append(start)
            self._counts.append(num_tokens)
            self._token_ids += token_ids
            self._logprobs += logprobs
            self._owners.add(name)
            self._num_tokens += num_tokens
            self._received += num_tokens
        if ended:
            self.sample_changed(sample)
        if self._num_tokens >= self._round_tokens:
            self._end_round()
        elif self._next_round is None:
            self._arm()

    def output_discarded(self, sample: Sample) -> None:
        # the token log is append-only: the sample's next tokens, from 0 again, replace these at restore
        self.sample_changed(sample)

    def attempt_started(self, sample: Sample, rid: str, engine_url: str) -> None:
        name = owner(sample)
        if name is None:
            return
        self._attempts[sample.sample_id] = (name, rid, engine_url)
        self.sample_changed(sample)

    def attempt_ended(self, sample: Sample) -> None:
        if owner(sample) is None or self._failed is not None:
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
        """Return once everything noted so far is committed."""
        if self._thread is None or self._failed is not None:
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
        """What was noted since the last round, as a round; the loop starts noting afresh."""
        taken = _Round(
            self._sample_ids,
            self._starts,
            self._counts,
            self._spans,
            self._token_ids,
            self._logprobs,
            self._owners,
            self._rows,
            self._attempts,
            self._ops,
            self._num_tokens,
            self._waiters,
        )
        self._sample_ids, self._starts, self._counts, self._spans = [], array("q"), array("q"), []
        self._token_ids, self._logprobs, self._owners = [], [], set()
        self._rows, self._attempts, self._ops, self._num_tokens, self._waiters = {}, {}, [], 0, []
        return taken

    def _hand(self, taken: _Round, wake: bool = True) -> None:
        with self._lock:
            failed = self._failed is not None
            if not failed:
                if taken:
                    self._rounds.append(taken)
                if wake and self._rounds:
                    self._wake = True
                    self._lock.notify()
        if failed:  # nothing will commit it: its waiters go on without
            self._committed([taken])

    def _committed(self, rounds: list[_Round]) -> None:
        for done in rounds:
            for waiter in done.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        if not self._room.is_set() and not self.full:
            self._room.set()

    # ------------------------------------------------------------------ writing (writer thread)

    def _write_forever(self) -> None:
        while True:
            with self._lock:
                while not self._wake and not self._closing:
                    self._lock.wait()
                rounds, self._rounds = self._rounds, []
                self._wake = False
                closing = self._closing
            try:
                self._commit(rounds)
            except Exception as exc:  # a full disk, a file removed: logged, then journaling stops
                log.exception("journal write failed; the manager goes on without it")
                with self._lock:
                    self._failed = exc
                    rounds += self._rounds
                    self._rounds = []
                self._loop.call_soon_threadsafe(self._committed, rounds)
                return
            self._loop.call_soon_threadsafe(self._committed, rounds)
            if closing:
                return

    def _commit(self, rounds: list[_Round]) -> None:
        """All rounds handed since the last commit, in one transaction, each in its own order."""
        if not any(r.sample_ids or r.rows or r.attempts or r.ops for r in rounds):
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
                        _pack("q", taken.starts),
                        _pack("q", taken.counts),
                        _pack("q", taken.token_ids),
                        _pack("d", taken.logprobs),
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
        self._written += sum(taken.num_tokens for taken in rounds)
        self.num_commits += 1
