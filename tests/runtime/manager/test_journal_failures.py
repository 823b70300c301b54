"""A journal that cannot write says so everywhere and writes again by itself once it can, losing
nothing; one manager per journal; a read-only or corrupt journal is one line saying what to do.

The full disk is a real one: a 512 KB tmpfs the test mounts (as root; skipped otherwise)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import (
    CountingProxy,
    assert_finished_as_undisturbed,
    drain,
    manager_on_journal,
    metric,
    prompts,
    settled,
    wait_until,
    workers,
)
from tests.runtime.processes import free_port, http, start_manager

PROMPTS = prompts(4)
MAX_NEW_TOKENS = 48


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KB tmpfs, mounted for the test and unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 512 KB tmpfs (a disk to fill) needs root; run as root to include this test")
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a killed process's files


def _fill(folder: Path) -> Path:
    """Write a file until the disk is full; returns it (removing it gives the space back)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def _health(manager) -> tuple[int, dict]:
    return http("GET", manager.url + "/health")


def _one_line(process) -> str:
    """What a manager that refused to start printed: one line, no traceback."""
    assert process.proc.wait(timeout=60) == 2, process.log()
    lines = process.log().strip().splitlines()
    assert len(lines) == 1, process.log()
    return lines[0]


def _assert_exact(samples: list[dict], engine) -> None:
    """Every sample finished, with the tokens of an undisturbed run and none made twice."""
    assert len(samples) == len(PROMPTS) * 2
    assert_finished_as_undisturbed(samples, engine, MAX_NEW_TOKENS)
    assert [(s["resumes"], s["regenerated_tokens"]) for s in samples] == [(0, 0)] * len(samples)


def test_a_full_disk_is_said_everywhere_and_the_journal_writes_again_losing_nothing(
    small_disk, processes, tmp_path
):
    engine = processes.engine()
    proxy = CountingProxy(engine.url)
    journal = str(small_disk / "manager.journal")
    config = {
        "engines": [{"url": proxy.url, "engine_type": "builtin", "capacity": 8}],
        "journal": journal,
        "journal_flush_interval_ms": 200,  # few commits: the WAL only grows on a disk this small
    }
    manager = start_manager(tmp_path, config)
    client = ManagerClient(manager.url)
    try:
        batch = client.submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True)
        wait_until(lambda: metric(manager, "rollflow_generated_tokens_total") >= 8, what="tokens journaled")
        proxy.flowing.clear()  # the streams hold while the disk fills
        # no commit under way as the disk fills: one cut short by it would leave frames in the WAL that
        # its next try writes over, so that the journal could write again with the disk still full
        settled(lambda: Path(f"{journal}-wal").stat().st_size, interval_s=1.0)
        filler = _fill(small_disk)
        proxy.flowing.set()

        status, answer = wait_until(
            lambda: (h := _health(manager))[0] == 503 and h, timeout=15, what="/health to say 503"
        )
        assert answer["status"] == "journal_failing"
        assert f"journal {journal} cannot write (database or disk is full)" in answer["error"]["message"]
        assert metric(manager, "rollflow_journal_state") == 1
        assert metric(manager, "rollflow_journal_errors_total") >= 1
        status, refused = http("POST", manager.url + "/batches", {"prompts": [[1, 2]], "n": 1})
        assert status == 503 and f"journal {journal} cannot write" in refused["error"]["message"]
        status, refused = http("POST", manager.url + "/v1/sessions", {})
        assert status == 503 and f"journal {journal} cannot write" in refused["error"]["message"]
        # the running batch goes on and finishes while nothing can be written
        wait_until(lambda: batch.status()["states"].get("finished") == 8, what="the running batch to finish")
        assert _health(manager)[0] == 503
        assert metric(manager, "rollflow_journal_unflushed_tokens") > 0  # held in memory, said

        filler.unlink()  # the space comes back: the journal writes again, what it held included
        wait_until(lambda: _health(manager)[0] == 200, timeout=15, what="/health to say 200 again")
        assert metric(manager, "rollflow_journal_state") == 0
        assert len(list(batch.samples())) == 8  # its lines wait on the journal: all of it is on disk
        assert metric(manager, "rollflow_journal_unflushed_tokens") == 0
        log = manager.log()
        assert "cannot write (database or disk is full)" in log and "writes again after" in log
        relayed = proxy.relayed

        manager.kill()  # kill -9, then the same manager on the same journal
        manager.stop()
        manager = manager_on_journal(tmp_path, config, manager.port)
        _assert_exact(drain(batch), engine)
        assert proxy.relayed == relayed  # nothing generated again
        assert metric(manager, "rollflow_generated_tokens_total") == 0
    finally:
        manager.stop()
        proxy.stop()


