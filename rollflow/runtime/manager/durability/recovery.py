"""A manager started on an existing journal carries on where the last one stopped.

lock the journal (off the loop)  -> refuse a journal another live manager holds, touching nothing
open the journal (off the loop)  -> refuse another config's or schema's journal, a read-only or a
                                    corrupt one
batches and samples              -> rebuilt with their journaled tokens and spans; finished samples
                                    served again, unfinished ones resumed from their tokens by the
                                    same path as an engine failure, so nothing journaled is
                                    regenerated; micro-batches handed out stay handed out
attempts running at the crash    -> aborted on their engines (POST /abort_request with their rid)
engines registered at run time   -> registered again, health-checked; one that is down waits in
                                    the circuit breaker as a failed engine would
balancer, step reports, ids      -> as they were
sessions                         -> their contexts rebuilt turn by turn; a closed one stays closed; a
                                    turn in flight resumes from its journaled tokens as a batch's
                                    sample does, and finishes whether or not its caller sends it again
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from rollflow.runtime.deadline import within
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.manager.config import EngineEntry
from rollflow.runtime.manager.core.batches import Batch, sample_sampling
from rollflow.runtime.manager.core.fleet import EngineUnavailable, normalise_url
from rollflow.runtime.manager.core.samples import Sample, SampleState, Span
from rollflow.runtime.manager.durability.journal import Journal
from rollflow.runtime.manager.durability.journal_file import JournalRefused, Snapshot, open_journal
from rollflow.runtime.manager.durability.journal_lock import JournalLock
from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from rollflow.runtime.manager.core.registry import EngineRecord
    from rollflow.runtime.manager.core.service import RolloutManager

log = logging.getLogger(__name__)

RESTART_REASON = "manager_restarted"
"""The resume reason (and `rollflow_resumed_samples_total` label) of samples a restart resumed."""

_SAMPLE_COLUMNS = ("attempts", "resumes", "request_failures", "regenerated_tokens", "finish_reason", "error")
"""The fields of a journaled sample row (journal_file.SAMPLE_FIELDS) that go back onto its Sample as they
are, under the same name."""


def batch_submission(
    prompts: list[list[int]], n: int, sampling: SamplingParams, allow_off_policy: bool, budget_s: float | None
) -> dict:
    """A batch as the journal keeps it: what was asked, and when (its local budget runs on wall time)."""
    return {
        "prompts": prompts,
        "n": n,
        "sampling": dataclasses.asdict(sampling),
        "allow_off_policy": allow_off_policy,
        "budget_s": budget_s,
        "submitted_at": time.time(),
        "offloaded": False,
    }


def engine_record(engine: EngineRecord) -> dict:
    """The journal's record of an engine: its registration (read back by `rejoin_engines`), its id and
    weight version."""
    return engine.entry().model_dump() | {
        "weight_version": engine.weight_version,
        "engine_id": engine.engine_id,
    }


async def restore(manager: RolloutManager) -> Snapshot:
    """Lock and open the manager's journal, put its state back, abort the attempts the last manager left
    running."""
    config = manager.config
    lock = await asyncio.to_thread(JournalLock.acquire, config.journal, config.host, config.port)
    try:
        conn, snapshot = await asyncio.to_thread(open_journal, config.journal, config.model_dump(mode="json"))
    except BaseException:
        lock.release()
        raise
    journal = Journal(
        conn,
        config.journal_flush_interval_ms,
        config.journal_max_unflushed_tokens,
        path=config.journal,
        on_write=manager.journal_written,
    )
    journal.start()
    manager.use_journal(journal, lock, snapshot.restarts)
    if snapshot.restarts == 0:
        return snapshot
    _restore_counters(manager, snapshot)
    for batch_id, submission in snapshot.batches.items():
        _restore_batch(manager, snapshot, batch_id, submission)
    for session_id, row in sorted(snapshot.sessions.items(), key=lambda item: item[1]["closed_at"] or 0):
        _restore_session(manager, snapshot, session_id, row)
    await _abort_left_running(manager, snapshot)
    log.info(
        "restored from journal %s (restart %d): %d batches, %d samples, %d sessions, %d engines to "
        "register again",
        config.journal,
        snapshot.restarts,
        len(snapshot.batches),
        len(snapshot.samples),
        len(snapshot.sessions),
        len(snapshot.engines),
    )
    manager.dispatcher.wake()
    return snapshot


def _restore_counters(manager: RolloutManager, snapshot: Snapshot) -> None:
    state = snapshot.state
    manager.registry.next_id = state.get("next_engine_id", 0)  # ids in journaled spans stay unique
    seqs = [row["seq"] for row in snapshot.samples.values()]
    manager.restore_sequence(max(seqs, default=-1) + 1)
    reports = state.get("step_reports")
    if reports is not None:
        manager.offload.load_state(reports)


def _sampling(journaled: dict) -> SamplingParams:
    return SamplingParams(**{k: tuple(v) if isinstance(v, list) else v for k, v in journaled.items()})


def _restore_batch(manager: RolloutManager, snapshot: Snapshot, batch_id: str, submission: dict) -> None:
    sampling = _sampling(submission["sampling"])

    def restored(sample_id: str, prompt: list[int], group: int, index: int) -> Sample:
        return _restore_sample(
            snapshot, batch_id, sample_id, prompt, sample_sampling(sampling, group, index), submission, group
        )

    batch = Batch.of_prompts(
        batch_id, submission["prompts"], submission["n"], submission["budget_s"], restored
    )
    batch.offloaded = submission["offloaded"]
    batch.handouts = snapshot.handouts.get(batch_id, [])
    completed = sorted(
        (s for s in batch.samples if s.state >= SampleState.FINISHED),
        key=lambda s: snapshot.samples[s.sample_id]["completed"],
    )
    for sample in completed:
        batch.sample_completed(sample)
    batch.packer.mark_delivered([index for handout in batch.handouts for index in handout])
    budget = submission["budget_s"]
    budget_left = (
        budget - (time.time() - submission["submitted_at"])
        if budget is not None and not batch.offloaded and not batch.done
        else None
    )
    manager.restore_batch(batch, {attempt["sample_id"] for attempt in snapshot.attempts}, budget_left)


def _restore_session(manager: RolloutManager, snapshot: Snapshot, session_id: str, row: dict) -> None:
    """A session's context, rebuilt turn by turn as it was built, and its turn in flight."""
    from rollflow.runtime.manager.core.sessions import (  # sessions imports this module
        RunningTurn,
        Session,
        Turn,
        turn_future,
    )

    session = Session(session_id, row["weight_version"], row["allow_off_policy"], closed_at=row["closed_at"])
    for entry in snapshot.session_turns.get(session_id, []):
        session.append("prompt" if not session.turns else "env", entry["input_ids"])
        sample = Sample(
            seq=entry["seq"],
            sample_id=entry["sample_id"],
            prompt_ids=list(session.context_ids),
            sampling=_sampling(entry["sampling"]),
            allow_off_policy=session.allow_off_policy,
            session_id=session_id,
            output_ids=entry["output_ids"],
            output_logprobs=entry["output_logprobs"],
            spans=[Span(**span) for span in entry["spans"]],
            state=SampleState.FINISHED,
            finish_reason=entry["finish_reason"],
            attempts=entry["attempts"],
            resumes=entry["resumes"],
            regenerated_tokens=entry["regenerated_tokens"],
            cached_by_attempt={int(k): v for k, v in entry["cached_by_attempt"].items()},
        )
        turn = Turn(len(session.turns), sample, len(session.context_ids), entry["rid"])
        session.append("output", sample.output_ids, sample.output_logprobs)
        session.turns.append(turn)
    running = None
    entry = row["running"]
    if entry is not None and row["closed_at"] is None:
        sample = Sample(
            seq=entry["seq"],
            sample_id=entry["sample_id"],
            prompt_ids=session.context_ids + entry["input_ids"],
            sampling=_sampling(entry["sampling"]),
            allow_off_policy=session.allow_off_policy,
            session_id=session_id,
            pinned_version=None if session.allow_off_policy else session.weight_version,
        )
        if entry["sample_id"] in snapshot.samples:
            _replay(snapshot, sample)
        if sample.state < SampleState.FINISHED:
            manager.restore_turn(sample, {attempt["sample_id"] for attempt in snapshot.attempts})
        running = RunningTurn(sample, entry["rid"], entry["input_ids"], turn_future())
    manager.sessions.restore(session, running)


