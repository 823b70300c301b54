"""The progress file that makes a profile resumable: `profile ops` and `profile engine` alike.

Every measurement is appended to `profile_progress.jsonl` in the output folder as soon as it is
taken, under a first line that records what is being profiled (model shape, settings). A run that
finds that file with the same header skips what it already holds, so an interrupted profile
(Ctrl-C, a crash, a kill) resumes; a different header is an error rather than a mixed table. A last
line cut short by the interruption is dropped, and that measurement is taken again.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any

from rollflow.errors import UserError

PROGRESS_FILE = "profile_progress.jsonl"


class ProgressLog:
    """Measurements keyed by a JSON-able point, read back from `out/PROGRESS_FILE` and appended to it."""

    def __init__(self, out: Path, header: dict[str, Any]) -> None:
        self.path = out / PROGRESS_FILE
        # what a header reads back as from JSON (tuples become lists), so the comparison is exact
        self.header = json.loads(json.dumps(header))
        self._valid_bytes = 0  # the file's length up to its last whole line
        self.done: dict[str, Any] = self._read()
        self.num_resumed = len(self.done)
        self._handle = None

    def __contains__(self, point: object) -> bool:
        return _key(point) in self.done

    def __getitem__(self, point: object) -> Any:
        return self.done[_key(point)]

    def __enter__(self) -> ProgressLog:
        self._handle = self.path.open("a")
        # drop a line cut short, so the next record starts a line of its own; a file without a
        # measurement (fresh, or cut short before one) starts over from its header
        self._handle.truncate(self._valid_bytes if self.done else 0)
        if not self.done:
            self._handle.write(json.dumps({"header": self.header}) + "\n")
            self._handle.flush()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._handle.close()
        self._handle = None

    def record(self, point: list | tuple, value: Any) -> None:
        """Keep `value` as the measurement of `point`, on disk before this returns."""
        self.done[_key(point)] = value
        self._handle.write(json.dumps({"point": list(point), "stats": value}) + "\n")
        self._handle.flush()

    def _read(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        done: dict[str, Any] = {}
        with self.path.open("rb") as handle:
            for number, line in enumerate(handle):
                try:
                    if not line.endswith(b"\n"):
                        raise ValueError("no end of line")
                    record = json.loads(line)
                except ValueError:
                    break  # a line cut short by the interruption: measure that point again
                if number == 0:
                    if record.get("header") != self.header:
                        raise UserError(
                            f"{self.path} holds a profile of another model or settings; "
                            "use another --out folder or delete that file to start over"
                        )
                    continue
                done[_key(record["point"])] = record["stats"]
                self._valid_bytes = handle.tell()
        return done


def _key(point: object) -> str:
    return json.dumps(list(point))
