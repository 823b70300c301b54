"""What the live executor did: each move with its kind and how long it took, and who held each device when.

Kinds: `release_engine` (rollout gave an engine up at an actor mini-batch boundary; its samples
resumed elsewhere), `pre_process` (an engine borrowed from the actor at step start handed back),
`release_inference`, `grow_actor`, `wait_before_last_iter` (the actor waited for rollout and inference,
then took every device for its last mini-batch), `resume_engine` and `shrink_actor` (step end).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

MoveKind = Literal[
    "release_engine",
    "pre_process",
    "release_inference",
    "grow_actor",
    "wait_before_last_iter",
    "resume_engine",
    "shrink_actor",
]
Component = Literal["actor", "rollout", "inference", "idle"]


@dataclass(frozen=True)
class Move:
    step: int
    kind: MoveKind
    trigger: str  # what the policy decided on (minibatch_end, group_done, ...) or step_end
    started_s: float  # seconds since the run's executor started
    seconds: float
    devices: tuple[int, ...]  # devices that changed hands
    ok: bool
    detail: str  # engine id and samples moved, actor sizes, or why the move failed

    def to_json(self) -> dict:
        return asdict(self) | {"seconds": round(self.seconds, 4), "started_s": round(self.started_s, 4)}


@dataclass(frozen=True)
class Holding:
    """Device `device` held by `component` over [start_s, end_s)."""

    device: int
    component: Component
    start_s: float
    end_s: float


@dataclass
class StepRecord:
    step: int
    started_s: float = 0.0  # the executor's clock, as Move.started_s
    rollout_done_s: float | None = None  # every sample of the step generated
    inference_done_s: float | None = None  # inference processed every sample
    ended_s: float | None = None
    actor_sizes: list[int] = field(default_factory=list)  # devices the actor trained each mini-batch on
    engines_released: list[int] = field(default_factory=list)  # engine ids released within the step
    moves: list[Move] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "started_s": round(self.started_s, 4),
            "rollout_done_s": None if self.rollout_done_s is None else round(self.rollout_done_s, 4),
            "ended_s": None if self.ended_s is None else round(self.ended_s, 4),
            "actor_sizes": self.actor_sizes,
            "engines_released": self.engines_released,
            "moves": [m.to_json() for m in self.moves],
        }


class DeviceLedger:
    """Who holds each device from when: the Gantt's rows."""

    def __init__(self, owners: list[Component], now: float = 0.0) -> None:
        self._current = [(owner, now) for owner in owners]
        self.holdings: list[Holding] = []

    def assign(self, devices: list[int] | tuple[int, ...], component: Component, now: float) -> None:
        for device in devices:
            owner, since = self._current[device]
            if owner == component:
                continue
            if now > since:
                self.holdings.append(Holding(device, owner, since, now))
            self._current[device] = (component, now)

    def close(self, now: float) -> list[Holding]:
        """Every holding up to `now` (the open ones cut there)."""
        open_ = [
            Holding(d, owner, since, now) for d, (owner, since) in enumerate(self._current) if now > since
        ]
        return sorted(self.holdings + open_, key=lambda h: (h.device, h.start_s))