def _restore_sample(
    snapshot: Snapshot,
    batch_id: str,
    sample_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    submission: dict,
    group: int,
) -> Sample:
    sample = Sample(
        seq=snapshot.samples[sample_id]["seq"],
        sample_id=sample_id,
        prompt_ids=list(prompt),
        sampling=sampling,
        allow_off_policy=submission["allow_off_policy"],
        batch_id=batch_id,
        group_index=group,
    )
    _replay(snapshot, sample)
    return sample


def _replay(snapshot: Snapshot, sample: Sample) -> None:
    """Put back a sample's journaled tokens (spans exactly as recorded) and its state."""
    sample_id = sample.sample_id
    row = snapshot.samples[sample_id]
    for chunk in snapshot.chunks.get(sample_id, []):
        if chunk.start == 0 and sample.output_ids:  # `resume: restart` threw these away
            sample.discard_output()
        if chunk.start != len(sample.output_ids):
            raise JournalRefused(
                f"journal {snapshot.path}: sample {sample_id} has a gap at token {len(sample.output_ids)}; "
                "move it away to start afresh"
            )
        sample.attempts = chunk.attempt  # spans are per attempt: rebuilt exactly as they were recorded
        sample.record(
            chunk.engine_id, chunk.engine_url, chunk.weight_version, chunk.token_ids, chunk.logprobs
        )
    sample.journaled = len(sample.output_ids)  # on disk already: not written again
    for name in _SAMPLE_COLUMNS:
        setattr(sample, name, row[name])
    state = SampleState[row["state"].upper()]
    sample.state = state if state >= SampleState.FINISHED else SampleState.WAITING


