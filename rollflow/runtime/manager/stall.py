"""One sweep that notices engines gone silent, for every streaming attempt at once.

A stream whose engine sends nothing for `timeout_s` is hung. Rather than race every chunk read
against a timeout (a task, a future and a timer per chunk), or arm a timer per attempt (made and
cancelled on every request, on the manager's hottest path), each attempt notes the loop time of
its last chunk in `heard_at`, and one periodic check, `checks_per_window` times per window, hands
every stream silent for a whole window to `on_stall`, unless `excuse()` says the silence was the
manager's own (its event loop was blocked), which gives those streams another window. A stall is
so noticed between one window and a window and a period after the last chunk. The pending read
is never cancelled by the sweep itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol


class Watched(Protocol):
    heard_at: float  # loop time of the stream's start or its last chunk


class StallSweep:
    def __init__(
        self,
        timeout_s: float,
        streams: Callable[[], Iterable[Watched]],
        on_stall: Callable[[Watched], None],
        excuse: Callable[[], bool] = lambda: False,
        checks_per_window: int = 4,
    ) -> None:
        self.timeout_s = timeout_s
        self.period_s = timeout_s / checks_per_window
        self._streams = streams
        self._on_stall = on_stall
        self._excuse = excuse

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period_s)
            self.check(loop.time())

    def check(self, now: float) -> None:
        """Hand the streams silent for a whole window by `now` to `on_stall` (or excuse them)."""
        silent = [stream for stream in self._streams() if now - stream.heard_at >= self.timeout_s]
        if not silent:
            return
        if self._excuse():
            for stream in silent:
                stream.heard_at = now
            return
        for stream in silent:
            self._on_stall(stream)
