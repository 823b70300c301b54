"""Where the RL components sit: RLinf's `cluster:` section, parsed once for `rollflow rl-sim` and live runs.

An RLinf user pastes their section unchanged:

    cluster:
      num_nodes: 1
      auto_scheduler: true
      use_pre_process_policy: true
      use_wait_before_last_iter_policy: false
      component_placement: {actor: 0-1, rollout: 2-5, inference: 6-7}

A device is a GPU id on a GPU machine (`device: cuda`) or, on a machine without GPUs, a device
slot: a process with its own `threads_per_device` torch threads (`device: cpu`). The dynamic
scheduler only ever moves devices towards the actor, whose range must stay a prefix, so the
placement is checked against four rules, each reported in one line that names it: the order
actor -> rollout -> inference, no overlap, no unused device, and (once the mini-batch is known,
`check_actor_size`) an actor data-parallel size that divides the mini-batch.

This module imports neither torch nor the simulator: the live executor and `rollflow rl-sim` both
read it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import Field, model_validator

from rollflow.config import StrictModel
from rollflow.errors import UserError
from rollflow.policy.resources import DynamicScheduler, ResourceScheduler, StaticScheduler, valid_actor_sizes

COMPONENTS = ("actor", "rollout", "inference")  # the order their device ranges must follow
RULE_ORDER = "order actor -> rollout -> inference"
RULE_OVERLAP = "no overlap"
RULE_UNUSED = "no unused device"
RULE_ACTOR_SIZE = "actor data-parallel size divides the mini-batch"


class DeviceRange(NamedTuple):
    start: int  # first device
    count: int  # devices in the range

    @property
    def end(self) -> int:
        """One past the last device."""
        return self.start + self.count

    def devices(self) -> range:
        return range(self.start, self.end)

    def __str__(self) -> str:
        return str(self.start) if self.count == 1 else f"{self.start}-{self.end - 1}"


def parse_device_range(text: str | int) -> DeviceRange:
    """`"2-5"` -> DeviceRange(2, 4), `3` -> DeviceRange(3, 1): RLinf's `component_placement` ranges."""
    first, sep, last = str(text).strip().partition("-")
    try:
        start = int(first)
        end = int(last) if sep else start
    except ValueError:
        raise ValueError(f"device range {text!r} must look like '0-7' or '3'") from None
    if start < 0 or end < start:
        raise ValueError(f"device range {text!r} must have 0 <= first <= last")
    return DeviceRange(start, end - start + 1)


