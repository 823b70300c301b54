"""What the manager knows about each sample: every token, and who made it.

A sample's output is a list of spans; each span is the tokens one engine generated on one
weight version in one attempt. Resuming appends a new span: the generated tokens never get
rewritten, which is what makes "nothing regenerated" checkable rather than a promise.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

from rollflow.runtime.wire.base import SamplingParams


class SampleState(enum.IntEnum):
    """Ordered so that `state >= FINISHED` means the sample will not change again."""

    WAITING = 0  # queued in the manager, no engine yet
    RUNNING = 1  # streaming from an engine
    FINISHED = (
        2  # finish_reason stop, length, or abort (a client's, with the tokens it had; `error` says why)
    )
    FAILED = 3  # gave up (attempts exhausted, or the request refused); carries `error`


@dataclass(slots=True)
class Span:
    """Tokens `[start, end)` of the output, made by one engine on one weight version."""

    engine_id: int
    engine_url: str
    weight_version: int | None
    attempt: int  # 1-based attempt of the sample that made these tokens
    start: int
    end: int
    started_at: float = 0.0  # wall-clock time (time.time()) the attempt was sent to the engine
    first_token_at: float = 0.0  # when this span's first token arrived
    ended_at: float = 0.0  # when its last token arrived

    def to_json(self) -> dict:
        return {
            "attempt": self.attempt,
            "engine_id": self.engine_id,
            "engine_url": self.engine_url,
            "weight_version": self.weight_version,
            "start": self.start,
            "end": self.end,
        }


@dataclass(slots=True)
class Sample:
    seq: int  # manager-wide arrival number; the router's request id
    sample_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    allow_off_policy: bool = False
    batch_id: str | None = None
    group_index: int = 0  # index of the prompt in its batch; samples of one prompt form a group
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    state: SampleState = SampleState.WAITING
    finish_reason: str | None = None
    error: str | None = None
    attempts: int = 0
    resumes: int = 0
    request_failures: int = 0  # attempts an engine ended with an error of this request (not of itself)
    regenerated_tokens: int = 0  # tokens dropped by a restart-from-prompt policy; 0 when resuming
    engine_id: int | None = None  # engine of the running attempt
    refused: bool = False  # failed because an engine refused the request itself (a 4xx): its own fault
    engine_texts: dict[int, str] = field(default_factory=dict)  # attempt -> the engine's text of it
    arrived_at: float = field(default_factory=time.time)  # wall-clock time the manager took it in
    attempt_started_at: float = 0.0  # when the running (or last) attempt was sent to its engine
    first_token_at: float | None = None  # when the first output token arrived (kept across resumes)
    cached_by_attempt: dict[int, int] = field(
        default_factory=dict
    )  # attempt -> prompt tokens its engine had cached
    session_id: str | None = (
        None  # the session whose turn this is (sessions.py): routed by the session policy
    )
    pinned_version: int | None = None  # a session's weight version, before the turn has a token of its own
    journaled: int = 0  # output tokens handed to the journal so far (journal.py takes the rest per round)

    @property
    def engine_text(self) -> str:
        """The output as text, from what the engines sent (for a manager without a tokenizer)."""
        return "".join(self.engine_texts[attempt] for attempt in sorted(self.engine_texts))

    def trim_engine_text(self, keep: int) -> None:
        """Keep the first `keep` characters of the engines' text: a stop string found across a resume
        is cut as the engine cuts its own, which may reach back into earlier attempts' texts."""
        for attempt in sorted(self.engine_texts):
            text = self.engine_texts[attempt]
            self.engine_texts[attempt] = text[:keep]
            keep = max(0, keep - len(text))

    @property
    def remaining_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    def attempt_sampling(self) -> SamplingParams:
        """What the next attempt asks of its engine: a resumed sample asks only for what it lacks."""
        if not self.output_ids:
            return self.sampling
        done = len(self.output_ids)
        return replace(
            self.sampling,
            max_new_tokens=self.remaining_tokens,
            min_new_tokens=max(0, self.sampling.min_new_tokens - done),
        )

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens its engines served from their prefix caches, over all its attempts."""
        return sum(self.cached_by_attempt.values())

    @property
    def weight_version(self) -> int | None:
        """The version the sample is pinned to: that of its first span, else its session's (None before
        any token)."""
        for span in self.spans:
            if span.weight_version is not None:
                return span.weight_version
        return self.pinned_version

    def begin_attempt(self, engine_id: int) -> None:
        self.attempts += 1
        self.engine_id = engine_id
        self.attempt_started_at = time.time()
        self.state = SampleState.RUNNING

    def record(
        self,
        engine_id: int,
        engine_url: str,
        version: int | None,
        token_ids: list[int],
        logprobs: list[float],
    ) -> None:
        """Append tokens from the running attempt, extending its span or opening a new one."""
        if not token_ids:
            return
        now = time.time()
        if self.first_token_at is None:
            self.first_token_at = now
        start = len(self.output_ids)
        self.output_ids.extend(token_ids)
        self.output_logprobs.extend(logprobs)
        last = self.spans[-1] if self.spans else None
        if last is not None and last.attempt == self.attempts and last.weight_version == version:
            last.end = len(self.output_ids)
            last.ended_at = now
        else:
            self.spans.append(
                Span(
                    engine_id,
                    engine_url,
                    version,
                    self.attempts,
                    start,
                    len(self.output_ids),
                    started_at=self.attempt_started_at,
                    first_token_at=now,
                    ended_at=now,
                )
            )

    def discard_output(self) -> None:
        """Restart-from-prompt: drop what was generated (counted as regenerated work)."""
        self.regenerated_tokens += len(self.output_ids)
        self.output_ids.clear()
        self.output_logprobs.clear()
        self.spans.clear()
        self.engine_texts.clear()

    def to_json(self) -> dict:
        return {
            "sample_id": self.sample_id,
            "batch_id": self.batch_id,
            "group_index": self.group_index,
            "prompt_ids": self.prompt_ids,
            "output_ids": self.output_ids,
            "output_logprobs": self.output_logprobs,
            "finish_reason": self.finish_reason,
            "state": self.state.name.lower(),
            "error": self.error,
            "spans": [span.to_json() for span in self.spans],
            "weight_version": self.weight_version,
            "attempts": self.attempts,
            "resumes": self.resumes,
            "regenerated_tokens": self.regenerated_tokens,
            "cached_tokens": self.cached_tokens,
        }


class Watcher(Protocol):
    """What is told of a single request's every update (new tokens, a final state)."""

    def set(self) -> None: ...


@dataclass(slots=True)
class SampleRun:
    """The manager's live state of one sample it tracks, beside the sample's own record: one
    record per sample rather than a map per concern, so ending a sample forgets all of it at once."""

    sample: Sample
    task: asyncio.Task | None = None  # the running attempt
    move_reason: str | None = None  # why the manager is ending that attempt early, once it is
    # set() at every update: an asyncio.Event a single request's caller waits on, or whatever else
    # answers one without a task of its own (the lean /generate path's connection)
    watcher: Watcher | None = None
    resumed_at: float | None = None  # loop time its last attempt ended early (for the resume delay)
