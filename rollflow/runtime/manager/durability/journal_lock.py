"""One manager per journal: an exclusive lock on a file beside the journal (`<journal>.lock`), taken
before the journal is read or touched, and held until the process ends (the kernel lets go of it when
the process dies, kill -9 included, so a restart never finds a stale lock).

The lock is `flock` on a file of its own (SQLite's own POSIX locks on the journal are per transaction,
not per manager): the holder writes its pid and address into it, so a second manager can say whom it
found there, and the journal is not touched before the lock is held.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from rollflow.errors import UserError


class JournalLocked(UserError):
    """Another live manager holds the journal."""


class JournalUnwritable(UserError):
    """The journal (or its folder) cannot be written: a read-only file system, or no permission."""


def unwritable(path: str, what: str, exc: BaseException) -> JournalUnwritable:
    """The one message for a journal that cannot be written at start, whatever noticed it."""
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        fix = "remount it read-write"
    else:
        fix = "make the journal, its -wal and -shm files and its folder writable by this user"
    return JournalUnwritable(
        f"journal {path} cannot be written ({what}: {exc.strerror if isinstance(exc, OSError) else exc}); "
        f"{fix}, or point --journal (config key `journal`) at a writable place"
    )


class JournalLock:
    """The held lock; `release` (or the process's end) lets the next manager in."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, path: str, host: str, port: int) -> JournalLock:
        """Lock the journal at `path` for this process, listening on `host:port`; blocking for no longer
        than the open (run off the loop). Raises JournalLocked naming the holder when another manager
        has it, JournalUnwritable when the lock file cannot be made."""
        lock_path = Path(f"{path}.lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise unwritable(path, f"its lock file {lock_path}", exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise JournalLocked(
                f"journal {path} is in use by another manager ({holder}); stop that one first, or give "
                "this one a journal of its own (--journal)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host, "port": port}).encode(), 0)
        return cls(fd)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the lock goes with the file's last descriptor
            self._fd = -1


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says."""
    try:
        record = json.loads(os.pread(fd, 4096, 0))
        return f"pid {record['pid']}, listening on {record['host']}:{record['port']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid and port not yet written"  # it took the lock a moment ago
