"""The manager's core: queue, dispatch, stream, record, resume. No HTTP here (see server.py).

Life of a sample:

    WAITING in the queue -> dispatched: a router picks among eligible engines
    -> RUNNING: tokens stream in and are recorded as they arrive
    -> the engine finishes it (FINISHED), or the attempt ends early (engine died, hung,
       was removed, drained, or the local budget ran out) and the sample goes back to the
       front of the queue with prompt + generated tokens as its next input and
       `max_new_tokens` reduced by what it already has.
    A client's abort (`abort_sample`, or an abort a client sent the engine itself, as slime's
    abort_all does) is no failure: the sample ends there, FINISHED with finish_reason "abort"
    and the tokens it has, and is not resumed.

The manager is put together from parts with one job each: the engine fleet (fleet.py: registry,
health, configured engines' start-up wait, the stall sweep, breaker, weights, loads), the batch
book (batches.py: the batches, and their hand-outs journaled), the local budgets (offload.py: the
trainer's step reports and the batches' budgets, and what moves when one runs out), the dispatcher
(dispatcher.py: the queue, snapshot -> router -> attempt), and the attempt (attempt.py: one engine
stream reduced into its sample, ending in an `Outcome`). This class holds the samples' lives between them: it decides,
from an attempt's outcome, whether the sample finishes, resumes or fails, and tells the journal
(journal_events.py) every change a restart must see.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from rollflow.policy.routing import Router
from rollflow.runtime.engines.base import GenerateChunk
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core import attempt
from rollflow.runtime.manager.core.attempt import Outcome
from rollflow.runtime.manager.core.batches import Batch, BatchBook, sample_sampling
from rollflow.runtime.manager.core.dispatcher import Dispatcher
from rollflow.runtime.manager.core.fleet import EngineFleet
from rollflow.runtime.manager.core.loop_watch import LoopWatch
from rollflow.runtime.manager.core.metrics import ManagerMetrics
from rollflow.runtime.manager.core.offload import LocalBudgets
from rollflow.runtime.manager.core.registry import EngineRecord
from rollflow.runtime.manager.core.samples import Sample, SampleRun, SampleState, Watcher
from rollflow.runtime.manager.core.sessions import SessionStore
from rollflow.runtime.manager.durability import recovery
from rollflow.runtime.manager.durability.journal_events import NoJournal
from rollflow.runtime.manager.durability.journal_lock import JournalLock
from rollflow.runtime.manager.durability.request_log import RequestLog
from rollflow.runtime.manager.streams.readers import StreamReaders
from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("rollflow.manager")


class RolloutManager:
    def __init__(self, config: ManagerConfig, router: Router | None = None) -> None:
        self.config = config
        self.metrics = ManagerMetrics(before_render=self._set_gauges)
        self.fleet = EngineFleet(config, self.metrics, listener=self)
        self.registry = self.fleet.registry
        self.batches = BatchBook()
        self.dispatcher = Dispatcher(
            config, self.registry, self.batches, self.metrics, self._start_attempt, router
        )
        self.reads_cache = self.dispatcher.reads_cache  # attempts record what engines cache (view.py)
        # decodes output tokens (server.py sets it from `tokenizer:`): cuts a spanning stop at its token
        self.tokenizer: Tokenizer | None = None
        self.offload = LocalBudgets(config, self.registry, self.batches, self._move, self.dispatcher.wake)
        self._runs: dict[str, SampleRun] = {}  # sample id -> live state, while the manager tracks it
        self.journal: NoJournal = NoJournal()  # the Journal with `journal:` set, from start() on
        self.journal_lock: JournalLock | None = None  # held from start() to close()
        self.restarts = 0  # managers that ran on this journal before this one (a part of each rid)
        self._seq = itertools.count()
        # a single request's sample id: this process's random half and its arrival number (unique
        # across restarts and managers sharing an engine, with no random bytes drawn per request)
        self._id_prefix = os.urandom(8).hex()
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self._loop_watch: LoopWatch | None = None
        self.request_log = RequestLog(config.request_log) if config.request_log else None
        self.sessions = SessionStore(self)  # multi-turn sessions, restored with the batches
        # the engines' streams are read by N - 1 stream processes (`processes: N > 1`) and by relays
        self.streams = StreamReaders(config, config.processes - 1, self.metrics.stream_process_restarts)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        # kept: Python 3.11's get_running_loop() makes a getpid() system call per call
        self._loop = asyncio.get_running_loop()
        self._loop_watch = LoopWatch(self._loop)
        self.fleet.open(self._loop_watch)
        try:
            snapshot = await recovery.restore(self) if self.config.journal else None
        except BaseException:  # a journal refused (locked, read-only, corrupt...): nothing else started
            await self.fleet.close()
            raise
        await self.streams.start()  # before any attempt starts: a restored batch's samples wait
        self.spawn(self.dispatcher.run())
        self.spawn(self.fleet.health_loop())
        self.spawn(self.fleet.load_loop())
        self.spawn(self._loop_watch.run())
        self.spawn(self.fleet.stall_sweep().run())
        try:
            for index, entry in enumerate(self.config.engines):
                await self.fleet.add_configured(index, entry)
            if snapshot is not None:
                await recovery.rejoin_engines(self, snapshot)
        except BaseException:
            await self.close()  # no task or session outlives a manager that failed to start
            raise

    async def close(self) -> None:
        self.sessions.stop()
        tasks = [*self._background, *(run.task for run in self._runs.values() if run.task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.journal.close()
        if self.journal_lock is not None:
            self.journal_lock.release()
        await self.fleet.close()
        await self.streams.close()
        if self.request_log is not None:
            await asyncio.to_thread(self.request_log.close)

    def use_journal(self, journal: NoJournal, lock: JournalLock, restarts: int) -> None:
        """Keep every change in `journal` (opened under `lock`) from now on; `restarts`: the managers
        that ran on it before this one."""
        self.journal, self.journal_lock, self.restarts = journal, lock, restarts
        self.offload.journal = self.batches.journal = journal

    def journal_written(self, error: str | None) -> None:
        """The journal's word after a failed write (`error`) and once writes succeed again (None)."""
        if error is not None:
            self.metrics.journal_errors.inc()
        self.metrics.journal_state.set(0 if error is None else 1)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` in the background, kept until it ends and cancelled when the manager closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def loop_time(self) -> float:
        return self._loop.time()

    def open_stream(
        self, engine: EngineRecord, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk]:
        stream = self.streams.open(engine, rid, input_ids, sampling)
        return stream if stream is not None else engine.client.generate(rid, input_ids, sampling)

    @property
    def http(self) -> aiohttp.ClientSession:
        """The manager's one HTTP session."""
        return self.fleet.http

    # ------------------------------------------------- what the fleet tells (FleetListener)

    def displace(self, engine: EngineRecord, reason: str) -> None:
        for sample_id in list(engine.running):
            self._move(sample_id, reason)

    def room_changed(self) -> None:
        self.dispatcher.wake()

    def remote_engine_joined(self) -> None:
        self.offload.remote_engine_joined()

    def engine_recorded(self, engine: EngineRecord) -> None:
        if engine.relay is not None:
            self.streams.use_relay(engine.relay)
        self.journal.engine_registered(engine.url, recovery.engine_record(engine))
        self.journal.set_state("next_engine_id", self.registry.next_id)

    def engine_forgotten(self, engine: EngineRecord) -> None:
        self.journal.engine_removed(engine.url)

    # ------------------------------------------------------------------ engines

    async def drain_engine(self, engine: EngineRecord, reason: str) -> int:
        """End every attempt running on an engine already out of routing; the samples resume
        elsewhere from their tokens. Returns once all of them have left it: how many moved (an
        attempt whose last tokens came in before its move took effect finished instead)."""
        running = [self._runs[s].sample for s in engine.running if s in self._runs]
        self.displace(engine, reason)
        await self.attempts_ended([sample.sample_id for sample in running])
        return sum(sample.state < SampleState.FINISHED for sample in running)

    async def attempts_ended(self, sample_ids: list[str]) -> None:
        """Return once the attempts running now for these samples have ended (moved or finished)."""
        runs = [self._runs.get(s) for s in sample_ids]
        tasks = [run.task for run in runs if run is not None and run.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    def _set_gauges(self) -> None:
        self.metrics.set_gauges(self.registry.all(), len(self.dispatcher), self.streams.readers_up())
        self.metrics.journal_unflushed_tokens.set(self.journal.unflushed_tokens)

    # ------------------------------------------------------------------ samples

    def submit_sample(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        allow_off_policy: bool = False,
        sample_id: str | None = None,
        session_id: str | None = None,
        pinned_version: int | None = None,
        watcher: Watcher | None = None,
    ) -> Sample:
        """One request a caller waits on; a session's turn names its session (routed by the session
        router) and the weight version the session holds to. `watcher` is told of each update
        (default: an asyncio.Event, which `wait_for_update` waits on)."""
        seq = next(self._seq)
        sample = Sample(
            seq=seq,
            sample_id=sample_id or f"{self._id_prefix}{seq:016x}",
            prompt_ids=list(prompt_ids),
            sampling=sampling,
            allow_off_policy=allow_off_policy,
            session_id=session_id,
            pinned_version=pinned_version,
        )
        self._runs[sample.sample_id] = SampleRun(sample, watcher=watcher or asyncio.Event())
        self.dispatcher.enqueue(sample, wake=False)
        self.dispatcher.dispatch()  # routed now rather than a loop turn later: a request's latency is the manager's
        self.dispatcher.wake_if_waiting()  # no engine had room: the dispatch loop tries again when one has
        return sample

    def submit_batch(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        allow_off_policy: bool = False,
        batch_id: str | None = None,
    ) -> Batch:
        """A batch of `n` samples per prompt; `batch_id` (the client's, so that a retried submission
        finds its batch) must be new."""
        batch_id = batch_id or uuid.uuid4().hex[:12]

        def new_sample(sample_id: str, prompt: list[int], group: int, index: int) -> Sample:
            return Sample(
                seq=next(self._seq),
                sample_id=sample_id,
                prompt_ids=list(prompt),
                sampling=sample_sampling(sampling, group, index),
                allow_off_policy=allow_off_policy,
                batch_id=batch_id,
                group_index=group,
            )

        budget = self.offload.budget_s
        batch = Batch.of_prompts(batch_id, prompts, n, budget, new_sample)
        self.batches.add(batch)
        for sample in batch.samples:
            self._runs[sample.sample_id] = SampleRun(sample)
        submission = recovery.batch_submission(prompts, n, sampling, allow_off_policy, budget)
        self.journal.batch_submitted(batch_id, submission, batch.samples)
        if budget is not None:
            self.offload.run_out(batch, budget)
        self.dispatcher.enqueue_all(batch.samples)
        return batch

    def restore_batch(self, batch: Batch, running: set[str], budget_left_s: float | None) -> None:
        """A batch from the journal: held again, its unfinished samples carried on by the path each
        was on (`running`: the ids of those cut off mid-attempt), its budget's rest run out."""
        self.batches.add(batch)
        for sample in batch.samples:
            if sample.state < SampleState.FINISHED:
                self._runs[sample.sample_id] = SampleRun(sample)
                self._carry_on(sample, running)
        if budget_left_s is not None:
            self.offload.run_out(batch, budget_left_s)

    def restore_turn(self, sample: Sample, running: set[str]) -> None:
        """A session's turn from the journal, carried on as a batch's sample is."""
        self._runs[sample.sample_id] = SampleRun(sample, watcher=asyncio.Event())
        self._carry_on(sample, running)

    def restore_sequence(self, next_seq: int) -> None:
        """Number new samples from `next_seq` on (the restored ones hold those before)."""
        self._seq = itertools.count(next_seq)

    def _carry_on(self, sample: Sample, running: set[str]) -> None:
        """An unfinished restored sample goes on by the path it was on when the manager stopped."""
        if sample.finish_reason is not None:  # its last tokens ended it; the manager died before noting it
            self._finish(sample)
        elif sample.sample_id in running:  # cut off mid-attempt: resumed as from a failed engine
            self._resume(sample, recovery.RESTART_REASON)
        else:  # queued (its tokens, if any, are part of its next input all the same)
            self.dispatcher.enqueue(sample)

    def forget_batch(self, batch_id: str, deleted: str | None = None) -> None:
        """Drop a batch the trainer is done with (delivered, or no longer wanted: its unfinished
        samples stop). `deleted` says why a batch was dropped unfinished: its waiting `next` calls
        and sample streams end with that message."""
        batch = self.batches.remove(batch_id, deleted)
        self.journal.batch_gone(batch_id)
        for sample in batch.samples:
            if sample.state < SampleState.FINISHED:
                self._move(sample.sample_id, "cancelled")
                sample.state = SampleState.FAILED
                sample.error = "batch cancelled"
            self._runs.pop(sample.sample_id, None)
        self.dispatcher.discard(lambda sample: sample.batch_id != batch_id)

    async def wait_for_update(self, sample: Sample) -> None:
        """Return once the sample has new tokens or a final state."""
        event = self._runs[sample.sample_id].watcher
        await event.wait()
        event.clear()

    def release(self, sample: Sample) -> None:
        """A single request's caller is done with it (finished or disconnected)."""
        if sample.state < SampleState.FINISHED:
            self._move(sample.sample_id, "cancelled")
            sample.state = SampleState.FAILED
            sample.error = "client went away"
            self.dispatcher.discard(lambda queued: queued is not sample)
        self._runs.pop(sample.sample_id, None)

    def notify(self, sample: Sample) -> None:
        """Tell whoever waits on the sample (a single request's caller) that it changed."""
        run = self._runs.get(sample.sample_id)
        if run is not None and run.watcher is not None:
            run.watcher.set()

    # ------------------------------------------------------------------ attempts

    def _rid(self, sample: Sample) -> str:
        """The engine's request id of the sample's current attempt, unique across manager restarts."""
        rid = f"{sample.sample_id}.{sample.attempts}"
        return f"{rid}.r{self.restarts}" if self.restarts else rid

    def _start_attempt(self, sample: Sample, engine: EngineRecord) -> None:
        sample.begin_attempt(engine.engine_id)
        if not engine.running:  # the stall sweep's clock starts when an idle engine is given work
            engine.heard_at = self._loop.time()
        if self.reads_cache:  # the record's only reader: routers that never read it pay nothing
            engine.prefixes.sent(sample.prompt_ids + sample.output_ids)  # a resume sends its tokens too
        engine.dispatched(
            sample.sample_id, len(sample.prompt_ids) + len(sample.output_ids), sample.remaining_tokens
        )
        self.journal.attempt_started(sample, self._rid(sample), engine.url)
        run = self._runs[sample.sample_id]
        run.task = self._loop.create_task(self._run_attempt(run, engine))

    def _move(self, sample_id: str, reason: str) -> None:
        """End a running attempt early; `_run_attempt` puts the sample back in the queue."""
        run = self._runs.get(sample_id)
        task = run.task if run is not None else None
        if task is None or task is asyncio.current_task():
            return  # no attempt, or the attempt that noticed the failure resumes its own sample
        if not task.done() and run.move_reason is None:
            run.move_reason = reason
            task.cancel()

    async def _run_attempt(self, run: SampleRun, engine: EngineRecord) -> None:
        """Run one attempt, then decide from its outcome: finish, resume elsewhere, or fail."""
        sample = run.sample
        try:
            outcome, moved_for = await attempt.run(self, run, engine, self._rid(sample))
        finally:
            engine.ended(sample.sample_id)
            run.task = None
            self.journal.attempt_ended(sample)
            self.dispatcher.wake_if_waiting()  # the engine has room again for what waits
        if outcome is Outcome.FINISHED:
            self._finish(sample)
        elif outcome is Outcome.CLIENT_ABORT:
            self._end_aborted(sample, sample.error or "aborted by request")
        elif outcome is Outcome.REJECTED:  # the request itself is bad: another engine would refuse it too
            sample.state = SampleState.FAILED
            sample.refused = True
            self._complete(sample)
        elif outcome is Outcome.REQUEST_FAILED and not self._note_request_failure(sample):
            sample.state = SampleState.FAILED
            log.warning("sample %s failed: %s", sample.sample_id, sample.error)
            self._complete(sample)
        elif outcome is not Outcome.CANCELLED:
            self._resume(sample, moved_for or outcome.value)

    def _note_request_failure(self, sample: Sample) -> bool:
        """Count a request an engine failed; True while the sample may try another engine (up to
        `request_failures_to_fail` failures)."""
        sample.request_failures += 1
        return sample.request_failures < self.config.request_failures_to_fail

    def _resume(self, sample: Sample, reason: str) -> None:
        sample.resumes += 1
        self.metrics.resumed_samples.labels(reason).inc()
        if self.config.resume == "restart" and sample.output_ids:
            self.metrics.regenerated_tokens.inc(len(sample.output_ids))
            sample.discard_output()
            self.journal.output_discarded(sample)
        if sample.attempts >= self.config.max_attempts:
            sample.state = SampleState.FAILED
            sample.error = f"gave up after {sample.attempts} attempts (last: {reason})"
            log.error("sample %s: %s", sample.sample_id, sample.error)
            self._complete(sample)
            return
        log.info(
            "sample %s resumes (%s) with %d tokens kept", sample.sample_id, reason, len(sample.output_ids)
        )
        self._runs[sample.sample_id].resumed_at = asyncio.get_running_loop().time()
        self.journal.sample_changed(sample)
        self.dispatcher.enqueue(sample, front=True)

    def abort_sample(self, sample: Sample, message: str = "aborted by request") -> None:
        """A client's abort (`/abort_request`): the sample ends now, FINISHED with finish_reason
        "abort" and the tokens it has; it is not resumed anywhere."""
        if sample.state >= SampleState.FINISHED:
            return
        sample.error = message
        run = self._runs.get(sample.sample_id)
        if run is not None and run.task is not None and not run.task.done():
            # `_run_attempt` aborts it on its engine and ends it, whatever move was pending
            run.move_reason = "client_abort"
            run.task.cancel()
            return
        self.dispatcher.discard(lambda queued: queued is not sample)
        self._end_aborted(sample, message)

    def _end_aborted(self, sample: Sample, message: str) -> None:
        sample.state = SampleState.FINISHED
        sample.finish_reason = "abort"
        sample.error = message
        log.info("sample %s aborted with %d tokens: %s", sample.sample_id, len(sample.output_ids), message)
        self._complete(sample)

    def _finish(self, sample: Sample) -> None:
        sample.state = SampleState.FINISHED
        sample.error = None  # an earlier attempt's request error, outlived
        self._complete(sample)

    def _complete(self, sample: Sample) -> None:
        sample.engine_id = None
        run = self._runs.get(sample.sample_id)
        if run is not None and run.watcher is None:
            del self._runs[sample.sample_id]  # a batch's sample: its batch holds it from here on
        self.metrics.finished_samples[sample.state] += 1
        if self.request_log is not None:
            self.request_log.record(sample)
        batch = self.batches.get(sample.batch_id)
        if batch is not None:
            self.journal.sample_changed(sample, completed=batch.sample_completed(sample))
        self.notify(sample)
