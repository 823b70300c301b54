"""The engines the manager may route to, and the snapshot of them a router decides from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollflow.policy.view import InstanceKind
from rollflow.runtime.engines.base import EngineClient
from rollflow.runtime.engines.load import EngineLoad
from rollflow.runtime.manager.config import EngineEntry
from rollflow.runtime.manager.core.prefixes import PrefixRecord

EngineState = Literal["healthy", "updating", "failed", "removed", "releasing", "released", "resuming"]
"""releasing / released / resuming: the engine gives its device back and takes it again (memory.py)."""


@dataclass
class EngineRecord:
    engine_id: int
    url: str
    kind: InstanceKind
    engine_type: str
    capacity: int
    client: EngineClient
    weight_version: int | None
    state: EngineState = "healthy"
    running: dict[str, int] = field(default_factory=dict)  # sample id -> tokens it still may generate
    # the samples of `running` that have no token yet: sample id -> input + remaining tokens
    unstarted: dict[str, int] = field(default_factory=dict)
    reported: EngineLoad | None = None  # the engine's last load report, None before one (or if none)
    own_at_report: tuple[int, int] = (0, 0)  # (running, unstarted) of the manager's when it was asked
    prefixes: PrefixRecord = field(default_factory=PrefixRecord)  # the blocks sent here and answered
    health_failures: int = 0
    # loop time it last sent a chunk to any of the manager's streams, or was given work while it had
    # none: the stall sweep's clock (an engine is hung when it produces for no one while it has work)
    heard_at: float = 0.0
    api_key: str | None = None  # sent on every call to the engine; kept to reconnect after a failure
    relay: str | None = None  # HOST:PORT of the relay that reads its streams on its node
    consecutive_failures: int = 0  # failures since a sample last finished on it (the breaker's count)
    retry_at: float = 0.0  # loop time at which the breaker half-opens a failed engine
    tokens_generated: int = 0
    tokens_per_s: float = 0.0
    window_tokens: int = 0  # tokens since the last throughput tick
    # sums kept as `running` and `unstarted` change (the view reads them for every routed sample):
    queued_tokens: int = 0  # of `unstarted`'s values
    running_tokens: int = 0  # of `running`'s values for samples not in `unstarted`

    def entry(self) -> EngineEntry:
        """How the engine registered: what registering it again takes (its breaker's half-open
        check, or a manager restarted from its journal)."""
        return EngineEntry(**{name: getattr(self, name) for name in EngineEntry.model_fields})

    def dispatched(self, sample_id: str, input_tokens: int, remaining_tokens: int) -> None:
        """A sample was sent here: it holds a place and counts as queued until its first token."""
        self.ended(sample_id)
        self.running[sample_id] = remaining_tokens
        self.unstarted[sample_id] = input_tokens + remaining_tokens
        self.queued_tokens += input_tokens + remaining_tokens

    def progressed(self, sample_id: str, remaining_tokens: int) -> None:
        """Tokens of the sample arrived: it is running, with `remaining_tokens` left to generate."""
        queued = self.unstarted.pop(sample_id, None)
        if queued is not None:
            self.queued_tokens -= queued
        else:
            self.running_tokens -= self.running.get(sample_id, 0)
        self.running[sample_id] = remaining_tokens
        self.running_tokens += remaining_tokens

    def ended(self, sample_id: str) -> None:
        """The sample's attempt here is over (finished, failed or moved)."""
        remaining = self.running.pop(sample_id, None)
        queued = self.unstarted.pop(sample_id, None)
        if queued is not None:
            self.queued_tokens -= queued
        elif remaining is not None:
            self.running_tokens -= remaining

    def own_counts(self) -> tuple[int, int]:
        """(running, unstarted) samples of the manager's on this engine."""
        return len(self.running) - len(self.unstarted), len(self.unstarted)

    def to_json(self) -> dict:
        return {
            "id": self.engine_id,
            "url": self.url,
            "kind": self.kind,
            "engine_type": self.engine_type,
            "capacity": self.capacity,
            "relay": self.relay,
            "state": self.state,
            "weight_version": self.weight_version,
            "running": len(self.running),
            "tokens_generated": self.tokens_generated,
            "tokens_per_s": round(self.tokens_per_s, 3),
            # the engine's own prefix cache hit rate, from its last load report (vLLM's /metrics)
            "prefix_hit_rate": self.reported.prefix_hit_rate if self.reported else None,
        }


class Registry:
    """Engines by id; ids are never reused, so a log line or span names one engine forever."""

    def __init__(self) -> None:
        self._engines: dict[int, EngineRecord] = {}
        self.next_id = 0  # the id the next engine gets

    def add(self, **fields) -> EngineRecord:
        record = EngineRecord(engine_id=self.next_id, **fields)
        self.next_id += 1
        self._engines[record.engine_id] = record
        return record

    def get(self, engine_id: int) -> EngineRecord | None:
        return self._engines.get(engine_id)

    def by_url(self, url: str) -> EngineRecord | None:
        return next((e for e in self._engines.values() if e.url == url and e.state != "removed"), None)

    def live(self) -> list[EngineRecord]:
        """Engines not yet failed or removed (healthy or taking new weights)."""
        return [e for e in self._engines.values() if e.state in ("healthy", "updating")]

    def routable(self) -> list[EngineRecord]:
        """The live engines with room for another sample (the engines a sample may be routed to)."""
        return [e for e in self._engines.values() if e.state == "healthy" and len(e.running) < e.capacity]

    def failed(self) -> list[EngineRecord]:
        return [e for e in self._engines.values() if e.state == "failed"]

    def all(self) -> list[EngineRecord]:
        return list(self._engines.values())

    def forget(self, engine_id: int) -> None:
        self._engines.pop(engine_id, None)
