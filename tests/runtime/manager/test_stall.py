"""Hung or queued: the one sweep that notices engines producing nothing for anyone while they have
work, and the manager's use of it.

`check` is driven with explicit clock readings. The other tests run on a real loop, where only
lower bounds on time are asserted (an engine is never taken for hung early); the manager's tests
give it engines that queue past a running limit of their own, as SGLang, vLLM and the built-in
engine do, and read what the manager did with their streams."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rollflow.runtime.engines.base import GenerateChunk
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.core.service import RolloutManager
from rollflow.runtime.manager.core.stall import StallSweep
from rollflow.runtime.wire.base import SamplingParams
from tests.runtime.manager.helpers import run_manager

WINDOW_S = 0.4


@dataclass(eq=False)
class Engine:
    heard_at: float


def test_only_engines_silent_for_a_whole_window_are_handed_on():
    quiet, silent, just_silent = Engine(9.5), Engine(8.0), Engine(9.0)
    stalled = []
    sweep = StallSweep(1.0, lambda: [quiet, silent, just_silent], stalled.append)
    sweep.check(now=10.0)
    assert stalled == [silent, just_silent]
    assert sweep.period_s == 0.25  # four checks a window: noticed at most a quarter window late


def test_an_excused_silence_gets_another_window_from_the_excuse_on():
    engine = Engine(0.0)
    stalled, excuses = [], [True]  # the first window was the manager's own silence
    sweep = StallSweep(1.0, lambda: [engine], stalled.append, lambda: excuses.pop() if excuses else False)
    sweep.check(now=1.5)
    assert stalled == [] and engine.heard_at == 1.5 and excuses == []
    sweep.check(now=2.4)
    assert stalled == []
    sweep.check(now=2.5)
    assert stalled == [engine]


def test_the_running_sweep_hands_on_a_silent_engine_after_its_window_and_spares_a_producing_one():
    async def main():
        loop = asyncio.get_running_loop()
        producing, silent = Engine(loop.time()), Engine(loop.time())
        stalled: list[tuple[Engine, float]] = []
        sweep = StallSweep(WINDOW_S, lambda: [producing, silent], lambda e: stalled.append((e, loop.time())))
        task = loop.create_task(sweep.run())
        deadline = loop.time() + 10.0
        while not stalled and loop.time() < deadline:
            await asyncio.sleep(0.02)
            producing.heard_at = loop.time()  # a chunk every 20 ms for some stream keeps it off
        task.cancel()
        return stalled, silent

    stalled, silent = asyncio.run(main())
    assert [e for e, _ in stalled] == [silent]  # handed on once (the test stops the sweep then)
    assert stalled[0][1] - silent.heard_at >= WINDOW_S


class QueueingEngine:
    """An engine client that runs `max_running` requests at a time and queues the rest first come
    first served, as an engine does past its `--max-running-requests`: a queued request gets
    nothing until a place frees. A running one gets a token every `token_interval_s`, or, once
    `hang()` is called, nothing more, ever (the engine's generation stops, its streams stay open)."""

    def __init__(self, url: str, max_running: int, token_interval_s: float) -> None:
        self.url = url
        self.token_interval_s = token_interval_s
        self._places = asyncio.Semaphore(max_running)
        self._hung = asyncio.Event()
        self.requests: list[str] = []  # the rids it was sent, in order
        self.first_request_at: float | None = None  # loop time of its first request
        self.last_token_at: float | None = None  # loop time of the last token it streamed

    def hang(self) -> None:
        self._hung.set()

    async def generate(self, rid: str, input_ids: list[int], sampling: SamplingParams):
        loop = asyncio.get_running_loop()
        self.requests.append(rid)
        if self.first_request_at is None:
            self.first_request_at = loop.time()
        async with self._places:
            for index in range(sampling.max_new_tokens):
                await asyncio.sleep(self.token_interval_s)
                if self._hung.is_set():
                    await asyncio.Event().wait()  # never produces again
                self.last_token_at = loop.time()
                last = index == sampling.max_new_tokens - 1
                yield GenerateChunk([11 + index % 50], [-0.5], "length" if last else None, 0)

    async def health(self) -> bool:
        return True

    async def load(self) -> None:
        return None  # no load report: the rule must not need one

    async def abort(self, rid: str) -> None:
        pass

    async def close(self) -> None:
        pass


def _register(manager: RolloutManager, client: QueueingEngine, capacity: int):
    return manager.registry.add(
        url=client.url,
        kind="local",
        engine_type="builtin",
        capacity=capacity,
        client=client,
        weight_version=0,
    )


async def _finish(manager: RolloutManager, samples: list[Sample], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        for sample in samples:
            while sample.state < SampleState.FINISHED:
                await manager.wait_for_update(sample)


def test_an_engine_that_queues_many_streams_while_it_produces_for_one_is_not_hung():
    """Six samples on an engine that runs one at a time, each a window and a half of tokens: the
    last waits about seven windows in the engine's queue with no token, and none of them is taken
    for hung or resumed, because the engine produces for someone throughout."""

    async def go(manager):
        client = QueueingEngine("http://127.0.0.1:9", max_running=1, token_interval_s=0.02)
        engine = _register(manager, client, capacity=6)
        params = SamplingParams(max_new_tokens=30, temperature=0)  # 0.6 s a sample
        samples = [manager.submit_sample([1, 2, 3 + i], params) for i in range(6)]
        await _finish(manager, samples)
        return engine, samples, client

    engine, samples, client = run_manager(go, ManagerConfig(engines=[], stall_timeout_s=WINDOW_S))
    assert engine.state == "healthy"
    assert all(s.state == SampleState.FINISHED and len(s.output_ids) == 30 for s in samples)
    assert [s.attempts for s in samples] == [1] * 6  # no queue wait cost a resume
    assert len(client.requests) == 6
    assert client.last_token_at - client.first_request_at >= 6 * 30 * 0.02  # the queue really waited


def test_an_engine_that_produces_for_no_one_while_it_has_streams_is_hung_and_its_samples_move():
    """An engine running one of its four samples (the other three queued) stops producing: after a
    whole window of silence, and not before, it leaves the pool and all four samples resume on a
    second engine from the tokens they had."""

    async def go(manager):
        hanging = QueueingEngine("http://127.0.0.1:9", max_running=1, token_interval_s=0.02)
        stuck = _register(manager, hanging, capacity=4)
        params = SamplingParams(max_new_tokens=40, temperature=0)
        samples = [manager.submit_sample([1, 2, 3 + i], params) for i in range(4)]
        while len(samples[0].output_ids) < 5:
            await manager.wait_for_update(samples[0])
        hanging.hang()
        healthy = QueueingEngine("http://127.0.0.1:10", max_running=4, token_interval_s=0.001)
        _register(manager, healthy, capacity=4)
        await _finish(manager, samples)
        return stuck, samples, hanging, healthy

    stuck, samples, hanging, healthy = run_manager(go, ManagerConfig(engines=[], stall_timeout_s=WINDOW_S))
    assert stuck.state == "failed"
    assert healthy.first_request_at - hanging.last_token_at >= WINDOW_S  # moved only after a window
    assert all(s.state == SampleState.FINISHED and len(s.output_ids) == 40 for s in samples)
    assert all(s.attempts == 2 for s in samples)
    running, *queued = samples
    # the running sample kept its tokens from the hung engine; the queued ones had none to keep
    assert [(span.engine_id, span.start) for span in running.spans] == [
        (stuck.engine_id, 0),
        (stuck.engine_id + 1, running.spans[1].start),
    ]
    assert running.spans[1].start >= 5
    assert all(len(s.spans) == 1 and s.spans[0].engine_id != stuck.engine_id for s in queued)
