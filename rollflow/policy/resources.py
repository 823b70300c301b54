"""Which GPUs each RL component holds within a training step: RLinf's auto scheduler as a pure policy.

Components sit on contiguous GPU ranges in the order actor -> rollout -> inference. Within a
step the scheduler moves GPUs one way, towards the actor:

- at each actor mini-batch boundary rollout releases instances it no longer needs (fewer
  instances, at the rate they finished samples during the last mini-batch, still finish before
  the actor's last mini-batch; the executor moves the released instances' sequences to those
  that stay, re-prefilling prompt plus generated tokens), always the instances nearest the
  actor, so the actor's range stays a prefix, and only as many as the actor can use;
- inference releases its GPUs once it has processed every sample;
- between its mini-batches the actor grows to the largest valid data-parallel size that fits
  the free prefix (the mini-batch divides evenly over the data-parallel ranks); it never
  shrinks within a step.

Two policies refine this: `pre_process` (at step start rollout also runs on the actor's
GPUs, `borrowed`, and hands them back when the unfinished fraction falls under a threshold)
and `wait_before_last_iter` (the actor holds its last mini-batch until rollout and inference
are done, then takes every GPU). `decide` reads a frozen snapshot and returns a plan; the
simulator applies it now, a runtime executor later.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Literal, Protocol

Trigger = Literal["step_start", "minibatch_end", "group_done", "rollout_done", "inference_done"]


@dataclass(frozen=True)
class RolloutInstanceState:
    instance_id: int
    gpu_start: int
    num_gpus: int
    num_sequences: int  # unfinished sequences on it, running or queued
    borrowed: bool  # placed on the actor's GPUs at step start (pre_process)


@dataclass(frozen=True)
class ResourceSnapshot:
    now: float
    trigger: Trigger  # what just happened; rollout shrinks only at actor mini-batch boundaries
    num_gpus: int
    actor_gpus: int  # the actor holds GPUs [0, actor_gpus)
    actor_model_parallel: int  # GPUs per actor model replica
    minibatch_samples: int
    num_minibatches: int
    minibatches_done: int
    rollout_instances: tuple[RolloutInstanceState, ...]  # live instances
    unfinished_fraction: float  # samples not yet generated / samples in the step
    samples_per_instance_per_minibatch: float  # rollout's finishing rate during the last mini-batch
    inference_range: tuple[int, int] | None  # (first GPU, count) while inference holds GPUs
    inference_done: bool


@dataclass(frozen=True)
class ResourcePlan:
    release_instances: tuple[int, ...] = ()  # rollout instances to stop; their sequences move
    release_inference: bool = False  # inference gives its GPUs up
    actor_gpus: int = 0  # actor size to grow to once it is idle (its current size: no change)
    hold_last_minibatch: bool = False  # the last mini-batch waits for rollout and inference to finish


class ResourceScheduler(Protocol):
    name: str

    def decide(self, snapshot: ResourceSnapshot) -> ResourcePlan:
        """Return the GPU moves for this moment; never mutates the snapshot."""
        ...


def valid_actor_sizes(num_gpus: int, model_parallel: int, minibatch_samples: int) -> list[int]:
    """Actor GPU counts whose data-parallel size divides the mini-batch, ascending."""
    return list(_valid_actor_sizes(num_gpus, model_parallel, minibatch_samples))


@lru_cache(maxsize=256)  # a simulated step asks once per event it decides on, with few distinct sizes
def _valid_actor_sizes(num_gpus: int, model_parallel: int, minibatch_samples: int) -> tuple[int, ...]:
    return tuple(
        dp * model_parallel for dp in range(1, num_gpus // model_parallel + 1) if minibatch_samples % dp == 0
    )


class StaticScheduler:
    """Components keep their GPUs; rollout stops its instances only when every sample is done.

    With rollout borrowing the actor's GPUs (a collocated placement) that is the hand-back
    that lets training start.
    """

    name = "static"

    def decide(self, snapshot: ResourceSnapshot) -> ResourcePlan:
        done = snapshot.unfinished_fraction == 0
        return ResourcePlan(
            release_instances=tuple(i.instance_id for i in snapshot.rollout_instances) if done else (),
            release_inference=snapshot.inference_done and snapshot.inference_range is not None,
            actor_gpus=snapshot.actor_gpus,
        )


@dataclass(frozen=True)
class DynamicScheduler:
    """RLinf's auto scheduler (migrate, plus optional pre_process and wait_before_last_iter).

    At an actor mini-batch boundary rollout keeps the fewest instances that, at the rate each
    instance finished samples during the last mini-batch, still finish every unfinished sample
    before the actor's last mini-batch; of the instances it could spare it releases only as
    many as the actor can turn into a larger valid data-parallel size.
    """

    pre_process: bool = False
    pre_process_threshold: float = 0.5
    wait_before_last_iter: bool = False
    name: str = "dynamic"

    def decide(self, snapshot: ResourceSnapshot) -> ResourcePlan:
        instances = sorted(snapshot.rollout_instances, key=_gpu_start)
        release: set[int] = set()
        last_next = snapshot.minibatches_done == snapshot.num_minibatches - 1
        if snapshot.unfinished_fraction == 0:
            release = {i.instance_id for i in instances}
        elif self.pre_process and snapshot.unfinished_fraction <= self.pre_process_threshold:
            release = {i.instance_id for i in instances if i.borrowed}
        if snapshot.trigger == "minibatch_end" and snapshot.unfinished_fraction > 0 and not last_next:
            kept = [i for i in instances if i.instance_id not in release]
            spare = _spare_instances(snapshot, len(kept))
            release |= {i.instance_id for i in kept[: _usable(snapshot, kept, spare)]}
        kept = [i for i in instances if i.instance_id not in release] if release else instances
        release_inference = snapshot.inference_done and snapshot.inference_range is not None
        free_end = kept[0].gpu_start if kept else snapshot.num_gpus  # kept is in GPU order
        if snapshot.inference_range is not None and not release_inference:
            free_end = min(free_end, snapshot.inference_range[0])
        # The actor resizes between its own mini-batches; with wait_before_last_iter it also takes
        # everything the moment rollout and inference are done before its last one.
        everything_done = snapshot.unfinished_fraction == 0 and snapshot.inference_done
        grow = snapshot.trigger == "minibatch_end" or (
            self.wait_before_last_iter and last_next and everything_done
        )
        sizes = valid_actor_sizes(free_end, snapshot.actor_model_parallel, snapshot.minibatch_samples)
        return ResourcePlan(
            release_instances=tuple(sorted(release)),
            release_inference=release_inference,
            actor_gpus=max([snapshot.actor_gpus, *sizes]) if grow else snapshot.actor_gpus,
            hold_last_minibatch=self.wait_before_last_iter,
        )


_gpu_start = attrgetter("gpu_start")


def _spare_instances(snapshot: ResourceSnapshot, num_instances: int) -> int:
    """Instances rollout can give up and still finish before the actor's last mini-batch."""
    iterations_left = snapshot.num_minibatches - 1 - snapshot.minibatches_done
    unfinished = sum(i.num_sequences for i in snapshot.rollout_instances)
    rate = snapshot.samples_per_instance_per_minibatch
    for keep in range(1, num_instances):
        if keep * rate * iterations_left >= unfinished:
            return num_instances - keep
    return 0


def _usable(snapshot: ResourceSnapshot, kept: list[RolloutInstanceState], spare: int) -> int:
    """How many of the `spare` lowest instances to release: those under the actor's next valid size."""
    if spare == 0 or any(i.borrowed for i in kept):
        return 0
    sizes = valid_actor_sizes(
        kept[spare].gpu_start, snapshot.actor_model_parallel, snapshot.minibatch_samples
    )
    grown = sizes[-1] if sizes else 0
    if grown <= snapshot.actor_gpus:
        return 0
    return sum(1 for i in kept[:spare] if i.gpu_start < grown)
