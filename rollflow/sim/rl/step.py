"""One RL training step as events: rollout -> reward -> inference -> actor mini-batches -> weight sync.

    start       rollout instances on their GPUs (borrowed ones on the actor's), every sample routed
    loop        the earliest of the pool's serving events and the step's own events:
      batch end   finished samples; a finished group is rewarded, then ready for inference
      lane done   an inference pass or a mini-batch finished on its GPUs; pick the next task
      spot        instance ready / preemption notice / preempted (its sequences resume elsewhere)
      budget      local rollout hands its leftovers to remote instances (the offload policy)
      delivered   finished samples the manager's relay was behind on reach the step (`manager`)
    after each  snapshot -> ResourceScheduler.decide -> apply (release + migrate, grow the actor)
    end         last mini-batch -> weight sync

Partial rollout (`partial_rollout` > 0): the step generates its carried-over samples and enough
new groups to keep `num_prompts + partial_rollout` groups going; when `num_prompts` groups have
finished the batch is full, every instance stops at its next iteration boundary and the samples
of the other groups are handed to the next step (`carried_out`, see `rollflow.sim.rl.partial`),
with those a preemptible instance's preemption left waiting for an instance.

Off-policy (`off_policy` >= 1): the runner starts a step's rollout before the previous step has
trained (`lanes_free_at` > `start`). Until then the lanes wait, and so do the rollout instances on
the actor's GPUs: a collocated step starts on its preemptible instances alone, holding back the
samples they cannot batch yet, and adds its local instances when the previous step's sync ends.
A disaggregated step starts each rollout instance once the previous step's lanes have left its
GPUs (`gpus_free_at`: a dynamic actor that grew onto rollout GPUs keeps them until its last
mini-batch), holding back the samples the instances up so far cannot batch.

GPU work other than rollout runs on *lanes*: the actor's GPUs (a prefix that can grow) and,
when placed apart, the inference GPUs; without them inference runs on the actor's lane first.
A lane waits while a live rollout instance sits on its GPUs (collocated or borrowed rollout).

The step's events share the rollout simulator's queue (`rollflow.sim.events`), with phases after
the serving ones: at equal times every batch that ended is in before the step acts, and the
step's own events go rollout, reward, inference, training, sync, then instance moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollflow.errors import UserError
from rollflow.phases import PhaseTimer
from rollflow.policy.offload import OffloadBalancer
from rollflow.policy.resources import (
    ResourceScheduler,
    ResourceSnapshot,
    RolloutInstanceState,
    Trigger,
    valid_actor_sizes,
)
from rollflow.policy.view import ClusterView, InstanceView
from rollflow.sim.build import GroupPlan, build_groups
from rollflow.sim.events import Event, Handler, Phase
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.accounting import summarize_step
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.manager import ManagerCapacity, ManagerRelay
from rollflow.sim.rl.partial import CarriedSample, stop_sample
from rollflow.sim.rl.rollout import ResumeMode, RolloutPool, resume
from rollflow.sim.rl.spot import SpotMarket, serving_window
from rollflow.sim.rl.staleness import sample_versions
from rollflow.sim.rl.trace import InstanceTrace, StepResult, StepTrace
from rollflow.sim.workload import build_requests


@dataclass
class Lane:
    """GPUs that run inference passes, mini-batches and reshards, one at a time."""

    name: str
    gpu_start: int
    num_gpus: int
    busy: bool = False
    released: bool = False


class StepSimulator:
    def __init__(
        self,
        config: RLSimConfig,
        index: int,
        start: float,
        costs: StepCosts,
        scheduler: ResourceScheduler,
        balancer: OffloadBalancer | None = None,
        market: SpotMarket | None = None,
        groups: list[GroupPlan] | None = None,
        lanes_free_at: float | None = None,
        sync_ends: Sequence[float] = (),
        carried: Sequence[CarriedSample] = (),
        gpus_free_at: Sequence[float] = (),
        manager: ManagerCapacity | None = None,
    ) -> None:
        """`groups`: the rollout cluster's built replica groups, shared by a run's steps.
        `lanes_free_at`: when the previous step's training and sync end (off-policy: after `start`).
        `sync_ends`: when each earlier step's weights reached rollout, for the tokens' versions.
        `carried`: the previous step's unfinished groups (partial rollout), generated first.
        `gpus_free_at`: per reserved GPU, when the previous step's lanes last use it (off-policy: a
        disaggregated rollout instance starts on its GPUs no earlier, e.g. after a grown actor).
        `manager`: the relay processes finished samples pass through (None: not simulated)."""
        self.config = config
        self.index = index
        self.start = start
        self.lanes_free_at = start if lanes_free_at is None else max(start, lanes_free_at)
        self.late = self.lanes_free_at > start  # the previous step still trains when this one starts
        self.sync_ends = tuple(sync_ends)
        self.gpus_free_at = tuple(gpus_free_at)
        self.num_joins_pending = (
            0  # rollout instances waiting for the previous step's lanes to leave their GPUs
        )
        self.costs = costs
        self.scheduler = scheduler
        self.balancer = balancer
        self.market = market
        self.relay = ManagerRelay(manager, start) if manager is not None else None
        workload = config.workload
        self.group_size = workload.samples_per_prompt
        self.partial = config.partial_rollout > 0
        self.requests, self.earlier_versions = self._samples(carried)
        # carried-over samples re-prefill their prompt and the tokens they generated
        self.reprefill = sum(r.num_prefill for r in self.requests[: len(carried)] if not r.completed)
        for request in self.requests:
            if not request.completed:
                request.arrived_at = start
        self.num_samples = workload.num_prompts * self.group_size  # the samples it trains
        self.minibatch_samples = self.num_samples // config.training.num_minibatches
        rollout_config = config.rollout_sim_config()
        groups = groups if groups is not None else build_groups(rollout_config)
        self.pool = RolloutPool(rollout_config, groups, self._on_batch_completed, start)
        self.queue = self.pool.sim.events
        self._out: list[Event] = []  # events the handler running now causes
        ranges = config.gpu_ranges()
        self.collocated = config.placement.kind == "collocated"
        self.spot = market is not None and market.num_slots > 0
        self.pipelined = config.placement.pipelining or self.spot
        self.actor = Lane("actor", 0, ranges["actor"][1])
        self.valid_actor_sizes = valid_actor_sizes(
            config.num_gpus, config.training.model_parallel, self.minibatch_samples
        )
        inference = ranges.get("inference")
        self.inference = Lane("inference", *inference) if inference else None
        self.actor_target = self.actor.num_gpus
        self.hold_last = False
        self.end: float | None = None
        # progress
        self.group_left = [self.group_size] * (len(self.requests) // self.group_size)
        self.trained_groups: list[int] = []  # in the order they finished
        self.carried_out: list[CarriedSample] = []  # partial rollout: for the next step
        self.num_done = 0
        self.done_at_last_minibatch = 0
        self.ready: list[int] = []
        self.inferred: list[int] = []
        self.rollout_done = False
        self.rollout_end: float | None = None
        self.held: list[SimRequest] = []  # samples waiting for the local instances (off-policy, collocated)
        # Off-policy, collocated: what an early (preemptible) instance gets before the local ones join:
        # its share of the step were every instance up, and no more than it can batch.
        num_instances = config.num_gpus // config.rollout.tensor_parallel + config.spot.instances
        self.hold_cap = min(
            config.rollout.scheduler.batch_size_cap,
            config.rollout.execution.max_batch_size,
            -(-self.num_samples // num_instances),
        )
        self.inference_done = False
        self.minibatches: list[list[int]] = []
        self.actor_sizes: list[int] = []
        self.actor_free_at: float | None = None
        # the executor's moves (dynamic): one at a time; the actor's next task waits for them
        self.moves_free_at = start
        self.num_released = 0  # instances released in the step: each wakes at its end
        self._moves_wake: float | None = None  # when a dispatch waiting for the moves is due
        self.parked: list[SimRequest] = []
        self.offloaded = False
        self.budget_spent = False
        self.spot_instance: dict[int, int] = {}
        # membership reads, cached on the pool's version (see RolloutPool.version)
        self._blocked_cache: tuple[tuple[int, int, int], bool] = ((-1, -1, -1), False)
        self._local_cache: tuple[int, list[int]] = (-1, [])
        self._states_cache: tuple[list[int] | None, dict[int, int], list] = (None, {}, [])
        # accounting
        self.timer = PhaseTimer(clock=lambda: self.now)  # the step's own phases, on the simulated clock
        self.regenerated = 0
        self.migrated = 0
        self.preemptions = 0
        self.preempted_sequences = 0

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> StepResult:
        self._begin()
        self.queue.push_all(self._emitted())
        self.pool.sim.advance(stop=lambda: self.end is not None)
        if self.end is None:
            if self.parked:
                raise UserError(
                    f"step {self.index} cannot finish: {len(self.parked)} sequences wait for a rollout "
                    "instance and none will come (extend the spot availability trace)"
                )
            raise RuntimeError(
                f"step {self.index} stalled: {self.num_done}/{self.num_samples} generated, "
                f"{len(self.inferred)} inferred, {len(self.minibatches)} mini-batches trained"
            )
        return summarize_step(self.trace())

    def _emit(self, time: float, phase: Phase, handler: Handler, payload: Any = None) -> None:
        self._out.append(self.queue.event(time, phase, handler, payload=payload))

    def _emitted(self) -> list[Event]:
        """What the running handler returns: the events it caused."""
        out, self._out = self._out, []
        return out

    @property
    def now(self) -> float:
        return self.pool.now

    # -- step start ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        config, pool = self.config, self.pool
        tp = config.rollout.tensor_parallel
        ranges = config.gpu_ranges()
        if self.late:
            self._emit(self.lanes_free_at, Phase.MOVE, self._on_lanes_free)
        if self.collocated:
            if not self.late:
                self._add_collocated_instances()
        else:
            places = []
            if config.scheduling.kind == "dynamic" and config.scheduling.pre_process:
                places += [(gpu, True) for gpu in range(0, self.actor.num_gpus - tp + 1, tp)]
            start, count = ranges["rollout"]
            places += [(gpu, False) for gpu in range(start, start + count, tp)]
            self.hold_cap = min(self.hold_cap, -(-self.num_samples // len(places)))
            for gpu, borrowed in places:
                free_at = max(self.gpus_free_at[gpu : gpu + tp], default=0.0)
                if free_at <= self.start:
                    pool.add_instance(gpu, "local", borrowed=borrowed)
                else:
                    self.num_joins_pending += 1
                    self._emit(free_at, Phase.MOVE, self._on_gpus_free, (gpu, borrowed))
        if self.spot:
            for slot in range(self.market.num_slots):
                self._schedule_slot(slot, self.start, at_start=True)
            self._emit(self.lanes_free_at + self.balancer.budget_s, Phase.MOVE, self._on_budget)
        unfinished = [r for r in self.requests if not r.completed]
        pool.check_servable(unfinished)
        if self.late and (self.collocated or self.num_joins_pending):
            self.held = unfinished
            self._release_held(self.hold_cap * len(pool.accepting_ids()))
        else:
            for request in unfinished:
                pool.submit(request)
        self._decide("step_start")
        finished = [r for r in self.requests if r.completed]  # carried over finished
        if finished:
            self._count_done(finished, self.start + self.config.reward_s)

    def _samples(
        self, carried: Sequence[CarriedSample]
    ) -> tuple[list[SimRequest], dict[int, dict[int, int]]]:
        """The step's samples, numbered so that sample i is in group i // group_size: the carried
        groups first, then new ones up to num_prompts + partial_rollout groups in all. Also the
        tokens each carried sample made in earlier steps, by its new id."""
        workload = self.config.workload
        carried = sorted(carried, key=lambda c: (c.group, c.request.id))
        num_carried_groups = len(carried) // self.group_size
        fresh = workload.num_prompts + self.config.partial_rollout - num_carried_groups
        requests = [c.request for c in carried]
        if fresh > 0:
            requests += build_requests(
                workload.model_copy(update={"num_prompts": fresh}), self.config.seed + self.index
            )
        for new_id, request in enumerate(requests):
            request.id = new_id
        return requests, {new_id: c.versions for new_id, c in enumerate(carried)}

    def _group(self, group: int) -> list[SimRequest]:
        return self.requests[group * self.group_size : (group + 1) * self.group_size]

    def _add_collocated_instances(self) -> None:
        tp = self.config.rollout.tensor_parallel
        for gpu in range(0, self.config.num_gpus, tp):
            self.pool.add_instance(gpu, "local", borrowed=True)

    def _release_held(self, count: int) -> None:
        """Submit up to `count` held samples: early instances get what they can batch, no queue the
        local instances could not take from them later (instances do not steal work)."""
        released, self.held = self.held[:count], self.held[count:]
        for request in released:
            self.pool.submit(request)

    def _on_gpus_free(self, event: Event) -> list[Event]:
        """The previous step's lanes left these GPUs: this step's rollout instance starts there."""
        gpu, borrowed = event.payload
        self.num_joins_pending -= 1
        if not self.rollout_done:
            self.pool.add_instance(gpu, "local", borrowed=borrowed)
            self._release_held(len(self.held) if not self.num_joins_pending else self.hold_cap)
        return self._emitted()

    def _on_lanes_free(self, event: Event) -> list[Event]:
        """The previous step's sync is done: its GPUs train this step and, collocated, roll it out."""
        if self.collocated and not self.rollout_done and not self.offloaded:
            self._add_collocated_instances()
        self._release_held(len(self.held))
        self._dispatch()
        return self._emitted()

    # -- rollout progress ---------------------------------------------------------------------------
    def _on_batch_completed(self, requests: list[SimRequest], now: float) -> Sequence[Event]:
        # Called from inside the pool's batch handling: act on it as the step's own event.
        return (self.queue.event(now, Phase.ROLLOUT, self._on_samples_done, payload=requests),)

    def _count_done(self, requests: list[SimRequest], reward_at: float) -> None:
        """Finished samples: a finished group is trained (rewarded first) until the batch is full."""
        for request in requests:
            self.num_done += 1
            group = request.id // self.group_size
            self.group_left[group] -= 1
            if self.group_left[group] == 0 and len(self.trained_groups) < self.config.workload.num_prompts:
                self.trained_groups.append(group)
                self._emit(reward_at, Phase.REWARD, self._on_group_ready, group)
                if self.partial and len(self.trained_groups) == self.config.workload.num_prompts:
                    self._batch_full()

    def _batch_full(self) -> None:
        """Partial rollout: the other groups stop where they are and wait for the next step.
        Every instance stops first, so the resource scheduler finds none left to release."""
        self.rollout_done = True
        self.rollout_end = self.now
        held, parked, self.held, self.parked = self.held, self.parked, [], []
        self._carry(held + parked)  # parked: a preempted instance's, waiting for another
        for instance_id in self.pool.live_ids():
            self.pool.retire(
                instance_id,
                lambda requests: (
                    self.queue.event(self.now, Phase.MOVE, self._on_aborted, payload=requests),
                ),
            )
        self._decide("rollout_done")

    def _on_aborted(self, event: Event) -> list[Event]:
        self._carry(event.payload)
        self.rollout_end = max(self.rollout_end or self.now, self.now)  # instances busy until here
        self._dispatch()
        return self._emitted()

    def _carry(self, requests: list[SimRequest]) -> None:
        for request in requests:
            earlier = self.earlier_versions.get(request.id, {})
            self.carried_out.append(
                stop_sample(request, request.id // self.group_size, earlier, self.now, self.sync_ends)
            )

    def _on_samples_done(self, event: Event) -> list[Event]:
        """Samples generated now: they reach the step when the manager has relayed their tokens."""
        if self.relay is not None:
            delivered = self.relay.delivered_at(self.now, self.pool.sim.decode_tokens)
            if delivered > self.now:
                self._emit(delivered, Phase.ROLLOUT, self._on_samples_delivered, event.payload)
                return self._emitted()
        return self._on_samples_delivered(event)

    def _on_samples_delivered(self, event: Event) -> list[Event]:
        requests: list[SimRequest] = event.payload
        self._count_done(requests, self.now + self.config.reward_s)
        if not self.partial and self.num_done == self.num_samples:
            self.rollout_done = True
            self.rollout_end = self.now
            self._decide("rollout_done")
        elif self.spot and not self.offloaded:
            self._release_idle_local()
        if self.held and self.now < self.lanes_free_at:
            self._release_held(len(requests))
        self._dispatch()
        return self._emitted()

    def _on_group_ready(self, event: Event) -> list[Event]:
        group: int = event.payload
        first = group * self.group_size
        self.ready.extend(range(first, first + self.group_size))
        self._decide("group_done")
        self._dispatch()
        return self._emitted()

    def _resume_all(self, requests: list[SimRequest], mode: ResumeMode) -> None:
        for request in requests:
            reprefill, lost = resume(request, mode)
            self.regenerated += lost
            self.reprefill += reprefill if mode == "migrate" else 0
            self.migrated += 1
        self.parked.extend(requests)
        self._submit_parked()

    def _submit_parked(self) -> None:
        pool = self.pool
        if not self.parked or not self._targets():
            return
        parked, self.parked = self.parked, []
        for request in parked:
            pool.submit(request)

    def _targets(self) -> list[int]:
        ids = self.pool.accepting_ids()
        if self.pool.remote_only:
            ids = [r.id for r in OffloadBalancer.offload_targets(self.pool.replicas[i] for i in ids)]
        return ids

    def _retire(self, instance_id: int, mode: ResumeMode, preempted: bool = False) -> None:
        self.pool.retire(
            instance_id,
            lambda requests: (
                self.queue.event(self.now, Phase.MOVE, self._on_stopped, payload=(requests, mode, preempted)),
            ),
        )

    def _on_stopped(self, event: Event) -> list[Event]:
        requests, mode, preempted = event.payload
        if preempted:
            self.preempted_sequences += len(requests)
        if requests and self.partial and self.rollout_done:  # stopped as the batch filled: carried
            self._carry(requests)
        elif requests:
            self._resume_all(requests, mode)
        self._dispatch()
        return self._emitted()

    # -- resource scheduling (RLinf) --------------------------------------------------------------------
    def _decide(self, trigger: Trigger) -> None:
        local = self._live_local()
        inference = self.inference
        snapshot = self._resource_snapshot(trigger, local)
        plan = self.scheduler.decide(snapshot)
        if trigger == "minibatch_end":
            self.done_at_last_minibatch = self.num_done
        moves = self.config.scheduling.kind == "dynamic"  # (static: rollout just stops, nothing moves)
        for instance_id in plan.release_instances:
            if instance_id in local:
                self._retire(instance_id, "migrate")
                if moves:
                    self.moves_free_at = max(self.moves_free_at, self.now) + self.config.scheduling.release_s
                    self.num_released += 1
        if plan.release_inference and inference is not None:
            inference.released = True
        if plan.actor_gpus not in self.valid_actor_sizes or plan.actor_gpus < snapshot.actor_gpus:
            raise ValueError(
                f"{self.scheduler.name} asked for {plan.actor_gpus} actor GPUs; valid: {self.valid_actor_sizes}"
            )
        self.actor_target = plan.actor_gpus
        self.hold_last = plan.hold_last_minibatch

    def _resource_snapshot(self, trigger: Trigger, local: list[int]) -> ResourceSnapshot:
        """What the resource scheduler decides from: the step's progress and its local instances."""
        inference, now = self.inference, self.now
        instances = self._instance_states(local)
        live_inference = inference is not None and not inference.released
        return ResourceSnapshot(
            now=now,
            trigger=trigger,
            num_gpus=self.config.num_gpus,
            actor_gpus=max(self.actor.num_gpus, self.actor_target),
            actor_model_parallel=self.config.training.model_parallel,
            minibatch_samples=self.minibatch_samples,
            num_minibatches=self.config.training.num_minibatches,
            minibatches_done=len(self.minibatches),
            rollout_instances=instances,
            unfinished_fraction=self._unfinished_fraction(),
            samples_per_instance_per_minibatch=(self.num_done - self.done_at_last_minibatch)
            / max(1, len(local)),
            inference_range=(inference.gpu_start, inference.num_gpus) if live_inference else None,
            inference_done=self.inference_done,
        )

    def _instance_states(self, local: list[int]) -> tuple[RolloutInstanceState, ...]:
        """The local instances' states now. A step decides on every finished group, so the states
        of the same instances are kept, and only those the pool touched since are read again."""
        pool = self.pool
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

    def _unfinished_fraction(self) -> float:
        """Of the batch, the share not generated yet (partial rollout: of its groups)."""
        if self.partial:
            num_prompts = self.config.workload.num_prompts
            return (num_prompts - len(self.trained_groups)) / num_prompts
        return (self.num_samples - self.num_done) / self.num_samples

    # -- lanes: inference, training, resharding -------------------------------------------------------
    def _dispatch(self) -> None:
        if self.now < self.lanes_free_at:
            return  # the previous step still trains; `_on_lanes_free` dispatches
        if self.inference is not None and not self.inference.busy and not self.inference.released:
            self._try_inference(self.inference)
        lane = self.actor
        if lane.busy or self.end is not None or self._blocked(lane):
            return
        if self.actor_free_at is None:
            self.actor_free_at = self.now
        if self.now < self.moves_free_at:  # the live actor's thread waits for the executor's lock
            if self._moves_wake != self.moves_free_at:
                self._moves_wake = self.moves_free_at
                self._emit(self.moves_free_at, Phase.MOVE, self._on_moves_done)
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

    def _blocked(self, lane: Lane) -> bool:
        """Whether a rollout instance still up holds any of the lane's GPUs (the answer is cached
        until the pool's instances change)."""
        pool = self.pool
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

    def _live_local(self) -> list[int]:
        """Local instances neither retired nor retiring (cached until the pool's instances change)."""
        pool = self.pool
        if self._local_cache[0] != pool.version:
            self._local_cache = (
                pool.version,
                [r.id for r in OffloadBalancer.offload_sources(pool.replicas[i] for i in pool.live_ids())],
            )
        return self._local_cache[1]

    def _on_moves_done(self, event: Event) -> list[Event]:
        self._dispatch()
        return self._emitted()

    def _try_inference(self, lane: Lane) -> bool:
        if not self.ready or not (self.pipelined or self.rollout_done):
            return False
        # At most a mini-batch per pass, so that the actor's next mini-batch is never held
        # behind a long pass over samples it does not need yet.
        batch, self.ready = self.ready[: self.minibatch_samples], self.ready[self.minibatch_samples :]
        tokens = sum(self.requests[i].prompt_tokens + self.requests[i].output_tokens for i in batch)
        self._run(
            lane, "inference", self.costs.inference_s(tokens, lane.num_gpus), lambda: self._inferred(batch)
        )
        return True

    def _inferred(self, batch: list[int]) -> None:
        self.inferred.extend(batch)
        if len(self.inferred) == self.num_samples:
            self.inference_done = True
            self._decide("inference_done")

    def _try_train(self, lane: Lane) -> None:
        k = len(self.minibatches)
        size = self.minibatch_samples
        last = k == self.config.training.num_minibatches - 1
        if k == self.config.training.num_minibatches or len(self.inferred) < (k + 1) * size:
            return
        if not self.pipelined and not self.inference_done:
            return
        if last and self.hold_last and not (self.rollout_done and self.inference_done):
            return
        ids = self.inferred[k * size : (k + 1) * size]
        tokens = sum(self.requests[i].prompt_tokens + self.requests[i].output_tokens for i in ids)
        self.minibatches.append(ids)
        self.actor_sizes.append(lane.num_gpus)
        self._run(
            lane, "training", self.costs.train_s(tokens, lane.num_gpus), self._trained, f"mini-batch {k}"
        )

    def _trained(self) -> None:
        self._decide("minibatch_end")
        if len(self.minibatches) == self.config.training.num_minibatches:
            # the released instances wake first, one after another, then the weights go to all of them
            start = max(self.now, self.moves_free_at) + self.num_released * self.config.scheduling.resume_s
            seconds = self.costs.sync_s(self.collocated, to_spot=self.spot)
            self.timer.record("sync", start, start + seconds, 0, self.config.num_gpus)
            self._emit(start + seconds, Phase.SYNC, self._on_step_end)

    def _run(
        self, lane: Lane, component: str, seconds: float, on_done: Callable[[], None], label: str = ""
    ) -> None:
        lane.busy = True
        self.timer.start(component, seconds, lane.gpu_start, lane.num_gpus, label)
        phase = Phase.INFERENCE if component == "inference" else Phase.TRAIN
        self._emit(self.now + seconds, phase, self._on_lane_done, (lane, on_done))

    def _on_lane_done(self, event: Event) -> list[Event]:
        lane, on_done = event.payload
        lane.busy = False
        on_done()
        self._dispatch()
        return self._emitted()

    # -- preemptible instances (RLBoost) ----------------------------------------------------------------
    def _schedule_slot(self, slot: int, after: float, at_start: bool = False) -> None:
        market = self.market
        life = market.life_at_or_after(slot, after)
        while life is not None:
            ready, stop = serving_window(life, market)
            if ready < stop and stop > after:
                break
            life = market.life_at_or_after(slot, life[1])
        if life is None:
            return
        if at_start and ready <= after:
            self._spot_ready(slot, life)
        else:
            self._emit(max(ready, after), Phase.MOVE, self._on_spot_ready, (slot, life))

    def _on_spot_ready(self, event: Event) -> list[Event]:
        self._spot_ready(*event.payload)
        return self._emitted()

    def _spot_ready(self, slot: int, life: tuple[float, float]) -> None:
        gpu_start = self.config.num_gpus + slot * self.config.rollout.tensor_parallel
        instance_id = self.pool.add_instance(gpu_start, "spot")
        self.spot_instance[slot] = instance_id
        _, stop = serving_window(life, self.market)
        self._emit(stop, Phase.MOVE, self._on_spot_notice, instance_id)
        self._emit(life[1], Phase.MOVE, self._on_spot_kill, (slot, life))
        self._submit_parked()
        if self.held and self.now < self.lanes_free_at:
            self._release_held(self.hold_cap)
        if self.budget_spent or self.balancer.expired(self.now, self.lanes_free_at):
            self._offload()

    def _on_spot_notice(self, event: Event) -> list[Event]:
        self.pool.stop_accepting(event.payload)
        return self._emitted()

    def _on_spot_kill(self, event: Event) -> list[Event]:
        slot, life = event.payload
        instance_id = self.spot_instance.pop(slot)
        if self.pool.is_up(instance_id):
            self.preemptions += 1
            self._retire(instance_id, self.config.spot.on_preemption, preempted=True)
        self._schedule_slot(slot, life[1])
        return self._emitted()

    def _on_budget(self, event: Event) -> list[Event]:
        self.budget_spent = True  # (now - start may round below the budget it was scheduled at)
        self._offload()
        return self._emitted()

    def _offload(self) -> None:
        """Budget spent: local instances stop, their unfinished sequences go to remote ones."""
        if self.offloaded or self.rollout_done:
            return
        view = self._cluster_view()
        if not OffloadBalancer.offload_targets(view.instances):
            return  # nowhere to send them: local rollout goes on, retried when an instance arrives
        self.offloaded = True
        self.pool.remote_only = True
        for instance in OffloadBalancer.offload_sources(view.instances):
            self._retire(instance.instance_id, "migrate")

    def _release_idle_local(self) -> None:
        """Local instances with nothing left to generate hand their GPUs to training at once."""
        view = self._cluster_view()
        sources = OffloadBalancer.offload_sources(view.instances)
        targets = OffloadBalancer.offload_targets(view.instances)
        if sources and all(s.num_outstanding == 0 for s in sources) and targets:
            self.offloaded = True
            self.pool.remote_only = True
            for instance in sources:
                self._retire(instance.instance_id, "migrate")

    def _cluster_view(self) -> ClusterView:
        """Instances taking work, with their kind, as the offload policy reads them."""
        pool = self.pool
        views: list[InstanceView] = [pool.view(i) for i in pool.accepting_ids()]
        return ClusterView(self.now, views)

    # -- step end -----------------------------------------------------------------------------------
    def _on_step_end(self, event: Event) -> list[Event]:
        self.end = self.now
        self.pool.close()
        if self.partial:
            trained = set(self.trained_groups)
            for request in self.requests:
                group = request.id // self.group_size
                if request.completed and group not in trained:
                    versions = self.earlier_versions.get(request.id)
                    self.carried_out.append(
                        CarriedSample(request, group, sample_versions(request, self.sync_ends, versions))
                    )
            if len(self.carried_out) != len(self.requests) - self.num_samples:
                raise RuntimeError(
                    f"step {self.index}: {len(self.carried_out)} samples carried over, expected "
                    f"{len(self.requests) - self.num_samples} (an instance had not stopped by the step's end)"
                )
        return self._emitted()

    def trace(self) -> StepTrace:
        """What the finished step did, for accounting."""
        assert self.end is not None, "the step has not finished"
        return StepTrace(
            config=self.config,
            index=self.index,
            start=self.start,
            end=self.end,
            paid_from=self.lanes_free_at,
            rollout_end=self.rollout_end if self.rollout_end is not None else self.end,
            sync_ends=self.sync_ends,
            requests=[r for g in sorted(self.trained_groups) for r in self._group(g)],
            earlier_versions=self.earlier_versions,
            num_carried_out=len(self.carried_out),
            num_tokens_carried_out=sum(sum(c.versions.values()) for c in self.carried_out),
            spans=self.timer.spans,
            instances=[
                InstanceTrace(
                    place.gpu_start,
                    place.num_gpus,
                    replica.kind,
                    replica.started_at,
                    replica.retired_at,
                    replica.stats.batches,
                )
                for place, replica in zip(self.pool.places, self.pool.replicas, strict=True)
            ],
            actor_free_at=self.actor_free_at,
            minibatches=self.minibatches,
            actor_sizes=self.actor_sizes,
            regenerated_tokens=self.regenerated,
            reprefill_tokens=self.reprefill,
            num_migrated=self.migrated,
            num_preemptions=self.preemptions,
            preempted_sequences=self.preempted_sequences,
            spot_market=self.market if self.spot else None,
            offload_budget_s=self.balancer.budget_s if self.balancer is not None else None,
            manager=self.relay.capacity if self.relay is not None else None,
            manager_delay_s=self.relay.delay_s if self.relay is not None else 0.0,
            manager_max_wait_s=self.relay.max_wait_s if self.relay is not None else 0.0,
        )
