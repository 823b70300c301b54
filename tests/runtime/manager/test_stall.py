"""The one timer per streaming attempt that notices an engine gone silent.

Only lower bounds on time are asserted (a timer never fires early); the windows are long next to
the steps between chunks, so a loaded machine does not make a quiet stream look silent."""

from __future__ import annotations

import asyncio

from rollflow.runtime.manager.stall import StallWatch


async def _until(condition, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.01)


def test_the_watch_fires_once_after_a_whole_window_of_silence():
    async def main():
        loop = asyncio.get_running_loop()
        fired = []
        watch = StallWatch(1.0, lambda: fired.append(loop.time()))
        for _ in range(10):  # a chunk every 50 ms keeps it quiet
            await asyncio.sleep(0.05)
            watch.progressed()
        quiet, last = list(fired), loop.time()
        await _until(lambda: fired)
        await asyncio.sleep(0.1)
        return quiet, [t - last for t in fired]

    quiet, after_last = asyncio.run(main())
    assert quiet == [] and len(after_last) == 1 and after_last[0] >= 1.0


def test_an_excused_silence_gets_another_window_and_a_cancelled_watch_never_fires():
    async def main():
        loop = asyncio.get_running_loop()
        fired, excuses = [], [True]  # the first window was the manager's own silence
        started = loop.time()
        StallWatch(
            0.2, lambda: fired.append(loop.time() - started), lambda: excuses.pop() if excuses else False
        )
        cancelled = StallWatch(0.1, lambda: fired.append(-1.0))
        cancelled.cancel()
        await _until(lambda: fired)
        await asyncio.sleep(0.3)
        return fired, excuses

    fired, excuses = asyncio.run(main())
    assert excuses == [] and len(fired) == 1 and fired[0] >= 0.4  # two windows, not one
