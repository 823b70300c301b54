"""Rollout progress of one RL step: which samples are generated, delivered, rewarded and ready.

A batch of finished samples reaches the step through the manager's relay (`ManagerRelay`, when
simulated: it may deliver them later than they were generated); a group whose samples are all in is
rewarded (`reward_s` later) and then ready for inference, until the batch has `num_prompts` groups.
Without partial rollout the rollout is done when every sample is in; with it, when the batch is
full (`PartialRollout.batch_full`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollflow.sim.events import Event, Phase
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.manager import ManagerCapacity, ManagerRelay

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


class RolloutProgress:
    def __init__(
        self, step: StepSimulator, requests: list[SimRequest], manager: ManagerCapacity | None
    ) -> None:
        """`requests`: the step's samples, sample i in group i // samples_per_prompt.
        `manager`: the relay processes finished samples pass through (None: not simulated)."""
        self.step = step
        workload = step.config.workload
        self.requests = requests
        for request in requests:
            if not request.completed:
                request.arrived_at = step.start
        self.group_size = workload.samples_per_prompt
        self.num_samples = workload.num_prompts * self.group_size  # the samples the step trains
        self.relay = ManagerRelay(manager, step.start) if manager is not None else None
        self.group_left = [self.group_size] * (len(requests) // self.group_size)
        self.trained_groups: list[int] = []  # in the order they finished
        self.num_done = 0
        self.ready: list[int] = []  # rewarded samples waiting for inference
        self.rollout_done = False
        self.rollout_end: float | None = None

    def group(self, group: int) -> list[SimRequest]:
        return self.requests[group * self.group_size : (group + 1) * self.group_size]

    def finish(self) -> None:
        """The rollout is done now: no sample the step trains is left to generate."""
        self.rollout_done = True
        self.rollout_end = self.step.now

    def unfinished_fraction(self) -> float:
        """Of the batch, the share not generated yet (partial rollout: of its groups)."""
        if self.step.partial.enabled:
            num_prompts = self.step.config.workload.num_prompts
            return (num_prompts - len(self.trained_groups)) / num_prompts
        return (self.num_samples - self.num_done) / self.num_samples

    def count_carried_finished(self) -> None:
        """At the step's start: carried-in samples that had finished count as done (rewarded now)."""
        finished = [r for r in self.requests if r.completed]
        if finished:
            self._count_done(finished, self.step.start + self.step.config.reward_s)

    def on_batch_completed(self, requests: list[SimRequest], now: float) -> Sequence[Event]:
        """The pool's batch handling reports finished samples: the step acts on them as its own event."""
        return (self.step.queue.event(now, Phase.ROLLOUT, self._on_samples_done, payload=requests),)

    def _on_samples_done(self, event: Event) -> list[Event]:
        """Samples generated now: they reach the step when the manager has relayed their tokens."""
        step = self.step
        if self.relay is not None:
            delivered = self.relay.delivered_at(step.now, step.pool.sim.decode_tokens)
            if delivered > step.now:
                step.emit(delivered, Phase.ROLLOUT, self._on_samples_delivered, event.payload)
                return step.emitted()
        return self._on_samples_delivered(event)

    def _on_samples_delivered(self, event: Event) -> list[Event]:
        step = self.step
        requests: list[SimRequest] = event.payload
        self._count_done(requests, step.now + step.config.reward_s)
        if not step.partial.enabled and self.num_done == self.num_samples:
            self.finish()
            step.resources.decide("rollout_done")
        elif step.preemptible is not None:
            step.offload.release_idle_local()
        step.instances.release_held_early(len(requests))
        step.lanes.dispatch()
        return step.emitted()

    def _count_done(self, requests: list[SimRequest], reward_at: float) -> None:
        """Finished samples: a finished group is trained (rewarded first) until the batch is full."""
        step = self.step
        num_prompts = step.config.workload.num_prompts
        for request in requests:
            self.num_done += 1
            group = request.id // self.group_size
            self.group_left[group] -= 1
            if self.group_left[group] == 0 and len(self.trained_groups) < num_prompts:
                self.trained_groups.append(group)
                step.emit(reward_at, Phase.REWARD, self._on_group_ready, group)
                if step.partial.enabled and len(self.trained_groups) == num_prompts:
                    step.partial.batch_full()

    def _on_group_ready(self, event: Event) -> list[Event]:
        step = self.step
        first = event.payload * self.group_size
        self.ready.extend(range(first, first + self.group_size))
        step.resources.decide("group_done")
        step.lanes.dispatch()
        return step.emitted()
