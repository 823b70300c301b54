"""One sweep that notices hung engines: an engine is hung when it produces nothing for anyone
while it has work.

Silence is counted per engine, not per stream. With the manager's `capacity` above an engine's
own running limit, the engine queues the rest: a queued request sends nothing, for minutes on a
busy GPU, while the engine streams tokens to the requests it runs. So each engine notes in
`heard_at` the loop time of the last chunk it sent to any of the manager's streams (or of the
moment it was given work while it had none), and one periodic check, `checks_per_window` times
per window, hands every engine with work that was silent for a whole window to `on_stall`,
unless `excuse()` says the silence was the manager's own (its event loop was blocked), which
gives those engines another window. A hang is so noticed between one window and a window and a
period after the engine's last chunk; a request waiting in a producing engine's queue is never
taken for hung, however long it waits.

The chunk path pays one float store (the engine's, where it used to be the stream's); the sweep
looks at engines, a handful, rather than at every stream. The pending reads are never cancelled
by the sweep itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol


class Watched(Protocol):
    # loop time of the engine's last chunk to any stream, or of when it was given work while idle
    heard_at: float


class StallSweep:
    def __init__(
        self,
        timeout_s: float,
        busy: Callable[[], Iterable[Watched]],
        on_stall: Callable[[Watched], None],
        excuse: Callable[[], bool] = lambda: False,
        checks_per_window: int = 4,
    ) -> None:
        self.timeout_s = timeout_s
        self.period_s = timeout_s / checks_per_window
        self._busy = busy  # the engines that have work (an attempt streaming from them)
        self._on_stall = on_stall
        self._excuse = excuse

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period_s)
            self.check(loop.time())

    def check(self, now: float) -> None:
        """Hand the busy engines silent for a whole window by `now` to `on_stall` (or excuse them)."""
        silent = [engine for engine in self._busy() if now - engine.heard_at >= self.timeout_s]
        if not silent:
            return
        if self._excuse():
            for engine in silent:
                engine.heard_at = now
            return
        for engine in silent:
            self._on_stall(engine)
