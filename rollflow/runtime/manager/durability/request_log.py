"""The manager's opt-in request log (`request_log: PATH`): one JSON line per sample that ended.

Each line holds what the simulator needs to replay the run and what it is judged against: when
the sample arrived, when its first token came and when it finished (wall-clock seconds,
`time.time()`), its prompt and output lengths, and every span with its engine and times.
`rollflow sim replay --from-manager-log PATH` reads it back.

A thread of its own owns the file; the event loop only hands it a dict, so a slow disk never
stalls token streaming.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from pathlib import Path

from rollflow.errors import UserError
from rollflow.runtime.manager.core.samples import Sample

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def sample_entry(sample: Sample, finished_at: float) -> dict:
    """The log line of one sample that ended at `finished_at`."""
    return {
        "version": FORMAT_VERSION,
        "sample_id": sample.sample_id,
        "batch_id": sample.batch_id,
        "state": sample.state.name.lower(),
        "finish_reason": sample.finish_reason,
        "arrived_at": sample.arrived_at,
        "first_token_at": sample.first_token_at,
        "finished_at": finished_at,
        "prompt_tokens": len(sample.prompt_ids),
        "output_tokens": len(sample.output_ids),
        "attempts": sample.attempts,
        "resumes": sample.resumes,
        "spans": [
            {
                "engine_id": span.engine_id,
                "engine_url": span.engine_url,
                "attempt": span.attempt,
                "start": span.start,
                "end": span.end,
                "started_at": span.started_at,
                "first_token_at": span.first_token_at,
                "ended_at": span.ended_at,
            }
            for span in sample.spans
        ],
    }


class RequestLog:
    """Appends sample entries to a JSONL file from a writer thread; `close` drains and joins it."""

    def __init__(self, path: str) -> None:
        try:
            self._file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - closed by the writer
        except OSError as exc:
            raise UserError(f"request_log: cannot open {path}: {exc.strerror}") from None
        self.path = path
        self._queue: queue.SimpleQueue[dict | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write_loop, name="request-log", daemon=True)
        self._thread.start()

    def record(self, sample: Sample) -> None:
        """Log a sample that just ended (finished or failed); called on the event loop."""
        self._queue.put(sample_entry(sample, time.time()))

    def close(self) -> None:
        """Write what is queued, then close the file (blocks until the writer is done)."""
        self._queue.put(None)
        self._thread.join()

    def _write_loop(self) -> None:
        failed = False
        while (entry := self._queue.get()) is not None:
            if failed:
                continue  # keep draining, so the queue does not grow for the rest of the run
            try:
                self._file.write(json.dumps(entry) + "\n")
                if self._queue.empty():
                    self._file.flush()  # lines reach the file as samples end, in batches under load
            except OSError as exc:
                log.error("request log %s: writing failed (%s); no more samples are logged", self.path, exc)
                failed = True
        try:
            self._file.close()
        except OSError as exc:
            log.error("request log %s: closing failed (%s)", self.path, exc)
