"""Multi-turn sessions: an agent's episode as one growing context that keeps its engine.

A session is opened, then sent turn after turn. Each turn brings new tokens (the first turn's are
the prompt; every later turn's are the environment's or a tool's answer to the last output) and is
one manager sample whose prompt is the whole context so far: prompt, every earlier output and every
environment token. So a turn is tracked, streamed and resumed exactly as any sample is: an engine
that dies mid-turn hands the turn to another engine with the context and the tokens it had, and an
engine that died between turns is simply not routed to again; nothing generated is generated twice.

Turns are routed by the manager's `session_router`, the simulator's `session` policy (sticky least
loaded): a session's turns stay on the engine that caches its context while it is not overloaded.

A session holds to one weight version: the one given at open, else the version of its first token.
Without `allow_off_policy`, a turn is refused (SessionConflict) while no live engine serves that
version, rather than waiting for one that may never come back.

The context is kept as segments of three roles, `prompt`, `output` (generated: trained on) and
`env` (environment or tool tokens: masked out of the loss), so a trainer reads the loss mask off it.

With a journal, sessions survive a manager crash (journal.py): a session's open, close and each
turn's answer are on disk before the caller hears of them, and a turn in flight at the crash
resumes from its journaled tokens. Its caller's connection died with the manager, so a turn carries
the caller's `rid`: sent again with the same rid and input (as `ManagerClient.send_turn` does
across a restart), it answers the turn that was running or finished, never a second turn. A turn
restored from the journal finishes, and joins the context, whether or not its caller comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rollflow.errors import UserError
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.wire.base import SamplingParams

if TYPE_CHECKING:
    from rollflow.runtime.manager.core.service import RolloutManager

log = logging.getLogger(__name__)

MAX_CLOSED_SESSIONS = 4096  # closed sessions remembered, so a late turn hears "closed", not "unknown"

Role = Literal["prompt", "output", "env"]


class SessionNotFound(UserError):
    """No session of that id (never opened, or closed long ago)."""


class SessionConflict(UserError):
    """The session cannot take this turn now: closed, busy with a turn, or its weight version gone."""


class TooManySessions(UserError):
    """`max_open_sessions` are open: an agent loop that never closes its sessions would otherwise grow
    the manager's memory (each holds its whole context) until it dies."""