def test_a_second_manager_on_a_live_journal_refuses_in_one_line_and_touches_nothing(processes, tmp_path):
    engine = processes.engine()
    proxy = CountingProxy(engine.url)
    journal = str(tmp_path / "manager.journal")
    config = {"engines": [{"url": proxy.url, "engine_type": "builtin", "capacity": 8}], "journal": journal}
    first = start_manager(tmp_path, config)
    try:
        proxy.flowing.clear()  # the first manager's batch is mid-stream while the second starts
        batch = ManagerClient(first.url).submit(
            PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0, ignore_eos=True
        )
        wait_until(lambda: workers(first)[proxy.url]["running"] == 8, what="the batch to run")

        second = manager_on_journal(tmp_path, config, free_port(), wait=False)
        # it refuses before it reads anything or calls any engine: its start is the CLI's imports (half a
        # second of CPU, 2.7 s on this shared machine), which a load of 20 on two cores once stretched
        # past 5 s; the wait's timeout leaves room for that
        assert second.proc.wait(timeout=30) == 2, second.log()
        assert second.log().strip().splitlines() == [
            f"rollflow: journal {journal} is in use by another manager (pid {first.proc.pid}, listening on "
            f"127.0.0.1:{first.port}); stop that one first, or give this one a journal of its own (--journal)"
        ]
        proxy.flowing.set()
        _assert_exact(drain(batch), engine)
        assert proxy.aborted == []  # the second one aborted none of the first one's requests
        assert _health(first)[0] == 200
    finally:
        first.stop()
        proxy.stop()


def test_a_journal_on_a_read_only_file_system_is_one_line(small_disk, processes, tmp_path):
    journal = str(small_disk / "manager.journal")
    processes.manager(journal=journal).stop()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    refused = manager_on_journal(tmp_path, {"journal": journal}, free_port(), wait=False)
    assert _one_line(refused) == (
        f"rollflow: journal {journal} cannot be written (its lock file {journal}.lock: Read-only file "
        "system); remount it read-write, or point --journal (config key `journal`) at a writable place"
    )


def test_an_unwritable_journal_is_one_line(processes, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("file permissions do not bind root; the read-only file system test covers root")
    journal = tmp_path / "manager.journal"
    processes.manager(journal=str(journal)).stop()
    journal.chmod(0o400)
    refused = manager_on_journal(tmp_path, {"journal": str(journal)}, free_port(), wait=False)
    line = _one_line(refused)
    assert line.startswith(f"rollflow: journal {journal} cannot be written (its file: Permission denied)")


def test_a_journal_with_corrupt_pages_is_one_line(processes, tmp_path):
    engine = processes.engine()
    journal = tmp_path / "manager.journal"
    config = {"engines": [{"url": engine.url, "engine_type": "builtin"}], "journal": str(journal)}
    manager = start_manager(tmp_path, config)
    batch = ManagerClient(manager.url).submit(PROMPTS, n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0)
    assert len(list(batch.samples())) == 8
    manager.stop()  # its last connection closed: the WAL is folded into the file and removed
    assert not Path(f"{journal}-wal").exists()
    pages = bytearray(journal.read_bytes())
    pages[4096:] = b"\xa5" * (len(pages) - 4096)  # every page but the first (the schema's)
    journal.write_bytes(pages)

    refused = manager_on_journal(tmp_path, config, free_port(), wait=False)
    line = _one_line(refused)
    assert line.startswith(f"rollflow: journal {journal} is corrupt (database disk image is malformed); ")
    assert "move it away to start afresh" in line and f"sqlite3 {journal} .recover" in line