async def _abort_left_running(manager: RolloutManager, snapshot: Snapshot) -> None:
    """Engines may still be generating for the dead manager: stop them, so they serve the live one."""
    engines = {normalise_url(entry.url): entry for entry in manager.config.engines}
    known = {record["url"]: record for record in snapshot.engines}

    async def abort(attempt: dict) -> None:
        url = attempt["engine_url"]
        entry = known.get(url) or (engines[url].model_dump() if url in engines else None)
        if entry is None:
            return  # an engine removed since: not the manager's to call any more
        client = make_client(entry["engine_type"], url, manager.http, api_key=entry.get("api_key"))
        try:
            await within(client.abort(attempt["rid"]), manager.config.connect_timeout_s)
            log.info("aborted %s on %s, left running by the last manager", attempt["rid"], url)
        except Exception as exc:  # an engine that is down has nothing running either
            log.info("could not abort %s on %s: %s", attempt["rid"], url, exc)
        finally:
            await client.close()

    await asyncio.gather(*(abort(attempt) for attempt in snapshot.attempts))


async def rejoin_engines(manager: RolloutManager, snapshot: Snapshot) -> None:
    """Register again the engines that joined at run time (those of `engines:` joined already)."""
    configured = {normalise_url(entry.url) for entry in manager.config.engines}
    for record in snapshot.engines:
        if record["url"] in configured or manager.registry.by_url(record["url"]) is not None:
            continue
        # journals written before relays have none: the entry's default
        entry = EngineEntry(**{field: record[field] for field in EngineEntry.model_fields if field in record})
        try:
            await manager.fleet.add_engine(entry)
        except EngineUnavailable as exc:
            log.warning(
                "engine %s did not come back (%s); the health checker tries it again", record["url"], exc
            )
            manager.fleet.add_failed_engine(entry)