class TurnFailed(UserError):
    """The manager gave up on the turn (attempts exhausted), or an engine refused its input."""

    def __init__(self, message: str, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused  # the input itself was bad (a 4xx from the engine)


@dataclass(frozen=True)
class Segment:
    """Tokens `[start, end)` of the context, of one role, added by one turn."""

    role: Role
    start: int
    end: int
    turn: int

    def to_json(self) -> dict:
        return {"role": self.role, "start": self.start, "end": self.end, "turn": self.turn}


@dataclass
class Turn:
    index: int  # 0-based
    sample: Sample  # the turn's manager sample; its prompt is the context before its output
    output_start: int  # where its output begins in the context
    rid: str  # the client's request id of the turn (SGLang's), else the sample's id

    def to_json(self) -> dict:
        """The turn with its spans placed in the context (a span's start/end are context offsets)."""
        spans = []
        for span in self.sample.spans:
            entry = span.to_json()
            entry["start"] += self.output_start
            entry["end"] += self.output_start
            spans.append(entry)
        return {
            "turn": self.index,
            "rid": self.rid,
            "sample_id": self.sample.sample_id,
            "output_start": self.output_start,
            "output_end": self.output_start + len(self.sample.output_ids),
            "finish_reason": self.sample.finish_reason,
            "weight_version": self.sample.weight_version,
            "cached_tokens": self.sample.cached_tokens,
            "resumes": self.sample.resumes,
            "spans": spans,
        }


@dataclass
class RunningTurn:
    """A turn in flight, and its end for callers who send it again (a retry across a restart)."""

    sample: Sample
    rid: str
    input_ids: list[int]
    done: asyncio.Future  # the Turn, or the error that ended it


@dataclass
class Session:
    session_id: str
    weight_version: int | None  # the version its tokens come from (None until its first token)
    allow_off_policy: bool
    context_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per context token; 0.0 off the outputs
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    closed_at: float | None = None  # wall-clock time it was closed
    running: RunningTurn | None = None  # the turn in flight

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def input_of(self, turn: Turn) -> list[int]:
        """The tokens the turn's caller sent (prompt or environment tokens)."""
        previous = self.turns[turn.index - 1] if turn.index else None
        start = previous.output_start + len(previous.sample.output_ids) if previous is not None else 0
        return self.context_ids[start : turn.output_start]

    def row(self) -> dict:
        """The session as the journal keeps it, beside its turns' rows."""
        running = self.running if not self.closed else None
        return {
            "weight_version": self.weight_version,
            "allow_off_policy": self.allow_off_policy,
            "closed_at": self.closed_at,
            "running": None
            if running is None
            else {
                "rid": running.rid,
                "input_ids": running.input_ids,
                "sample_id": running.sample.sample_id,
                "seq": running.sample.seq,
                "sampling": dataclasses.asdict(running.sample.sampling),
            },
        }

    def append(self, role: Role, token_ids: list[int], logprobs: list[float] | None = None) -> None:
        if not token_ids:
            return
        start = len(self.context_ids)
        self.context_ids.extend(token_ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
        self.segments.append(Segment(role, start, len(self.context_ids), len(self.turns)))

    @property
    def loss_mask(self) -> list[int]:
        """1 on generated tokens, 0 on prompt and environment tokens."""
        mask = [0] * len(self.context_ids)
        for segment in self.segments:
            if segment.role == "output":
                mask[segment.start : segment.end] = [1] * (segment.end - segment.start)
        return mask

    def to_json(self) -> dict:
        return {
            "session_id": self.session_id,
            "state": "closed" if self.closed else "open",
            "weight_version": self.weight_version,
            "allow_off_policy": self.allow_off_policy,
            "context_ids": self.context_ids,
            "logprobs": self.logprobs,
            "loss_mask": self.loss_mask,
            "segments": [segment.to_json() for segment in self.segments],
            "turns": [turn.to_json() for turn in self.turns],
        }


def turn_row(turn: Turn, input_ids: list[int]) -> dict:
    """A finished turn as the journal keeps it: enough to rebuild its sample and the context."""
    sample = turn.sample
    return {
        "rid": turn.rid,
        "input_ids": input_ids,
        "sample_id": sample.sample_id,
        "seq": sample.seq,
        "sampling": dataclasses.asdict(sample.sampling),
        "output_ids": sample.output_ids,
        "output_logprobs": sample.output_logprobs,
        "spans": [dataclasses.asdict(span) for span in sample.spans],
        "finish_reason": sample.finish_reason,
        "attempts": sample.attempts,
        "resumes": sample.resumes,
        "regenerated_tokens": sample.regenerated_tokens,
        "cached_by_attempt": sample.cached_by_attempt,
    }


def turn_future() -> asyncio.Future:
    """A running turn's end, for callers who send it again (none may: its error is read here too)."""
    future = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


class SessionStore:
    """The manager's open sessions (and the ids of recently closed ones)."""

    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager
        self._open: dict[str, Session] = {}
        self._closed: OrderedDict[str, Session] = OrderedDict()
        self._stopping = False

    async def open(
        self, session_id: str | None = None, weight_version: int | None = None, allow_off_policy: bool = False
    ) -> tuple[Session, bool]:
        """Open a session; (it, True). The same open sent again (a retry across a restart: same id and
        settings, no turn yet) answers the session it made: (it, False)."""
        known = self._open.get(session_id) if session_id is not None else None
        if (
            known is not None
            and not known.turns
            and known.running is None
            and (known.weight_version, known.allow_off_policy) == (weight_version, allow_off_policy)
        ):
            return known, False
        session_id = session_id or uuid.uuid4().hex
        if session_id in self._open or session_id in self._closed:
            raise SessionConflict(f"session {session_id!r} exists already; open it under another id")
        limit = self.manager.config.max_open_sessions
        if len(self._open) >= limit:
            raise TooManySessions(
                f"{len(self._open)} sessions are open, max_open_sessions={limit}: close finished ones "
                "with DELETE /v1/sessions/{id} (or raise max_open_sessions in the manager config)"
            )
        session = Session(session_id, weight_version, allow_off_policy)
        self._open[session_id] = session
        log.info("session %s opened (version %s)", session_id, weight_version)
        self.manager.journal.session_changed(session_id, session.row())
        await self.manager.journal.durable()
        return session, True

    def running_turns(self) -> dict[str, Sample]:
        """rid -> sample of every open session's turn in flight, for `/abort_request` (a turn is a
        client's request like any `/generate`, so SGLang's abort by rid and abort_all reach it)."""
        return {
            session.running.rid: session.running.sample
            for session in self._open.values()
            if session.running is not None
        }

    def get(self, session_id: str) -> Session:
        session = self._open.get(session_id) or self._closed.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}; open one with POST /v1/sessions")
        return session

    async def close(self, session_id: str) -> Session:
        """Close a session (a turn in flight is cancelled); its record stays readable for a while."""
        session = self.get(session_id)
        if session.closed:
            raise SessionConflict(f"session {session_id!r} is closed already")
        session.closed_at = time.time()
        running = session.running
        if running is not None:  # its caller hears of the close (a 409) and the turn is not kept
            self.manager.abort_sample(running.sample, f"session {session_id!r} closed")
        del self._open[session_id]
        self._remember_closed(session)
        journal = self.manager.journal
        if running is not None:
            journal.turn_ended(session_id, session.row(), running.sample)
        else:
            journal.session_changed(session_id, session.row())
        await journal.durable()
        log.info("session %s closed after %d turns", session_id, len(session.turns))
        return session

    def _remember_closed(self, session: Session) -> None:
        self._closed[session.session_id] = session
        if len(self._closed) > MAX_CLOSED_SESSIONS:
            forgotten, _ = self._closed.popitem(last=False)
            self.manager.journal.session_forgotten(forgotten)

    async def turn(
        self,
        session_id: str,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str | None = None,
        continues: str | None = None,
        caller_gone: Callable[[], bool] = lambda: True,
    ) -> Turn:
        """Append `input_ids` (the prompt on the first turn, environment tokens after) and generate
        the next output on the session's engine; returns once the turn has finished. `rid` names the
        turn: sent again, it answers that turn rather than making another. `continues`, when given,
        must be the rid of the session's last turn. `caller_gone`: whether a cancel of this call is its
        caller's going away (the turn is cancelled), not the manager's stopping (it is kept)."""
        session = self.get(session_id)
        if rid is not None:
            known = self._find(session, rid, input_ids)
            if isinstance(known, RunningTurn):
                try:
                    return await asyncio.shield(known.done)
                except asyncio.CancelledError:
                    if not known.done.cancelled() or self._stopping:
                        raise  # this caller went away, or the manager stops
                # its first caller went away, cancelling it: this one sends it anew
                return await self.turn(session_id, input_ids, sampling, rid, continues, caller_gone)
            if known is not None:
                await self.manager.journal.durable()  # a restored turn's end may be on its way to disk
                return known
        self._check_turn(session, input_ids)
        if continues is not None and (not session.turns or session.turns[-1].rid != continues):
            last = session.turns[-1].rid if session.turns else None
            raise SessionConflict(
                f"session {session_id!r}: a turn must continue its last request ({last!r}), not "
                f"{continues!r}; branching from an earlier turn is not served"
            )
        sample = self.manager.submit_sample(
            session.context_ids + input_ids,
            sampling,
            allow_off_policy=session.allow_off_policy,
            sample_id=f"{session_id}.t{len(session.turns)}",
            session_id=session_id,
            pinned_version=None if session.allow_off_policy else session.weight_version,
        )
        running = RunningTurn(sample, rid or sample.sample_id, list(input_ids), turn_future())
        session.running = running
        self.manager.journal.session_changed(session_id, session.row(), running=sample)
        return await self.drive(session, running, caller_gone)

    def _find(self, session: Session, rid: str, input_ids: list[int]) -> Turn | RunningTurn | None:
        """The turn of that rid, running or finished, when its input is the one sent again."""
        running = session.running
        if running is not None and running.rid == rid:
            sent = running.input_ids
            found: Turn | RunningTurn | None = running
        else:
            found = next((turn for turn in reversed(session.turns) if turn.rid == rid), None)
            if found is None:
                return None
            sent = session.input_of(found)
        if sent != list(input_ids):
            raise SessionConflict(
                f"session {session.session_id!r}: turn {rid!r} was sent with other input_ids; a turn sent "
                "again repeats its input, a new turn needs a new rid"
            )
        return found

    async def drive(
        self, session: Session, running: RunningTurn, caller_gone: Callable[[], bool] = lambda: False
    ) -> Turn:
        """Wait for the running turn's sample to end; a finished one joins the context, on disk
        before anyone hears of it. Its caller's going away (a cancel when `caller_gone()`) cancels the
        turn; a cancel by the manager's stopping leaves it journaled as running, resumed after a restart."""
        sample = running.sample
        try:
            try:
                while sample.state < SampleState.FINISHED:
                    await self.manager.wait_for_update(sample)
            except asyncio.CancelledError:
                if caller_gone() and not self._stopping:  # the context stays as it was
                    self.manager.release(sample)
                    self._end(session, running)
                    self.manager.journal.flush_soon()  # a restart must not bring the turn back
                raise
            self.manager.release(sample)
            turn = self._end(session, running)
            if sample.state == SampleState.FAILED:
                raise TurnFailed(
                    f"turn {len(session.turns)} of session {session.session_id!r}: {sample.error}",
                    sample.refused,
                )
            if turn is None:
                raise SessionConflict(f"session {session.session_id!r} was closed during the turn")
            await self.manager.journal.durable()
        except asyncio.CancelledError:
            running.done.cancel()
            raise
        except Exception as exc:
            running.done.set_exception(exc)
            raise
        running.done.set_result(turn)
        return turn

    def stop(self) -> None:
        """The manager is stopping: turns in flight are left as the journal has them (running), so a
        manager restarted on it resumes them, as after a crash."""
        self._stopping = True

    def _end(self, session: Session, running: RunningTurn) -> Turn | None:
        """The running turn's sample ended: a finished one joins the context (not in a closed
        session); journaled either way."""
        if session.running is running:
            session.running = None
        sample = running.sample
        turn = None
        if sample.state == SampleState.FINISHED and not session.closed:
            session.append("prompt" if not session.turns else "env", running.input_ids)
            turn = Turn(len(session.turns), sample, len(session.context_ids), running.rid)
            session.append("output", sample.output_ids, sample.output_logprobs)
            session.turns.append(turn)
            if session.weight_version is None:
                session.weight_version = sample.weight_version
        row = turn_row(turn, running.input_ids) if turn is not None else None
        index = turn.index if turn is not None else None
        self.manager.journal.turn_ended(session.session_id, session.row(), sample, index, row)
        return turn

    # ------------------------------------------------------------------ after a restart

    def restore(self, session: Session, running: RunningTurn | None) -> None:
        """Take back a session from the journal; its turn in flight runs on without a caller (one
        that sends it again waits for it)."""
        if session.closed:
            self._remember_closed(session)
            return
        self._open[session.session_id] = session
        if running is not None:
            session.running = running
            self.manager.spawn(self._drive_restored(session, running))

    async def _drive_restored(self, session: Session, running: RunningTurn) -> None:
        try:
            turn = await self.drive(session, running)
            log.info("session %s: turn %d, cut off by a restart, finished", session.session_id, turn.index)
        except (TurnFailed, SessionConflict) as exc:
            log.warning("session %s: the turn cut off by a restart ended: %s", session.session_id, exc)

    def _check_turn(self, session: Session, input_ids: list[int]) -> None:
        sid = session.session_id
        if session.closed:
            raise SessionConflict(f"session {sid!r} is closed; open a new session")
        if session.running is not None:
            raise SessionConflict(f"session {sid!r} is running a turn; send the next once it has answered")
        if not session.turns and not input_ids:
            raise SessionConflict(f"the first turn of session {sid!r} needs its prompt in input_ids")
        version = session.weight_version
        if version is None or session.allow_off_policy:
            return
        served = sorted(
            {e.weight_version for e in self.manager.registry.live() if e.weight_version is not None}
        )
        if served and version not in served:
            raise SessionConflict(
                f"session {sid!r} holds weight version {version}, which no engine serves now "
                f"(engines serve {served}); open the session with allow_off_policy: true to continue "
                "on newer weights, or open a new session"
            )
