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
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from rollflow.errors import UserError
from rollflow.runtime.engines.base import SamplingParams
from rollflow.runtime.manager.samples import Sample, SampleState
from rollflow.runtime.manager.service import RolloutManager

log = logging.getLogger(__name__)

MAX_CLOSED_SESSIONS = 4096  # closed sessions remembered, so a late turn hears "closed", not "unknown"

Role = Literal["prompt", "output", "env"]


class SessionNotFound(UserError):
    """No session of that id (never opened, or closed long ago)."""


class SessionConflict(UserError):
    """The session cannot take this turn now: closed, busy with a turn, or its weight version gone."""


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
class Session:
    session_id: str
    weight_version: int | None  # the version its tokens come from (None until its first token)
    allow_off_policy: bool
    context_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per context token; 0.0 off the outputs
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    closed: bool = False
    running: Sample | None = None  # the turn in flight

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


class SessionStore:
    """The manager's open sessions (and the ids of recently closed ones)."""

    def __init__(self, manager: RolloutManager) -> None:
        self.manager = manager
        self._open: dict[str, Session] = {}
        self._closed: OrderedDict[str, Session] = OrderedDict()

    def open(
        self, session_id: str | None = None, weight_version: int | None = None, allow_off_policy: bool = False
    ) -> Session:
        session_id = session_id or uuid.uuid4().hex
        if session_id in self._open or session_id in self._closed:
            raise SessionConflict(f"session {session_id!r} exists already; open it under another id")
        session = Session(session_id, weight_version, allow_off_policy)
        self._open[session_id] = session
        log.info("session %s opened (version %s)", session_id, weight_version)
        return session

    def get(self, session_id: str) -> Session:
        session = self._open.get(session_id) or self._closed.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}; open one with POST /v1/sessions")
        return session

    def close(self, session_id: str) -> Session:
        """Close a session (a turn in flight is cancelled); its record stays readable for a while."""
        session = self.get(session_id)
        if session.closed:
            raise SessionConflict(f"session {session_id!r} is closed already")
        session.closed = True
        if session.running is not None:  # its caller hears of the close (a 409) and the turn is not kept
            self.manager.abort_sample(session.running, f"session {session_id!r} closed")
        del self._open[session_id]
        self._closed[session_id] = session
        if len(self._closed) > MAX_CLOSED_SESSIONS:
            self._closed.popitem(last=False)
        log.info("session %s closed after %d turns", session_id, len(session.turns))
        return session

    async def turn(
        self,
        session_id: str,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str | None = None,
        continues: str | None = None,
    ) -> Turn:
        """Append `input_ids` (the prompt on the first turn, environment tokens after) and generate
        the next output on the session's engine; returns once the turn has finished. `rid` names the
        turn; `continues`, when given, must be the rid of the session's last turn."""
        session = self.get(session_id)
        self._check_turn(session, input_ids)
        if continues is not None and (not session.turns or session.turns[-1].rid != continues):
            last = session.turns[-1].rid if session.turns else None
            raise SessionConflict(
                f"session {session_id!r}: a turn must continue its last request ({last!r}), not "
                f"{continues!r}; branching from an earlier turn is not served"
            )
        role: Role = "prompt" if not session.turns else "env"
        sample = self.manager.submit_sample(
            session.context_ids + input_ids,
            sampling,
            allow_off_policy=session.allow_off_policy,
            sample_id=f"{session_id}.t{len(session.turns)}",
            session_id=session_id,
            pinned_version=None if session.allow_off_policy else session.weight_version,
        )
        session.running = sample
        try:
            while sample.state < SampleState.FINISHED:
                await self.manager.wait_for_update(sample)
        finally:
            session.running = None
            self.manager.release(sample)  # a caller gone mid-turn cancels it; the context is unchanged
        if sample.state == SampleState.FAILED:
            raise TurnFailed(
                f"turn {len(session.turns)} of session {session_id!r}: {sample.error}", sample.refused
            )
        if session.closed:
            raise SessionConflict(f"session {session_id!r} was closed during the turn")
        session.append(role, input_ids)
        turn = Turn(len(session.turns), sample, len(session.context_ids), rid or sample.sample_id)
        session.append("output", sample.output_ids, sample.output_logprobs)
        session.turns.append(turn)
        if session.weight_version is None:
            session.weight_version = sample.weight_version
        return turn

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
