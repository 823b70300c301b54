"""One attempt of a sample on one engine: the engine's stream reduced into the sample.

An attempt records what arrives (tokens and their log-probs, text, the engine's weight version,
cached prompt tokens) and says how it ended as an `Outcome`; what happens next (the sample
finishes, resumes elsewhere, or fails) is the manager's decision, made from that outcome alone.
What an attempt needs of the manager is `AttemptHost`: nothing else reaches in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineRejectedError, GenerateChunk, RequestFailedError
from rollflow.runtime.engines.http import ENGINE_ERRORS
from rollflow.runtime.manager.durability.stops import SpanningStop
from rollflow.runtime.manager.streams.wire import StreamProcessLost
from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.core.fleet import EngineFleet
    from rollflow.runtime.manager.core.metrics import ManagerMetrics
    from rollflow.runtime.manager.core.registry import EngineRecord
    from rollflow.runtime.manager.core.samples import Sample, SampleRun
    from rollflow.runtime.manager.durability.journal_events import NoJournal

log = logging.getLogger("rollflow.manager")


class Outcome(StrEnum):
    """How an attempt ended. A resumed sample's reason (the `reason` label of
    `rollflow_resumed_samples_total`) is the outcome's value, or the move's reason for MOVED."""

    FINISHED = "finished"  # the engine finished the sample, or the manager found its stop string
    ENGINE_FAILED = "engine_failed"  # the stream broke: the engine is retired, the sample resumes
    REJECTED = "rejected"  # the engine refused the request as bad: another would refuse it too
    REQUEST_FAILED = "request_failed"  # the engine says the request failed: tried elsewhere, then failed
    CLIENT_ABORT = "client_abort"  # a client aborted it: it ends with the tokens it has
    CANCELLED = "cancelled"  # its caller or batch went away: nothing more to do
    MOVED = "moved"  # the manager ended it early (`SampleRun.move_reason` says why): it resumes
    STREAM_LOST = "stream_process_lost"  # the stream process reading it died: it resumes


# a move that ends an attempt with nothing left to resume: the sample ends or is gone
MOVE_OUTCOMES = {"cancelled": Outcome.CANCELLED, "client_abort": Outcome.CLIENT_ABORT}


class AttemptHost(Protocol):
    """What an attempt asks of the manager."""

    config: ManagerConfig
    metrics: ManagerMetrics
    journal: NoJournal  # or the Journal
    fleet: EngineFleet
    tokenizer: Tokenizer | None
    reads_cache: bool  # the router reads the engines' cached prefixes: record what they cache

    def loop_time(self) -> float: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...

    def notify(self, sample: Sample) -> None: ...

    def open_stream(
        self, engine: EngineRecord, rid: str, input_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[GenerateChunk]:
        """The engine's stream of the attempt: read here, or by a stream process."""
        ...


async def run(
    host: AttemptHost, run: SampleRun, engine: EngineRecord, rid: str
) -> tuple[Outcome, str | None]:
    """Stream one attempt until it ends: its outcome, and the reason of the manager's move when the
    manager ended it (`SampleRun.move_reason`; the engine is asked to drop the request then)."""
    try:
        return await stream(host, run, engine, rid), None
    except asyncio.CancelledError:
        moved_for, run.move_reason = run.move_reason, None
        if moved_for is None:
            raise  # the manager is shutting down
        asyncio.current_task().uncancel()
        host.spawn(abort_quietly(engine, rid, host.config.connect_timeout_s))
        return MOVE_OUTCOMES.get(moved_for, Outcome.MOVED), moved_for
    except Exception as exc:  # a fault of the manager's own code: the sample must end, not hang
        log.exception("attempt %s on engine %d failed unexpectedly", rid, engine.engine_id)
        run.sample.error = f"internal error reading engine {engine.engine_id}'s answer: {exc!r}"
        return Outcome.REQUEST_FAILED, None  # tried elsewhere, then failed with this error


