"""The one sweep that notices silent streams: which streams it hands on, when, and its excuse.

`check` is driven with explicit clock readings; one test runs the sweep on a real loop, where only
lower bounds on time are asserted (a sweep never hands a stream on early)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rollflow.runtime.manager.stall import StallSweep


@dataclass(eq=False)
class Stream:
    heard_at: float


def test_only_streams_silent_for_a_whole_window_are_handed_on():
    quiet, silent, just_silent = Stream(9.5), Stream(8.0), Stream(9.0)
    stalled = []
    sweep = StallSweep(1.0, lambda: [quiet, silent, just_silent], stalled.append)
    sweep.check(now=10.0)
    assert stalled == [silent, just_silent]
    assert sweep.period_s == 0.25  # four checks a window: noticed at most a quarter window late


def test_an_excused_silence_gets_another_window_from_the_excuse_on():
    stream = Stream(0.0)
    stalled, excuses = [], [True]  # the first window was the manager's own silence
    sweep = StallSweep(1.0, lambda: [stream], stalled.append, lambda: excuses.pop() if excuses else False)
    sweep.check(now=1.5)
    assert stalled == [] and stream.heard_at == 1.5 and excuses == []
    sweep.check(now=2.4)
    assert stalled == []
    sweep.check(now=2.5)
    assert stalled == [stream]


def test_the_running_sweep_hands_on_a_silent_stream_after_its_window_and_spares_a_chatty_one():
    async def main():
        loop = asyncio.get_running_loop()
        chatty, silent = Stream(loop.time()), Stream(loop.time())
        stalled: list[tuple[Stream, float]] = []
        sweep = StallSweep(0.4, lambda: [chatty, silent], lambda s: stalled.append((s, loop.time())))
        task = loop.create_task(sweep.run())
        deadline = loop.time() + 10.0
        while not stalled and loop.time() < deadline:
            await asyncio.sleep(0.02)
            chatty.heard_at = loop.time()  # a chunk every 20 ms keeps it quiet
        task.cancel()
        return stalled, silent

    stalled, silent = asyncio.run(main())
    assert [s for s, _ in stalled] == [silent]  # handed on once (the test stops the sweep then)
    assert stalled[0][1] - silent.heard_at >= 0.4
