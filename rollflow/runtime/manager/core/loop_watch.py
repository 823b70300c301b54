"""Whether the manager's own event loop was blocked: an engine that seemed silent meanwhile (a big
body parsed, a starved CPU) may have answered into an unread socket, so silence then is no failure."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("rollflow.manager")

LOOP_BEAT_S = 0.25
LOOP_BLOCKED_S = 1.0
"""A beat this much later than due means the loop was blocked, not an engine silent."""


class LoopWatch:
    """Beats every LOOP_BEAT_S and notes when a beat came late."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._last_tick = loop.time()
        self._blocked_at = float("-inf")  # when the loop was last seen blocked

    async def run(self) -> None:
        while True:
            await asyncio.sleep(LOOP_BEAT_S)
            now = self._loop.time()
            if now - self._last_tick > LOOP_BEAT_S + LOOP_BLOCKED_S:
                self._blocked_at = now
                log.warning(
                    "the manager's event loop was blocked for %.1fs", now - self._last_tick - LOOP_BEAT_S
                )
            self._last_tick = now

    def blocked_now(self) -> bool:
        """The last beat is overdue: the loop is blocked now, before a beat notes it."""
        return self._loop.time() - self._last_tick > LOOP_BEAT_S + LOOP_BLOCKED_S

    def blocked_since(self, since: float) -> bool:
        """The loop was blocked at loop time `since` or later, or is now."""
        return self._blocked_at >= since or self.blocked_now()

    def blocked_within(self, window_s: float) -> bool:
        """The loop was blocked within the last `window_s` seconds, or is now."""
        return self.blocked_since(self._loop.time() - window_s)