class ClusterConfig(StrictModel):
    """RLinf's `cluster:` section, plus what a device is on this machine."""

    num_nodes: int = Field(1, ge=1)
    """RLinf's key: machines in the cluster. Devices are numbered across all of them; live runs use one."""
    num_devices: int | None = Field(None, ge=1)
    """Devices in all (every one must belong to a component); default: up to the last one the placement names."""
    component_placement: dict[str, str | int]
    """Device range of each component, e.g. {actor: 0-1, rollout: 2-5, inference: 6-7}; inference may be
    left out (the actor then computes reference log-probs itself)."""
    auto_scheduler: bool = False
    """RLinf's dynamic scheduling: within a step devices move from rollout and inference to the actor."""
    use_pre_process_policy: bool = True
    """auto_scheduler: at step start rollout also runs on the actor's devices and hands them back once
    half the step's samples are done (RLinf's default: on)."""
    use_wait_before_last_iter_policy: bool = True
    """auto_scheduler: the actor's last mini-batch waits for rollout and inference, then trains on every
    device (RLinf's default: on)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: each device is a slot, one process with `threads_per_device` torch threads; cuda: device i is GPU i."""
    threads_per_device: int = Field(1, ge=1)
    """cpu: torch threads of each device slot's process."""

    @model_validator(mode="after")
    def _valid_placement(self) -> ClusterConfig:
        self.ranges()
        return self

    def ranges(self) -> dict[str, DeviceRange]:
        """Each placed component's devices, in the order actor, rollout, inference; ValueError naming
        the rule a placement breaks."""
        unknown = [name for name in self.component_placement if name not in COMPONENTS]
        if unknown:
            raise ValueError(
                f"component_placement: unknown component {unknown[0]!r}; allowed: {', '.join(COMPONENTS)} "
                "(each on its own devices)"
            )
        for name in ("actor", "rollout"):
            if name not in self.component_placement:
                raise ValueError(f"component_placement.{name}: missing; give its devices, e.g. {name}: 0-1")
        ranges = {}
        for name in COMPONENTS:
            if name in self.component_placement:
                try:
                    ranges[name] = parse_device_range(self.component_placement[name])
                except ValueError as exc:
                    raise ValueError(f"component_placement.{name}: {exc}") from None
        _check_rules(ranges, self.num_devices)
        return ranges

    @property
    def total_devices(self) -> int:
        return self.num_devices or max(r.end for r in self.ranges().values())

    def scheduler(self, pre_process_threshold: float = 0.5) -> ResourceScheduler:
        """The one policy object that decides the moves, in `rollflow rl-sim` and live alike."""
        if not self.auto_scheduler:
            return StaticScheduler()
        return DynamicScheduler(
            pre_process=self.use_pre_process_policy,
            pre_process_threshold=pre_process_threshold,
            wait_before_last_iter=self.use_wait_before_last_iter_policy,
        )

    def check_actor_size(self, minibatch_samples: int, model_parallel: int = 1, key: str = "cluster") -> None:
        """UserError unless the actor's data-parallel size divides the `minibatch_samples`-sample mini-batch."""
        problem = self.actor_size_problem(minibatch_samples, model_parallel, key)
        if problem is not None:
            raise UserError(f"config error: {problem}")

    def actor_size_problem(
        self, minibatch_samples: int, model_parallel: int = 1, key: str = "cluster"
    ) -> str | None:
        """What is wrong with the actor's size for this mini-batch, naming the rule; None when nothing."""
        actor = self.ranges()["actor"].count
        valid = valid_actor_sizes(self.total_devices, model_parallel, minibatch_samples)
        if actor in valid:
            return None
        return (
            f"{key}.component_placement.actor: rule '{RULE_ACTOR_SIZE}': the actor's {actor} devices "
            f"(data-parallel size {actor / model_parallel:g}) do not divide the {minibatch_samples}-sample "
            f"mini-batch; valid actor sizes: {valid}"
        )


def _check_rules(ranges: dict[str, DeviceRange], num_devices: int | None) -> None:
    placed = list(ranges.items())
    for i, (name, span) in enumerate(placed):
        for other, other_span in placed[i + 1 :]:
            shared = set(span.devices()) & set(other_span.devices())
            if shared:
                raise ValueError(
                    f"component_placement: rule '{RULE_OVERLAP}': {name} ({span}) and {other} ({other_span}) "
                    f"share device {min(shared)}"
                )
    by_start = sorted(placed, key=lambda item: item[1].start)
    if [name for name, _ in by_start] != [name for name, _ in placed]:
        order = " -> ".join(f"{name} ({span})" for name, span in by_start)
        raise ValueError(f"component_placement: rule '{RULE_ORDER}': the devices go {order}")
    expected = 0
    for name, span in placed:
        if span.start != expected:
            raise ValueError(
                f"component_placement: rule '{RULE_UNUSED}': device {expected} is in no component "
                f"({name} starts at {span.start})"
            )
        expected = span.end
    if num_devices is not None and expected > num_devices:
        raise ValueError(f"component_placement: uses devices 0-{expected - 1} but num_devices={num_devices}")
    if num_devices is not None and expected < num_devices:
        raise ValueError(
            f"component_placement: rule '{RULE_UNUSED}': devices {expected}-{num_devices - 1} of "
            f"num_devices={num_devices} are in no component"
        )
