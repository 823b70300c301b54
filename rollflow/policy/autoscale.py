"""How many rollout engines the next step should have, from how long the last rollout took.

Rollout time scales roughly inversely with the number of engines generating, so the engine
count that would have met the target is

    wanted = ceil(num_engines * rollout_s / target_rollout_s), clamped to [min_engines, max_engines]

A slow step adds `wanted - num_engines` engines at once (they pull weights and join). A fast
step removes engines only when the rollout took less than `scale_down_below * target` (so the
count does not flap around the target), and only idle ones: an engine with running samples is
never removed, and engines the launcher did not start are never touched. Spot engines go first,
then remote, then local; the newest first within a kind.

Pure: the launcher (local processes or Ray actors) builds the snapshot and applies the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollflow.policy.view import InstanceKind

# removal order: preemptible capacity is the cheapest to give back
_REMOVE_FIRST = {"spot": 0, "remote": 1, "local": 2}


@dataclass(frozen=True)
class AutoscaleSettings:
    target_rollout_s: float
    min_engines: int = 1
    max_engines: int = 8
    scale_down_below: float = 0.5  # remove engines only when rollout_s < this * target

    def __post_init__(self) -> None:
        if not self.target_rollout_s > 0:
            raise ValueError(f"target_rollout_s must be > 0, got {self.target_rollout_s}")
        if not 0 <= self.min_engines <= self.max_engines:
            raise ValueError(
                f"need 0 <= min_engines <= max_engines, got {self.min_engines}, {self.max_engines}"
            )
        if not 0 < self.scale_down_below <= 1:
            raise ValueError(f"scale_down_below must be in (0, 1], got {self.scale_down_below}")


@dataclass(frozen=True)
class EngineLoad:
    engine_id: int
    kind: InstanceKind
    num_running: int  # samples the engine is generating now
    removable: bool  # started by the launcher (engines registered by others are never removed)


@dataclass(frozen=True)
class ScaleSnapshot:
    rollout_s: float  # the last step's rollout time
    engines: tuple[EngineLoad, ...]  # live engines (healthy or loading weights)


@dataclass(frozen=True)
class ScalePlan:
    num_add: int  # engines to start
    remove: tuple[int, ...]  # engine ids to stop
    reason: str  # one line for the log


def decide_scale(snapshot: ScaleSnapshot, settings: AutoscaleSettings) -> ScalePlan:
    """The plan for one finished step; never both adds and removes."""
    num_engines = len(snapshot.engines)
    ratio = snapshot.rollout_s / settings.target_rollout_s
    wanted = math.ceil(max(num_engines, 1) * ratio)
    wanted = min(max(wanted, settings.min_engines), settings.max_engines)
    summary = f"rollout {snapshot.rollout_s:.2f}s vs target {settings.target_rollout_s:.2f}s"
    if wanted > num_engines:
        return ScalePlan(wanted - num_engines, (), f"{summary}: {num_engines} -> {wanted} engines")
    shrink_allowed = ratio < settings.scale_down_below or num_engines > settings.max_engines
    if wanted < num_engines and shrink_allowed:
        idle = sorted(
            (e for e in snapshot.engines if e.removable and e.num_running == 0),
            key=lambda e: (_REMOVE_FIRST[e.kind], -e.engine_id),
        )
        remove = tuple(e.engine_id for e in idle[: num_engines - wanted])
        if remove:
            return ScalePlan(0, remove, f"{summary}: removing {len(remove)} idle engine(s)")
        return ScalePlan(0, (), f"{summary}: fewer engines would do, but none is idle and removable")
    return ScalePlan(0, (), f"{summary}: keeping {num_engines} engines")
