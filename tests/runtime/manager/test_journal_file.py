"""The journal file on its own: what it refuses, what a torn write leaves, how its writer batches."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sqlite3

import pytest

from rollflow.config import ConfigError, load_config
from rollflow.runtime.deadline import within
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import Sample
from rollflow.runtime.manager.durability import journal_writer
from rollflow.runtime.manager.durability.journal import Journal
from rollflow.runtime.manager.durability.journal_file import SCHEMA_VERSION, JournalRefused, open_journal
from rollflow.runtime.wire.base import SamplingParams

CONFIG = ManagerConfig().model_dump(mode="json")


def test_a_journal_of_another_schema_version_is_refused_naming_both(tmp_path):
    path = str(tmp_path / "j.db")
    conn, _ = open_journal(path, CONFIG)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(
        JournalRefused,
        match=f"journal {path} has schema version 99; this rollflow reads version {SCHEMA_VERSION}",
    ):
        open_journal(path, CONFIG)


def test_a_journal_of_schema_version_1_no_sessions_yet_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute(
        "CREATE TABLE samples (sample_id TEXT PRIMARY KEY, batch_id TEXT NOT NULL, body TEXT NOT NULL)"
    )
    conn.commit()
    conn.close()
    with pytest.raises(
        JournalRefused, match=f"has schema version 1; this rollflow reads version {SCHEMA_VERSION}"
    ):
        open_journal(str(path), CONFIG)
    conn = sqlite3.connect(path)
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert tables == {"meta", "samples"}


def test_a_file_that_is_no_journal_is_refused_naming_it(tmp_path):
    path = tmp_path / "j.db"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(JournalRefused, match=f"journal {path} is corrupt \\(file is not a database\\)"):
        open_journal(str(path), CONFIG)


def test_a_row_that_sqlite_reads_but_rollflow_cannot_is_refused_as_corrupt(tmp_path):
    path = str(tmp_path / "j.db")
    conn, _ = open_journal(path, CONFIG)
    conn.execute("INSERT INTO samples VALUES ('b-0-0', 'b', '[0, 1')")  # a body cut short
    conn.close()
    with pytest.raises(JournalRefused, match=f"journal {path} is corrupt \\(a row cannot be read: "):
        open_journal(path, CONFIG)


def test_a_restart_may_change_where_the_manager_listens_but_not_what_it_does(tmp_path):
    path = str(tmp_path / "j.db")
    open_journal(path, CONFIG)[0].close()
    moved = CONFIG | {"port": 40000, "token": "t", "journal_flush_interval_ms": 5}
    conn, snapshot = open_journal(path, moved)
    conn.close()
    assert snapshot.restarts == 1
    with pytest.raises(JournalRefused, match=r"differs in: max_attempts, resume\)"):
        open_journal(path, CONFIG | {"resume": "restart", "max_attempts": 3})


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("journal_flush_interval_ms=0", "journal_flush_interval_ms"),
        ("journal_max_unflushed_tokens=0", "journal_max_unflushed_tokens"),
        ("journal=' '", "journal"),
    ],
)
def test_bad_journal_settings_are_named(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(ManagerConfig, None, [override])


def _write_two_transactions(path: str, crash_copy: str) -> None:
    """Two commits through the writer thread; the files are copied while the connection is open,
    as a crash leaves them (the WAL not yet folded into the database)."""

    async def run() -> None:
        conn, _ = open_journal(path, CONFIG)
        journal = Journal(conn, flush_interval_ms=10, max_unflushed_tokens=1000)
        journal.start()
        journal.set_state("first", 1)
        await journal.durable()
        journal.set_state("second", "x" * 5000)  # a transaction of more than one page
        await journal.durable()
        for suffix in ("", "-wal"):
            shutil.copy(path + suffix, crash_copy + suffix)
        await journal.close()

    asyncio.run(run())


def test_a_wal_torn_mid_transaction_opens_at_the_last_whole_one(tmp_path):
    path, crash = str(tmp_path / "j.db"), str(tmp_path / "crash.db")
    _write_two_transactions(path, crash)
    wal = tmp_path / "crash.db-wal"
    whole = wal.read_bytes()
    wal.write_bytes(whole[: len(whole) - 2000])  # the second transaction's last frame cut short
    conn, snapshot = open_journal(crash, CONFIG)
    conn.close()
    assert snapshot.state == {"first": 1}


def test_the_writer_batches_many_writes_into_few_commits(tmp_path):
    async def run() -> int:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=200, max_unflushed_tokens=10_000)
        journal.start()
        for index in range(500):
            journal.set_state(f"key{index}", index)
        await journal.durable()
        commits = journal.num_commits
        await journal.close()
        return commits

    assert asyncio.run(run()) <= 2
    rows = sqlite3.connect(tmp_path / "j.db").execute("SELECT count(*) FROM state").fetchone()[0]
    assert rows == 500


def _sample(index: int) -> Sample:
    sample = Sample(index, f"b-{index}-0", [1, 2], SamplingParams(max_new_tokens=1000), batch_id="b")
    sample.begin_attempt(0)
    return sample


def _stream(journal: Journal, sample: Sample, num_tokens: int) -> list[bool]:
    """`num_tokens` tokens recorded one at a time, as an engine streams them, each journaled; what
    each call answered (whether the stream must wait for room)."""
    answers = []
    for _ in range(num_tokens):
        tokens, logprobs = [len(sample.output_ids) + 10], [-0.5]
        sample.record(0, "http://e", 0, tokens, logprobs)
        answers.append(journal.tokens(sample, len(tokens), ended=False))
    return answers


def test_tokens_past_the_bound_are_written_at_once_not_at_the_interval(tmp_path):
    async def run() -> tuple[list[bool], bool, bool, int, int]:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10)
        journal.start()
        # a round goes at 5 tokens, the bound is reached at 10, and from there on every chunk is told
        # to wait (unless the writer, a thread of its own, committed the first round by then)
        answers = _stream(journal, _sample(0), 12)
        early = journal.num_commits > 0
        await within(journal.room(), 30)  # an hour-long interval would hang here
        full, left, commits = journal.full, journal.unflushed_tokens, journal.num_commits
        await journal.close()
        return answers, early, full, left, commits

    answers, early, full, left, commits = asyncio.run(run())
    assert answers[:9] == [False] * 9 and (early or answers[9:] == [True] * 3)
    assert not full and left < 10 and commits >= 1
    conn, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
    conn.close()
    assert [token for chunk in snapshot.chunks["b-0-0"] for token in chunk.token_ids] == list(range(10, 22))


def test_tokens_go_in_one_row_per_flush_and_leave_with_their_batch(tmp_path):
    async def run() -> tuple[int, int]:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10_000)
        journal.start()
        for index in range(50):
            _stream(journal, _sample(index), 20)
        await journal.durable()
        rows = _count(conn, "token_log")
        journal.batch_gone("b")
        await journal.durable()
        left = _count(conn, "token_log")
        await journal.close()
        return rows, left

    assert asyncio.run(run()) == (1, 0)


def test_a_batch_gone_within_its_first_flush_never_reaches_the_disk(tmp_path):
    """A small batch served within one flush interval: its rows are neither written nor deleted; a
    batch submitted beside it is written whole, and one gone after its first flush is deleted."""

    def batch(batch_id: str) -> list[Sample]:
        samples = []
        for index in range(2):
            sample = Sample(
                index, f"{batch_id}-{index}-0", [1, 2], SamplingParams(max_new_tokens=99), batch_id=batch_id
            )
            sample.begin_attempt(0)
            samples.append(sample)
        return samples

    async def run() -> tuple[dict[str, int], int, int, dict[str, int]]:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10_000)
        journal.start()
        kept, short, later = batch("kept"), batch("short"), batch("later")
        for name, samples in (("kept", kept), ("short", short), ("later", later)):
            journal.batch_submitted(name, {"n": 2}, samples)
            for sample in samples:
                journal.attempt_started(sample, f"rid-{sample.sample_id}", "http://e")
                _stream(journal, sample, 20)
        journal.handed_out("short", 0, [0])
        journal.batch_gone("short")  # within its first flush: dropped
        await journal.durable()
        commits = journal.num_commits
        journal.batch_gone("later")  # after its first flush: deleted
        await journal.durable()
        rows = {table: _count(conn, table) for table in ("batches", "samples", "attempts", "handouts")}
        left = journal.unflushed_tokens
        await journal.close()
        _, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
        tokens = {
            sample_id: sum(len(c.token_ids) for c in chunks) for sample_id, chunks in snapshot.chunks.items()
        }
        return rows, commits, left, tokens

    rows, commits, left, tokens = asyncio.run(run())
    assert rows == {"batches": 1, "samples": 2, "attempts": 2, "handouts": 0}
    assert commits == 1 and left == 0  # the dropped batch's tokens are counted written: no stream waits
    # (the later batch's runs share a row with the kept one's, read back but never restored: no batch)
    assert {sample_id: n for sample_id, n in tokens.items() if not sample_id.startswith("later")} == {
        "kept-0-0": 20,
        "kept-1-0": 20,
    }


def test_a_turn_ended_and_the_next_begun_in_one_flush_keep_the_new_turns_tokens(tmp_path):
    def turn(seq: int) -> Sample:
        sample = Sample(seq, f"s.t{seq}", [1, 2], SamplingParams(max_new_tokens=1000), session_id="s")
        sample.begin_attempt(0)
        return sample

    async def run() -> None:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10_000)
        journal.start()
        first, second = turn(0), turn(1)
        journal.session_changed("s", {"running": 0}, running=first)
        _stream(journal, first, 5)
        await journal.durable()
        # in one round: the first turn's tokens go with it, the second's (streamed first) stay
        _stream(journal, second, 3)
        journal.turn_ended("s", {"running": None}, first, 0, {"output_ids": first.output_ids})
        journal.session_changed("s", {"running": 1}, running=second)
        await journal.durable()
        await journal.close()

    asyncio.run(run())
    conn, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
    conn.close()
    assert snapshot.sessions == {"s": {"running": 1}}
    assert snapshot.session_turns == {"s": [{"output_ids": [10, 11, 12, 13, 14]}]}
    assert set(snapshot.chunks) == {"s.t1"} and set(snapshot.samples) == {"s.t1"}
    assert [token for chunk in snapshot.chunks["s.t1"] for token in chunk.token_ids] == [10, 11, 12]


def _count(conn: sqlite3.Connection, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_rounds_runs_follow_the_samples_spans_across_attempts_and_rounds(tmp_path):
    """Each round takes a sample's new tokens from its own lists, a run per span they fall in: a span
    begun in one round and carried on in the next, a second attempt and a new weight version within
    one round, and tokens thrown away (`resume: restart`) come back exactly as recorded."""
    sample, other = _sample(0), _sample(1)

    async def run() -> None:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10_000)
        journal.start()
        _stream(journal, sample, 3)
        _stream(journal, other, 4)
        await journal.durable()
        _stream(journal, sample, 2)  # the first span carried on
        sample.begin_attempt(1)
        _stream(journal, sample, 2)  # a second attempt, in the same round
        sample.record(1, "http://f", 1, [99], [-0.25])  # a new weight version
        journal.tokens(sample, 1, ended=False)
        other.discard_output()
        journal.output_discarded(other)
        _stream(journal, other, 2)  # from 0 again
        await journal.durable()
        await journal.close()

    asyncio.run(run())
    conn, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
    conn.close()
    runs = [
        (c.start, c.attempt, c.engine_url, c.weight_version, c.token_ids) for c in snapshot.chunks["b-0-0"]
    ]
    assert runs == [
        (0, 1, "http://e", 0, [10, 11, 12, 13, 14]),  # one span over two rounds: read back as one
        (5, 2, "http://e", 0, [15, 16]),
        (7, 2, "http://f", 1, [99]),
    ]
    assert [(c.start, c.token_ids) for c in snapshot.chunks["b-1-0"]] == [
        (0, [10, 11, 12, 13]),
        (0, [10, 11]),
    ]


def test_a_samples_row_reads_back_with_every_field_in_either_layout(tmp_path):
    """A sample's body is kept as the JSON array the loop sends; a body of the object layout written
    before reads the same."""
    sample = _sample(0)
    sample.finish_reason, sample.resumes, sample.regenerated_tokens = "length", 2, 7

    async def run() -> None:
        conn, _ = open_journal(str(tmp_path / "j.db"), CONFIG)
        journal = Journal(conn, flush_interval_ms=60_000, max_unflushed_tokens=10_000)
        journal.start()
        journal.sample_changed(sample, completed=3)
        await journal.durable()
        await journal.close()

    asyncio.run(run())
    expected = {
        "seq": 0,
        "group_index": 0,
        "state": "running",
        "finish_reason": "length",
        "error": None,
        "attempts": 1,
        "resumes": 2,
        "request_failures": 0,
        "regenerated_tokens": 7,
        "completed": 3,
    }
    conn, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
    assert snapshot.samples == {"b-0-0": expected}
    with conn:
        conn.execute("BEGIN")
        conn.execute(
            "UPDATE samples SET body = json_object('seq', 0, 'group_index', 0, 'state', 'running', "
            "'finish_reason', 'length', 'error', NULL, 'attempts', 1, 'resumes', 2, "
            "'request_failures', 0, 'regenerated_tokens', 7, 'completed', 3)"
        )
    conn.close()
    conn, snapshot = open_journal(str(tmp_path / "j.db"), CONFIG)
    conn.close()
    assert snapshot.samples == {"b-0-0": expected}


def test_writes_that_fail_are_held_in_order_and_written_once_they_can_leaving_no_gap(
    tmp_path, monkeypatch, caplog
):
    """SQLite's page limit stands in for a full disk (the manager's test fills a real one): the rounds
    that fail are kept and tried again, so the tokens read back run on with no gap; meanwhile the
    journal names its error, logs it again while it lasts, and neither the bound nor `durable()` makes
    a caller wait."""
    monkeypatch.setattr(journal_writer, "REPORT_S", 0.0)  # every failed try logged, not every 5 s
    path = str(tmp_path / "j.db")
    sample = _sample(0)

    async def until(condition) -> None:
        while not condition():
            await asyncio.sleep(0.01)

    async def run() -> list[str | None]:
        conn, _ = open_journal(path, CONFIG)
        said: list[str | None] = []
        journal = Journal(conn, flush_interval_ms=5, max_unflushed_tokens=4, path=path, on_write=said.append)
        journal.start()
        _stream(journal, sample, 3)
        await journal.durable()
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
        journal.set_state("big", "x" * 20_000)  # a row of several pages: the file must grow
        answers = _stream(journal, sample, 10)
        await within(until(lambda: journal.error is not None), 30)
        assert journal.error == f"journal {path} cannot write (database or disk is full)"
        await within(journal.room(), 30)  # past the bound, and not waiting
        await within(journal.durable(), 30)
        assert answers[0] is False and not journal.full
        _stream(journal, sample, 5)  # noted while failing, held with the rest
        await within(until(lambda: len(said) >= 2), 30)  # tried again, failing still
        conn.execute("PRAGMA max_page_count = 1000000")  # space back
        await within(until(lambda: journal.error is None), 30)
        await journal.durable()
        await journal.close()
        return said

    with caplog.at_level(logging.ERROR, logger=journal_writer.__name__):
        said = asyncio.run(run())
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith(f"journal {path} cannot write (database or disk is full); new batches")
    assert any(", still, for " in message for message in messages[1:])
    assert said[-1] is None and all(error and "database or disk is full" in error for error in said[:-1])
    conn, snapshot = open_journal(path, CONFIG)
    conn.close()
    assert [token for chunk in snapshot.chunks["b-0-0"] for token in chunk.token_ids] == list(range(10, 28))
    assert snapshot.state["big"] == "x" * 20_000
