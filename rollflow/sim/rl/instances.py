"""The step's reserved rollout instances and the sequences that move between instances.

Where local instances start: collocated, on every GPU (borrowed from the actor); disaggregated, on
the rollout GPUs and, with the pre-process policy, on the actor's too. Off-policy (the previous step
still trains at `start`) they wait for its lanes: a collocated step adds them when its sync ends
(`on_lanes_free`), a disaggregated one each when the previous step's lanes leave its GPUs
(`gpus_free_at`). Until then the step holds back the samples the instances up so far cannot batch
(`hold_cap` each): instances do not steal work, so a queue there would stay there.

A retired instance (released by the resource scheduler, offloaded, preempted) hands back its
unfinished sequences; they resume elsewhere (`migrate` or `restart`, see `rollout.resume`), parked
until an instance takes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollflow.sim.events import Event, Phase
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.rollout import ResumeMode, resume

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


class StepInstances:
    def __init__(self, step: StepSimulator, gpus_free_at: Sequence[float]) -> None:
        """`gpus_free_at`: per reserved GPU, when the previous step's lanes last use it."""
        self.step = step
        config = step.config
        self.gpus_free_at = tuple(gpus_free_at)
        self.num_joins_pending = 0  # local instances waiting for the previous step's lanes
        self.held: list[SimRequest] = []  # samples waiting for the local instances (off-policy)
        # What an early instance gets before the others join: its share of the step were every
        # instance up, and no more than it can batch.
        num_instances = config.num_gpus // config.rollout.tensor_parallel + config.spot.instances
        self.hold_cap = min(
            config.rollout.scheduler.batch_size_cap,
            config.rollout.execution.max_batch_size,
            -(-step.progress.num_samples // num_instances),
        )
        self.parked: list[SimRequest] = []  # stopped sequences waiting for an instance to take them
        self.regenerated = 0  # tokens to generate again (restarted sequences)
        self.reprefill = 0  # tokens migrated sequences re-prefill
        self.migrated = 0
        self.preempted_sequences = 0

    def start(self) -> None:
        """Start the local instances the step can have now; schedule the others."""
        step = self.step
        config, pool = step.config, step.pool
        if step.late:
            step.emit(step.lanes_free_at, Phase.MOVE, self._on_lanes_free)
        if step.collocated:
            if not step.late:
                self._add_collocated()
            return
        tp = config.rollout.tensor_parallel
        places = []
        if config.scheduling.kind == "dynamic" and config.scheduling.pre_process:
            places += [(gpu, True) for gpu in range(0, step.lanes.actor.num_gpus - tp + 1, tp)]
        first, count = config.gpu_ranges()["rollout"]
        places += [(gpu, False) for gpu in range(first, first + count, tp)]
        self.hold_cap = min(self.hold_cap, -(-step.progress.num_samples // len(places)))
        for gpu, borrowed in places:
            free_at = max(self.gpus_free_at[gpu : gpu + tp], default=0.0)
            if free_at <= step.start:
                pool.add_instance(gpu, "local", borrowed=borrowed)
            else:
                self.num_joins_pending += 1
                step.emit(free_at, Phase.MOVE, self._on_gpus_free, (gpu, borrowed))

    def submit_all(self, requests: list[SimRequest]) -> None:
        """The step's unfinished samples: to the instances, or held for those still to join."""
        step, pool = self.step, self.step.pool
        pool.check_servable(requests)
        if step.late and (step.collocated or self.num_joins_pending):
            self.held = requests
            self._release_held(self.hold_cap * len(pool.accepting_ids()))
        else:
            for request in requests:
                pool.submit(request)

    def _add_collocated(self) -> None:
        step = self.step
        tp = step.config.rollout.tensor_parallel
        for gpu in range(0, step.config.num_gpus, tp):
            step.pool.add_instance(gpu, "local", borrowed=True)

    def _release_held(self, count: int) -> None:
        """Submit up to `count` held samples: early instances get what they can batch, no queue the
        local instances could not take from them later (instances do not steal work). While no
        instance takes work (every preemptible one past its notice) they stay held, as the live
        manager queues them, until an instance joins (`on_instance_ready`) or the lanes free."""
        if not self.held or not self.step.offload.targets():
            return
        released, self.held = self.held[:count], self.held[count:]
        for request in released:
            self.step.pool.submit(request)

    def release_held_early(self, count: int) -> None:
        """Before the previous step's lanes are free, room for `count` more held samples came up."""
        if self.held and self.step.now < self.step.lanes_free_at:
            self._release_held(count)

    def on_instance_ready(self) -> None:
        """An instance joined: it takes the parked sequences, and the held samples it can batch
        (all of them once the previous step's lanes are free)."""
        self.submit_parked()
        if self.held:
            self._release_held(self.hold_cap if self.step.now < self.step.lanes_free_at else len(self.held))

    def take_waiting(self) -> list[SimRequest]:
        """The samples held back and the sequences parked, taken off the step's hands."""
        waiting = self.held + self.parked
        self.held, self.parked = [], []
        return waiting

    def _on_gpus_free(self, event: Event) -> list[Event]:
        """The previous step's lanes left these GPUs: this step's rollout instance starts there."""
        step = self.step
        gpu, borrowed = event.payload
        self.num_joins_pending -= 1
        if not step.progress.rollout_done:
            step.pool.add_instance(gpu, "local", borrowed=borrowed)
            self._release_held(len(self.held) if not self.num_joins_pending else self.hold_cap)
        return step.emitted()

    def _on_lanes_free(self, event: Event) -> list[Event]:
        """The previous step's sync is done: its GPUs train this step and, collocated, roll it out."""
        step = self.step
        if step.collocated and not step.progress.rollout_done and not step.offload.offloaded:
            self._add_collocated()
        self._release_held(len(self.held))
        step.lanes.dispatch()
        return step.emitted()

    def retire(self, instance_id: int, mode: ResumeMode, preempted: bool = False) -> None:
        """Stop an instance at its next iteration boundary; its sequences resume by `mode`."""
        step = self.step
        step.pool.retire(
            instance_id,
            lambda requests: (
                step.queue.event(step.now, Phase.MOVE, self._on_stopped, payload=(requests, mode, preempted)),
            ),
        )

    def _on_stopped(self, event: Event) -> list[Event]:
        step = self.step
        requests, mode, preempted = event.payload
        if preempted:
            self.preempted_sequences += len(requests)
        if requests and step.partial.enabled and step.progress.rollout_done:  # stopped as the batch filled
            step.partial.carry(requests)
        elif requests:
            self._resume_all(requests, mode)
        step.lanes.dispatch()
        return step.emitted()

    def _resume_all(self, requests: list[SimRequest], mode: ResumeMode) -> None:
        for request in requests:
            reprefill, lost = resume(request, mode)
            self.regenerated += lost
            self.reprefill += reprefill if mode == "migrate" else 0
            self.migrated += 1
        self.parked.extend(requests)
        self.submit_parked()

    def submit_parked(self) -> None:
        """Parked sequences go to the instances that take them now, if there are any."""
        pool = self.step.pool
        if not self.parked or not self.step.offload.targets():
            return
        parked, self.parked = self.parked, []
        for request in parked:
            pool.submit(request)
