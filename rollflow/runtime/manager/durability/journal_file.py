"""The journal's file: its schema, opening it for a manager (refusing another config's or another
version's), and reading back what it holds when a manager starts on it (journal.py writes it).

The token log keeps the tokens the engines streamed, a row per round of the writer, in runs (a run:
one sample's new tokens of the round in one span): the runs' sample ids (JSON), the runs that opened
a span (JSON: the span's attempt, engine and weight version, so the spans are rebuilt exactly), and
the runs' starts and counts, token ids and logprobs packed (int64, float64).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollflow.errors import UserError
from rollflow.runtime.manager.durability.journal_lock import unwritable

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
"""A sample row's body: a JSON array of its id, its owner and these (journals written before it was an
array hold an object of these, read alike)."""

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

    Raises JournalRefused naming the file when it belongs to another config or schema version, is
    corrupt, or cannot be read as a journal at all, and JournalUnwritable when it cannot be written.
    """
    file = Path(path)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        if not file.exists():
            file.touch(mode=0o600)  # it holds engines' api keys
        elif not os.access(file, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise unwritable(path, "its file", exc) from None
    conn = None
    try:
        conn = _connect(file)
        return conn, _open(conn, path, fingerprint(config_dump))
    except BaseException as exc:
        if conn is not None:
            conn.close()
        if isinstance(exc, sqlite3.DatabaseError):
            raise _unreadable(path, exc) from None
        raise


def _unreadable(path: str, exc: sqlite3.DatabaseError) -> UserError:
    """What SQLite said of a journal it could not open or read, as what to do about it."""
    if isinstance(exc, sqlite3.OperationalError) and "readonly" in str(exc):
        return unwritable(path, "SQLite", exc)
    if isinstance(exc, sqlite3.OperationalError):  # the file is fine; the system is not (I/O, locking)
        return JournalRefused(
            f"journal {path} cannot be opened ({exc}); fix what SQLite names and start again"
        )
    return JournalRefused(
        f"journal {path} is corrupt ({exc}); move it away to start afresh (its batches are lost), or "
        f"salvage its rows first with `sqlite3 {path} .recover`"
    )


def _open(conn: sqlite3.Connection, path: str, expected: dict) -> Snapshot:
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    version = int(meta.get("schema_version", "-1")) if meta else SCHEMA_VERSION
    if version != SCHEMA_VERSION:  # before any table is made: another version's file stays as it was
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
        return Snapshot(path, restarts=0)
    written = json.loads(meta["config"])
    differs = sorted(key for key in expected.keys() | written.keys() if expected.get(key) != written.get(key))
    if differs:
        raise JournalRefused(
            f"journal {path} was written by a manager with another config (differs in: {', '.join(differs)}); "
            "restart with that config, or give this one a journal of its own"
        )
    try:
        snapshot = _read(conn, path, restarts=int(meta["restarts"]) + 1)
    except JournalRefused:
        raise
    except (ValueError, KeyError, TypeError) as exc:  # rows SQLite reads, but not as this rollflow wrote them
        raise JournalRefused(
            f"journal {path} is corrupt (a row cannot be read: {exc!r}); move it away to start afresh "
            "(its batches are lost)"
        ) from None
    with conn:
        conn.execute("BEGIN")
        conn.execute("UPDATE meta SET value = ? WHERE key = 'restarts'", (str(snapshot.restarts),))
    return snapshot


def _read(conn: sqlite3.Connection, path: str, restarts: int) -> Snapshot:
    snapshot = Snapshot(path, restarts=restarts)
    for batch_id, body in conn.execute("SELECT batch_id, body FROM batches"):
        snapshot.batches[batch_id] = json.loads(body)
    for sample_id, body in conn.execute("SELECT sample_id, body FROM samples"):
        values = json.loads(body)
        snapshot.samples[sample_id] = (
            dict(zip(SAMPLE_FIELDS, values[2:], strict=True)) if isinstance(values, list) else values
        )
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
    token_ids, logprobs = unpack("q", token_ids), unpack("d", logprobs)
    end = 0
    for index, (sample_id, start, count) in enumerate(
        zip(json.loads(sample_ids), unpack("q", starts), unpack("q", counts), strict=True)
    ):
        first, end = end, end + count
        span = opened_at.get(index)
        if span is not None:
            spans[sample_id] = span
        elif sample_id not in spans:
            raise JournalRefused(
                f"journal {snapshot.path}: sample {sample_id} has tokens of no span; "
                "move it away to start afresh"
            )
        runs = snapshot.chunks.setdefault(sample_id, [])
        last = runs[-1] if runs else None
        if span is None and last is not None and last.start + len(last.token_ids) == start:
            last.token_ids += token_ids[first:end]
            last.logprobs += logprobs[first:end]
        else:
            runs.append(Chunk(start, *spans[sample_id], token_ids[first:end], logprobs[first:end]))


def pack(typecode: str, values: Iterable) -> bytes:
    """Integers (int64) or logprobs (float64), little-endian: exact, and written without a Python step
    per value (JSON's numbers cost some 5 to 30 times more)."""
    packed = array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack(typecode: str, data: bytes) -> list:
    """What `pack` wrote, as a list."""
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()
