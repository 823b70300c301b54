"""RLinf's resource scheduling within one step: snapshot -> `ResourceScheduler.decide` -> apply.

On each trigger (step start, a group done, a mini-batch done, inference done, rollout done) the step
takes a snapshot of its progress and its local instances; the plan releases instances (their
sequences migrate), releases the inference GPUs, grows the actor (the lanes reshard when free) and
may hold the last mini-batch until the rollout is done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollflow.policy.resources import (
    ResourceScheduler,
    ResourceSnapshot,
    RolloutInstanceState,
    Trigger,
    valid_actor_sizes,
)

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


class StepResources:
    def __init__(self, step: StepSimulator, scheduler: ResourceScheduler) -> None:
        self.step = step
        self.scheduler = scheduler
        config = step.config
        self.valid_actor_sizes = valid_actor_sizes(
            config.num_gpus, config.training.model_parallel, step.lanes.minibatch_samples
        )
        self.done_at_last_minibatch = 0  # samples done when the last mini-batch ended
        # the local instances' states, kept between decisions (see `_instance_states`)
        self._states_cache: tuple[list[int] | None, dict[int, int], list] = (None, {}, [])

    def decide(self, trigger: Trigger) -> None:
        step = self.step
        lanes = step.lanes
        local = step.offload.live_local()
        snapshot = self._snapshot(trigger, local)
        plan = self.scheduler.decide(snapshot)
        if trigger == "minibatch_end":
            self.done_at_last_minibatch = step.progress.num_done
        moves = step.config.scheduling.kind == "dynamic"  # (static: rollout just stops, nothing moves)
        for instance_id in plan.release_instances:
            if instance_id in local:
                step.instances.retire(instance_id, "migrate")
                if moves:
                    lanes.released(step.config.scheduling.release_s)
        if plan.release_inference and lanes.inference is not None:
            lanes.inference.released = True
        if plan.actor_gpus not in self.valid_actor_sizes or plan.actor_gpus < snapshot.actor_gpus:
            raise ValueError(
                f"{self.scheduler.name} asked for {plan.actor_gpus} actor GPUs; valid: {self.valid_actor_sizes}"
            )
        lanes.actor_target = plan.actor_gpus
        lanes.hold_last = plan.hold_last_minibatch

    def _snapshot(self, trigger: Trigger, local: list[int]) -> ResourceSnapshot:
        """What the resource scheduler decides from: the step's progress and its local instances."""
        step = self.step
        config, lanes, progress = step.config, step.lanes, step.progress
        inference = lanes.inference
        instances = self._instance_states(local)
        live_inference = inference is not None and not inference.released
        return ResourceSnapshot(
            now=step.now,
            trigger=trigger,
            num_gpus=config.num_gpus,
            actor_gpus=max(lanes.actor.num_gpus, lanes.actor_target),
            actor_model_parallel=config.training.model_parallel,
            minibatch_samples=lanes.minibatch_samples,
            num_minibatches=config.training.num_minibatches,
            minibatches_done=len(lanes.minibatches),
            rollout_instances=instances,
            unfinished_fraction=progress.unfinished_fraction(),
            samples_per_instance_per_minibatch=(progress.num_done - self.done_at_last_minibatch)
            / max(1, len(local)),
            inference_range=(inference.gpu_start, inference.num_gpus) if live_inference else None,
            inference_done=lanes.inference_done,
        )

    def _instance_states(self, local: list[int]) -> tuple[RolloutInstanceState, ...]:
        """The local instances' states now. A step decides on every finished group, so the states
        of the same instances are kept, and only those the pool touched since are read again."""
        pool = self.step.pool
        touched = pool.take_touched()
        cached_local, position, states = self._states_cache
        if cached_local is not local:  # instances came or went: read them all
            position = {i: k for k, i in enumerate(local)}
            states = [None] * len(local)
            touched = local
        counts = pool.num_outstanding() if touched else []
        for i in touched:
            k = position.get(i)
            if k is not None:
                place = pool.places[i]
                states[k] = RolloutInstanceState(
                    i, place.gpu_start, place.num_gpus, counts[i], place.borrowed
                )
        self._states_cache = (local, position, states)
        return tuple(states)
