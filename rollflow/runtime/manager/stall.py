"""One timer per streaming attempt that notices an engine gone silent.

A stream whose engine sends nothing for `timeout_s` is hung. Rather than race every chunk read
against a timeout (a task, a future and a timer per chunk, on the manager's hottest path), an
attempt notes each chunk with `progressed()` (one clock read) and a single timer, re-armed only
when it comes due, calls `on_stall` once the silence has lasted the whole window, unless
`excuse()` says the silence was the manager's own (its event loop was blocked), which gives the
stream another window. The pending read is never cancelled by the watch itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class StallWatch:
    def __init__(
        self, timeout_s: float, on_stall: Callable[[], None], excuse: Callable[[], bool] = lambda: False
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout_s
        self._on_stall = on_stall
        self._excuse = excuse
        self._last = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._last + timeout_s, self._due)

    def progressed(self) -> None:
        """The stream sent something now."""
        self._last = self._loop.time()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _due(self) -> None:
        now = self._loop.time()
        silent_until = self._last + self._timeout
        if silent_until > now:  # something came meanwhile: wait for the rest of the new window
            self._handle = self._loop.call_at(silent_until, self._due)
        elif self._excuse():
            self._last = now
            self._handle = self._loop.call_at(now + self._timeout, self._due)
        else:
            self._handle = None
            self._on_stall()