async def stream(host: AttemptHost, run: SampleRun, engine: EngineRecord, rid: str) -> Outcome:
    """Stream one attempt into its sample until it ends; the outcome says how."""
    sample = run.sample
    params = sample.attempt_sampling()
    stream = host.open_stream(engine, rid, sample.prompt_ids + sample.output_ids, params)
    # an engine sees only its own text: a stop string begun before a resume is the manager's to find
    spanning = SpanningStop(sample.engine_text, params.stop) if sample.output_ids and params.stop else None
    try:
        while True:
            try:
                chunk = await anext(stream)
            except StopAsyncIteration:
                host.fleet.retire(engine, "stream_ended")
                return Outcome.ENGINE_FAILED
            except EngineRejectedError as exc:
                sample.error = f"engine {engine.engine_id} refused the request: {exc}"
                return Outcome.REJECTED
            except StreamProcessLost as exc:  # the engine is not at fault: it keeps its place
                log.warning("%s; sample %s resumes", exc, sample.sample_id)
                host.spawn(abort_quietly(engine, rid, host.config.connect_timeout_s))
                return Outcome.STREAM_LOST
            except RequestFailedError as exc:
                # the engine is alive and says this request failed: another engine may agree
                sample.error = f"engine {engine.engine_id} failed the request: {exc}"
                return Outcome.REQUEST_FAILED
            except ENGINE_ERRORS as exc:
                log.warning("engine %d failed on %s: %s", engine.engine_id, rid, exc)
                host.fleet.retire(engine, "stream_error")
                return Outcome.ENGINE_FAILED
            engine.heard_at = host.loop_time()  # it produces for someone: not hung
            if chunk.weight_version is not None:
                engine.weight_version = chunk.weight_version
            if chunk.text is not None:
                sample.engine_texts[sample.attempts] = chunk.text
            if chunk.cached_tokens is not None:
                sample.cached_by_attempt[sample.attempts] = chunk.cached_tokens
            tokens = chunk.token_ids[: sample.remaining_tokens]
            reason = chunk.finish_reason
            ended = reason != "abort" and (reason is not None or len(tokens) >= sample.remaining_tokens)
            if spanning is not None and chunk.text is not None and reason is None and not ended:
                may_stop = len(sample.output_ids) + len(tokens) >= sample.sampling.min_new_tokens
                cut = spanning.find(chunk.text, may_stop)
                if cut is not None:  # as an undisturbed engine would: stop there, the text trimmed
                    ended, reason = True, "stop"
                    tokens = tokens_to_stop(host.tokenizer, sample, tokens, spanning)
                    if not params.no_stop_trim:
                        sample.trim_engine_text(cut)
                    host.spawn(abort_quietly(engine, rid, host.config.connect_timeout_s))
                elif spanning.done:
                    spanning = None
            if tokens:
                _record(host, run, engine, tokens, chunk.logprobs[: len(tokens)])
            if ended:
                sample.finish_reason = reason or "length"
            # the journal's bound: a crash may lose no more than it (wait for room below)
            journal_full = (tokens or ended) and host.journal.tokens(sample, len(tokens), ended)
            if chunk.finish_reason == "abort" and chunk.status_code is not None:
                # the engine blames the request (SGLang's status_code): another engine may agree
                why = chunk.message or "no reason given"
                sample.error = f"engine {engine.engine_id} aborted the request: {why}"
                return Outcome.REQUEST_FAILED
            if chunk.finish_reason == "abort":
                # the manager's own aborts cancel the attempt first, so someone asked the engine
                # (slime's abort_all to every worker, a pause that aborts): the client's abort
                sample.error = chunk.message or f"aborted on engine {engine.engine_id}"
                return Outcome.CLIENT_ABORT
            if ended:
                engine.consecutive_failures = 0  # the breaker's count: it served a whole sample
                if host.reads_cache:
                    engine.prefixes.sent(sample.prompt_ids + sample.output_ids)  # engines cache answers
                return Outcome.FINISHED
            if journal_full:
                await host.journal.room()
    finally:
        await stream.aclose()


def _record(
    host: AttemptHost, run: SampleRun, engine: EngineRecord, tokens: list[int], logprobs: list[float]
) -> None:
    sample = run.sample
    if run.resumed_at is not None:
        host.metrics.resume_delay.observe(host.loop_time() - run.resumed_at)
        run.resumed_at = None
    sample.record(engine.engine_id, engine.url, engine.weight_version, tokens, logprobs)
    engine.progressed(sample.sample_id, sample.remaining_tokens)
    engine.tokens_generated += len(tokens)
    engine.window_tokens += len(tokens)
    host.metrics.generated_tokens[engine.engine_id] += len(tokens)
    host.notify(sample)


def tokens_to_stop(
    tokenizer: Tokenizer | None, sample: Sample, tokens: list[int], spanning: SpanningStop
) -> list[int]:
    """The event's tokens up to the one that completes a spanning stop string, as an engine that
    checks after each token would keep them. A busy engine sends several tokens in one event, and
    only decoding tells which of them completed it: without a tokenizer the event is kept whole."""
    if len(tokens) <= 1 or tokenizer is None:
        return tokens
    earlier = tokenizer.decode(sample.output_ids)
    for keep in range(1, len(tokens)):
        if spanning.completed_in(tokenizer.decode(sample.output_ids + tokens[:keep])[len(earlier) :]):
            return tokens[:keep]
    return tokens


async def abort_quietly(engine: EngineRecord, rid: str, timeout_s: float) -> None:
    """Ask the engine to drop a request the manager no longer reads; an engine that cannot answer
    has dropped it anyway."""
    if engine.state in ("healthy", "updating", "releasing"):
        try:
            await within(engine.client.abort(rid), timeout_s)
        except (*ENGINE_ERRORS, TimeoutError) as exc:
            log.debug("abort of %s on engine %d failed: %s", rid, engine.engine_id, exc)
