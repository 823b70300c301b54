"""How long reserved (local) rollout instances generate before their leftovers move to remote ones.

RLBoost's balance: in every step the reserved GPUs generate for a time budget, then switch to
training while preemptible (remote/spot) instances finish the long tail. A budget too short
starves the trainer (it idles waiting for remote samples: the *bubble*); a budget too long
delays training when remote capacity would have absorbed the tail. The balancer closes that
loop from what the trainer reports after each step:

    bubble fraction b = bubble_s / step_time_s
    budget <- clamp(budget * exp(gain * (b - target_bubble_fraction)))

A multiplicative step keeps the controller scale-free (seconds-long and minutes-long steps
converge alike), and `smoothing` averages the bubble over steps so one noisy step does not
swing the budget. The same object runs in the RL simulator and in the live manager: it reads
no clock; `now` and the step's start arrive as arguments.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pydantic import Field, model_validator

from rollflow.config import StrictModel
from rollflow.policy.view import ClusterView, InstanceKind


class Instance(Protocol):
    """An instance as each side holds it: the policy's InstanceView, the simulator's Replica, the
    live manager's EngineRecord. Its kind is all an offload choice reads."""

    @property
    def kind(self) -> InstanceKind: ...


InstanceT = TypeVar("InstanceT", bound=Instance)


@dataclass(frozen=True)
class StepReport:
    """What the trainer measured in one finished step."""

    step_time_s: float
    bubble_s: float  # time the trainer waited for rollout samples

    def __post_init__(self) -> None:
        if not self.step_time_s > 0:
            raise ValueError(f"step_time_s must be > 0, got {self.step_time_s}")
        if not 0 <= self.bubble_s <= self.step_time_s:
            raise ValueError(f"bubble_s must be in [0, step_time_s={self.step_time_s}], got {self.bubble_s}")

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.step_time_s


@dataclass(frozen=True)
class OffloadSettings:
    initial_budget_s: float = 30.0
    min_budget_s: float = 1.0
    max_budget_s: float = 3600.0
    target_bubble_fraction: float = 0.05
    gain: float = 2.0
    smoothing: float = 0.5  # weight of the newest step in the bubble average, in (0, 1]

    def __post_init__(self) -> None:
        if not 0 < self.min_budget_s <= self.initial_budget_s <= self.max_budget_s:
            raise ValueError(
                "offload budgets must satisfy 0 < min_budget_s <= initial_budget_s <= max_budget_s, got "
                f"{self.min_budget_s}, {self.initial_budget_s}, {self.max_budget_s}"
            )
        if not 0 <= self.target_bubble_fraction < 1:
            raise ValueError(f"target_bubble_fraction must be in [0, 1), got {self.target_bubble_fraction}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if self.gain < 0:
            raise ValueError(f"gain must be >= 0, got {self.gain}")


class OffloadConfig(StrictModel):
    """The YAML form of `OffloadSettings`, one section for the manager and the RL simulator alike.

    The bounds live here so a bad value is a config error naming the key; the cross-field
    check is the settings' own, run at validation time.
    """

    initial_budget_s: float = Field(30.0, gt=0.0)
    """Time budget of the first step: how long local (reserved) instances generate before the rest moves to
    remote or spot ones."""
    min_budget_s: float = Field(1.0, gt=0.0)
    """Lowest budget the adaptation may reach."""
    max_budget_s: float = Field(3600.0, gt=0.0)
    """Highest budget the adaptation may reach."""
    target_bubble_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    """Fraction of a step the trainer may wait for rollouts; above it the budget shrinks, below it grows."""
    gain: float = Field(2.0, ge=0.0)
    """How strongly the budget reacts: it is multiplied by exp(gain x (bubble fraction - target)) each step."""
    smoothing: float = Field(0.5, gt=0.0, le=1.0)
    """Weight of the newest step in the running average of the bubble fraction, in (0, 1]."""

    @model_validator(mode="after")
    def _consistent(self) -> OffloadConfig:
        self.settings()
        return self

    def settings(self) -> OffloadSettings:
        names = {f.name for f in dataclasses.fields(OffloadSettings)}
        return OffloadSettings(**{k: v for k, v in self.model_dump().items() if k in names})


class OffloadBalancer:
    """Adapts the local time budget from step reports; says when and what to offload."""

    def __init__(self, settings: OffloadSettings | None = None) -> None:
        self.settings = settings or OffloadSettings()
        self._budget_s = self.settings.initial_budget_s
        self._bubble_fraction: float | None = None

    @property
    def budget_s(self) -> float:
        return self._budget_s

    def update(self, report: StepReport) -> float:
        """Fold one step's report into the budget and return the budget for the next step."""
        s = self.settings
        if self._bubble_fraction is None:
            self._bubble_fraction = report.bubble_fraction
        else:
            self._bubble_fraction += s.smoothing * (report.bubble_fraction - self._bubble_fraction)
        scaled = self._budget_s * math.exp(s.gain * (self._bubble_fraction - s.target_bubble_fraction))
        self._budget_s = min(s.max_budget_s, max(s.min_budget_s, scaled))
        return self._budget_s

    def state(self) -> dict:
        """What `load_state` needs to continue adapting where this balancer left off."""
        return {"budget_s": self._budget_s, "bubble_fraction": self._bubble_fraction}

    def load_state(self, state: dict) -> None:
        self._budget_s = float(state["budget_s"])
        self._bubble_fraction = state["bubble_fraction"]

    def expired(self, now: float, step_started_at: float) -> bool:
        """Whether local instances have used up this step's budget."""
        return now - step_started_at >= self._budget_s

    # The two choices the RL simulator (sim/rl/offload.py) and the live manager (manager/core/service.py, fleet.py,
    # dispatcher.py) must make alike; both call these, each on its own records of the instances.
    @staticmethod
    def offload_sources(instances: Iterable[InstanceT]) -> list[InstanceT]:
        """Local instances: their unfinished work moves once the budget expires, and they may hand
        their GPUs to training."""
        return [inst for inst in instances if inst.kind == "local"]

    @staticmethod
    def offload_targets(instances: Iterable[InstanceT]) -> list[InstanceT]:
        """Instances that take offloaded work: every remote or spot one."""
        return [inst for inst in instances if inst.kind != "local"]


def remote_only(view: ClusterView) -> ClusterView:
    """The view restricted to offload targets, for a router to pick among after the budget expires."""
    return ClusterView(view.now, OffloadBalancer.offload_targets(view.instances))
