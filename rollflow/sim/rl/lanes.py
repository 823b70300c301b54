"""The step's GPU work other than rollout, on lanes: inference passes, mini-batches, reshards, sync.

Lanes are the actor's GPUs (a prefix that can grow, as the resource scheduler's plan says) and,
when placed apart, the inference GPUs; without them inference runs on the actor's lane first. A lane
runs one task at a time, and waits while a live rollout instance sits on its GPUs (collocated or
borrowed rollout). Unpipelined, inference starts once the rollout is done and training once every
sample is inferred; the last mini-batch's end starts the weight sync, whose end ends the step.

A dynamic step's moves cost what the live executor's take: each rollout instance released holds the
executor `scheduling.release_s`, one move after another, and the actor's next task waits for those
under way (live, the trainer's thread takes the executor's lock, or applies a mini-batch end's plan
itself); at step end each released instance wakes, `scheduling.resume_s` each, before the sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollflow.phases import PhaseTimer
from rollflow.sim.events import Event, Phase
from rollflow.sim.rl.costs import StepCosts

if TYPE_CHECKING:
    from rollflow.sim.rl.step import StepSimulator


@dataclass
class Lane:
    """GPUs that run inference passes, mini-batches and reshards, one at a time."""

    name: str
    gpu_start: int
    num_gpus: int
    busy: bool = False
    released: bool = False


class Lanes:
    def __init__(self, step: StepSimulator, costs: StepCosts) -> None:
        self.step = step
        self.costs = costs
        config = step.config
        ranges = config.gpu_ranges()
        self.actor = Lane("actor", 0, ranges["actor"][1])
        inference = ranges.get("inference")
        self.inference = Lane("inference", *inference) if inference else None
        self.pipelined = config.placement.pipelining or step.preemptible is not None
        self.minibatch_samples = step.progress.num_samples // config.training.num_minibatches
        self.num_minibatches = config.training.num_minibatches
        self.actor_target = self.actor.num_gpus  # the resource scheduler's plan; grown to when free
        self.hold_last = False  # the plan's: the last mini-batch waits for the rollout and inference
        self.inferred: list[int] = []  # sample ids, in the order their inference ended
        self.inference_done = False
        self.minibatches: list[list[int]] = []  # sample ids of each mini-batch started
        self.actor_sizes: list[int] = []  # actor GPUs of each
        self.actor_free_at: float | None = None  # when the actor's GPUs could first run
        self.timer = PhaseTimer(clock=lambda: step.now)  # the lanes' phases, on the simulated clock
        self._blocked_cache: tuple[tuple[int, int, int], bool] = ((-1, -1, -1), False)
        self.moves_free_at = step.start  # when the executor's moves under way end
        self.num_released = 0  # rollout instances released in the step: each wakes at its end
        self._moves_wake: float | None = None  # when a dispatch waiting for the moves is due

    def dispatch(self) -> None:
        """Start what the free lanes can run now."""
        step = self.step
        if step.now < step.lanes_free_at:
            return  # the previous step still trains; the step dispatches when it is done
        if self.inference is not None and not self.inference.busy and not self.inference.released:
            self._try_inference(self.inference)
        lane = self.actor
        if lane.busy or step.end is not None or self._blocked(lane):
            return
        if self.actor_free_at is None:
            self.actor_free_at = step.now
        if step.now < self.moves_free_at:  # the actor waits for the executor's moves
            if self._moves_wake != self.moves_free_at:
                self._moves_wake = self.moves_free_at
                step.emit(self.moves_free_at, Phase.MOVE, self._on_moves_done)
            return
        if self.actor_target > lane.num_gpus:
            lane.num_gpus = self.actor_target
            self._run(
                lane, "reshard", self.costs.reshard_s(lane.num_gpus), lambda: None, f"to {lane.num_gpus} GPUs"
            )
            return
        if self.inference is None and self._try_inference(lane):
            return
        self._try_train(lane)

    def released(self, seconds: float) -> None:
        """A rollout instance released (a dynamic step's move): `seconds` after the moves under way."""
        self.moves_free_at = max(self.moves_free_at, self.step.now) + seconds
        self.num_released += 1

    def _on_moves_done(self, event: Event) -> list[Event]:
        self.dispatch()
        return self.step.emitted()

    def _blocked(self, lane: Lane) -> bool:
        """Whether a rollout instance still up holds any of the lane's GPUs (the answer is cached
        until the pool's instances change)."""
        pool = self.step.pool
        end = lane.gpu_start + max(lane.num_gpus, self.actor_target if lane is self.actor else 0)
        key = (lane.gpu_start, end, pool.version)
        if self._blocked_cache[0] != key:
            blocked = any(
                replica.retired_at is None
                and place.gpu_start < end
                and lane.gpu_start < place.gpu_start + place.num_gpus
                for place, replica in zip(pool.places, pool.replicas, strict=True)
            )
            self._blocked_cache = (key, blocked)
        return self._blocked_cache[1]

    def _tokens(self, ids: list[int]) -> int:
        requests = self.step.progress.requests
        return sum(requests[i].prompt_tokens + requests[i].output_tokens for i in ids)

    def _try_inference(self, lane: Lane) -> bool:
        progress = self.step.progress
        if not progress.ready or not (self.pipelined or progress.rollout_done):
            return False
        # At most a mini-batch per pass, so that the actor's next mini-batch is never held
        # behind a long pass over samples it does not need yet.
        size = self.minibatch_samples
        batch, progress.ready = progress.ready[:size], progress.ready[size:]
        seconds = self.costs.inference_s(self._tokens(batch), lane.num_gpus)
        self._run(lane, "inference", seconds, lambda: self._inferred(batch))
        return True

    def _inferred(self, batch: list[int]) -> None:
        self.inferred.extend(batch)
        if len(self.inferred) == self.step.progress.num_samples:
            self.inference_done = True
            self.step.resources.decide("inference_done")

    def _try_train(self, lane: Lane) -> None:
        k = len(self.minibatches)
        size = self.minibatch_samples
        last = k == self.num_minibatches - 1
        if k == self.num_minibatches or len(self.inferred) < (k + 1) * size:
            return
        if not self.pipelined and not self.inference_done:
            return
        if last and self.hold_last and not (self.step.progress.rollout_done and self.inference_done):
            return
        ids = self.inferred[k * size : (k + 1) * size]
        self.minibatches.append(ids)
        self.actor_sizes.append(lane.num_gpus)
        seconds = self.costs.train_s(self._tokens(ids), lane.num_gpus)
        self._run(lane, "training", seconds, self._trained, f"mini-batch {k}")

    def _trained(self) -> None:
        step = self.step
        step.resources.decide("minibatch_end")
        if len(self.minibatches) == self.num_minibatches:
            # the released instances wake first, one after another; then the weights go to all of them
            start = max(step.now, self.moves_free_at) + self.num_released * step.config.scheduling.resume_s
            seconds = self.costs.sync_s(step.collocated, to_spot=step.preemptible is not None)
            self.timer.record("sync", start, start + seconds, 0, step.config.num_gpus)
            step.emit(start + seconds, Phase.SYNC, step.on_sync_end)

    def _run(
        self, lane: Lane, component: str, seconds: float, on_done: Callable[[], None], label: str = ""
    ) -> None:
        lane.busy = True
        self.timer.start(component, seconds, lane.gpu_start, lane.num_gpus, label)
        phase = Phase.INFERENCE if component == "inference" else Phase.TRAIN
        self.step.emit(self.step.now + seconds, phase, self._on_lane_done, (lane, on_done))

    def _on_lane_done(self, event: Event) -> list[Event]:
        lane, on_done = event.payload
        lane.busy = False
        on_done()
        self.dispatch()
        return self.step.emitted()
