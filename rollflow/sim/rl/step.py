"""One RL training step as events: rollout -> reward -> inference -> actor mini-batches -> weight sync.

    start       rollout instances on their GPUs (borrowed ones on the actor's), every sample routed
    loop        the earliest of the pool's serving events and the step's own events:
      batch end   finished samples; a finished group is rewarded, then ready for inference
      lane done   an inference pass or a mini-batch finished on its GPUs; pick the next task
      spot        instance ready / preemption notice / preempted (its sequences resume elsewhere)
      budget      local rollout hands its leftovers to remote instances (the offload policy)
    after each  snapshot -> ResourceScheduler.decide -> apply (release + migrate, grow the actor)
    end         last mini-batch -> weight sync

GPU work other than rollout runs on *lanes*: the actor's GPUs (a prefix that can grow) and,
when placed apart, the inference GPUs; without them inference runs on the actor's lane first.
A lane waits while a live rollout instance sits on its GPUs (collocated or borrowed rollout).
At equal times the pool's serving events go first, so a decision sees every batch that ended.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollflow.errors import UserError
from rollflow.policy.offload import OffloadBalancer
from rollflow.policy.resources import (
    ResourceScheduler,
    ResourceSnapshot,
    RolloutInstanceState,
    Trigger,
    valid_actor_sizes,
)
from rollflow.policy.view import ClusterView, InstanceView
from rollflow.sim.request import SimRequest
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.rollout import ResumeMode, RolloutPool, resume
from rollflow.sim.rl.spot import SpotMarket, serving_window
from rollflow.sim.workload import build_requests


@dataclass(frozen=True)
class Span:
    """GPUs [gpu_start, gpu_start + num_gpus) doing `component` from start to end."""

    component: str  # rollout | rollout_spot | inference | training | reshard | sync
    gpu_start: int
    num_gpus: int
    start: float
    end: float
    label: str = ""


@dataclass
class StepResult:
    index: int
    start: float
    end: float
    num_samples: int
    trained_tokens: int  # prompt + response tokens of every trained sample
    generated_tokens: int  # response tokens kept
    regenerated_tokens: int  # tokens generated twice because a preempted sequence restarted
    reprefill_tokens: int  # prompt + generated tokens re-prefilled by migrated sequences
    num_migrated: int  # sequences moved between instances (release, offload, preemption)
    num_preemptions: int
    preempted_sequences: int  # sequences running or queued on preempted instances
    bubble_s: float  # actor lane idle, waiting for samples, from when it could first run
    reserved_gpu_s: float
    spot_gpu_s: float
    busy_gpu_s: dict[str, float]
    windows: dict[str, tuple[float, float]]  # first start and last end per component
    cost_usd: float
    offload_budget_s: float | None
    spans: list[Span]
    instance_windows: list[tuple[int, int, str, float, float]]  # gpu_start, gpus, kind, start, end
    minibatches: list[list[int]]  # sample ids trained by each mini-batch
    actor_sizes: list[int]  # actor GPUs of each mini-batch

    @property
    def step_time_s(self) -> float:
        return self.end - self.start


@dataclass
class Lane:
    """GPUs that run inference passes, mini-batches and reshards, one at a time."""

    name: str
    gpu_start: int
    num_gpus: int
    busy: bool = False
    released: bool = False


@dataclass(frozen=True, order=True)
class _Event:
    """The step's own events sort by (time, seq); seq is the step's counter (creation order)."""

    time: float
    seq: int
    handler: Callable[[Any], None] = field(compare=False)
    arg: Any = field(compare=False, default=None)


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
    ) -> None:
        self.config = config
        self.index = index
        self.start = start
        self.costs = costs
        self.scheduler = scheduler
        self.balancer = balancer
        self.market = market
        workload = config.workload
        self.group_size = workload.samples_per_prompt
        self.requests = build_requests(workload, config.seed + index)
        for request in self.requests:
            request.arrived_at = start
        self.num_samples = len(self.requests)
        self.minibatch_samples = self.num_samples // config.training.num_minibatches
        self.pool = RolloutPool(config.rollout_sim_config(), self._on_batch_completed, start)
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
        self._events: list[_Event] = []
        self._seq = 0
        self.end: float | None = None
        # progress
        self.group_left = [self.group_size] * workload.num_prompts
        self.num_done = 0
        self.done_at_last_minibatch = 0
        self.ready: list[int] = []
        self.inferred: list[int] = []
        self.rollout_done = False
        self.inference_done = False
        self.minibatches: list[list[int]] = []
        self.actor_sizes: list[int] = []
        self.actor_free_at: float | None = None
        self.parked: list[SimRequest] = []
        self.offloaded = False
        self.budget_spent = False
        self.spot_instance: dict[int, int] = {}
        # accounting
        self.spans: list[Span] = []
        self.regenerated = 0
        self.reprefill = 0
        self.migrated = 0
        self.preemptions = 0
        self.preempted_sequences = 0

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> StepResult:
        self._begin()
        pool = self.pool
        while self.end is None:
            pool_time = pool.events.next_time()
            own_time = self._events[0].time if self._events else math.inf
            if pool_time == own_time == math.inf:
                if self.parked:
                    raise UserError(
                        f"step {self.index} cannot finish: {len(self.parked)} sequences wait for a rollout "
                        "instance and none will come (extend the spot availability trace)"
                    )
                raise RuntimeError(
                    f"step {self.index} stalled: {self.num_done}/{self.num_samples} generated, "
                    f"{len(self.inferred)} inferred, {len(self.minibatches)} mini-batches trained"
                )
            if pool_time <= own_time:
                pool.step()
            else:
                event = heapq.heappop(self._events)
                pool.now = event.time
                event.handler(event.arg)
        return self._result()

    def _push(self, time: float, handler: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(time, self._seq, handler, arg))

    @property
    def now(self) -> float:
        return self.pool.now

    # -- step start ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        config, pool = self.config, self.pool
        tp = config.rollout.tensor_parallel
        ranges = config.gpu_ranges()
        if self.collocated:
            for gpu in range(0, config.num_gpus, tp):
                pool.add_instance(gpu, "local", borrowed=True)
        else:
            if config.scheduling.kind == "dynamic" and config.scheduling.pre_process:
                for gpu in range(0, self.actor.num_gpus - tp + 1, tp):
                    pool.add_instance(gpu, "local", borrowed=True)
            start, count = ranges["rollout"]
            for gpu in range(start, start + count, tp):
                pool.add_instance(gpu, "local")
        if self.spot:
            for slot in range(self.market.num_slots):
                self._schedule_slot(slot, self.start, at_start=True)
            self._push(self.start + self.balancer.budget_s, self._on_budget)
        pool.check_servable(self.requests)
        for request in self.requests:
            pool.submit(request)
        self._decide("step_start")

    # -- rollout progress ---------------------------------------------------------------------------
    def _on_batch_completed(self, requests: list[SimRequest], now: float) -> None:
        # Called from inside the pool's batch handling: act on it as the step's own event.
        self._push(now, self._on_samples_done, requests)

    def _on_samples_done(self, requests: list[SimRequest]) -> None:
        reward_at = self.now + self.config.reward_s
        for request in requests:
            self.num_done += 1
            group = request.id // self.group_size
            self.group_left[group] -= 1
            if self.group_left[group] == 0:
                self._push(reward_at, self._on_group_ready, group)
        if self.num_done == self.num_samples:
            self.rollout_done = True
            self._decide("rollout_done")
        elif self.spot and not self.offloaded:
            self._release_idle_local()
        self._dispatch()

    def _on_group_ready(self, group: int) -> None:
        first = group * self.group_size
        self.ready.extend(range(first, first + self.group_size))
        self._decide("group_done")
        self._dispatch()

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
            ids = [i for i in ids if self.pool.instances[i].kind != "local"]
        return ids

    def _retire(self, instance_id: int, mode: ResumeMode, preempted: bool = False) -> None:
        self.pool.retire(
            instance_id, lambda requests: self._push(self.now, self._on_stopped, (requests, mode, preempted))
        )

    def _on_stopped(self, arg: tuple[list[SimRequest], ResumeMode, bool]) -> None:
        requests, mode, preempted = arg
        if preempted:
            self.preempted_sequences += len(requests)
        if requests:
            self._resume_all(requests, mode)
        self._dispatch()

    # -- resource scheduling (RLinf) --------------------------------------------------------------------
    def _decide(self, trigger: Trigger) -> None:
        pool = self.pool
        local = [i for i in pool.live_ids() if pool.instances[i].kind == "local"]
        inference = self.inference
        snapshot = ResourceSnapshot(
            now=self.now,
            trigger=trigger,
            num_gpus=self.config.num_gpus,
            actor_gpus=max(self.actor.num_gpus, self.actor_target),
            actor_model_parallel=self.config.training.model_parallel,
            minibatch_samples=self.minibatch_samples,
            num_minibatches=self.config.training.num_minibatches,
            minibatches_done=len(self.minibatches),
            rollout_instances=tuple(
                RolloutInstanceState(
                    i,
                    pool.instances[i].gpu_start,
                    pool.instances[i].num_gpus,
                    pool.num_sequences(i),
                    pool.instances[i].borrowed,
                )
                for i in local
            ),
            unfinished_fraction=(self.num_samples - self.num_done) / self.num_samples,
            samples_per_instance_per_minibatch=(self.num_done - self.done_at_last_minibatch)
            / max(1, len(local)),
            inference_range=(inference.gpu_start, inference.num_gpus)
            if inference is not None and not inference.released
            else None,
            inference_done=self.inference_done,
        )
        plan = self.scheduler.decide(snapshot)
        if trigger == "minibatch_end":
            self.done_at_last_minibatch = self.num_done
        for instance_id in plan.release_instances:
            if instance_id in local:
                self._retire(instance_id, "migrate")
        if plan.release_inference and inference is not None:
            inference.released = True
        if plan.actor_gpus not in self.valid_actor_sizes or plan.actor_gpus < snapshot.actor_gpus:
            raise ValueError(
                f"{self.scheduler.name} asked for {plan.actor_gpus} actor GPUs; valid: {self.valid_actor_sizes}"
            )
        self.actor_target = plan.actor_gpus
        self.hold_last = plan.hold_last_minibatch

    # -- lanes: inference, training, resharding -------------------------------------------------------
    def _dispatch(self) -> None:
        if self.inference is not None and not self.inference.busy and not self.inference.released:
            self._try_inference(self.inference)
        lane = self.actor
        if lane.busy or self.end is not None or self._blocked(lane):
            return
        if self.actor_free_at is None:
            self.actor_free_at = self.now
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
        pool = self.pool
        end = lane.gpu_start + max(lane.num_gpus, self.actor_target if lane is self.actor else 0)
        return any(
            info.retired_at is None
            and info.gpu_start < end
            and lane.gpu_start < info.gpu_start + info.num_gpus
            for info in pool.instances
        )

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
            seconds = self.costs.sync_s(self.collocated, to_spot=self.spot)
            self.spans.append(Span("sync", 0, self.config.num_gpus, self.now, self.now + seconds))
            self._push(self.now + seconds, self._on_step_end)

    def _run(
        self, lane: Lane, component: str, seconds: float, on_done: Callable[[], None], label: str = ""
    ) -> None:
        lane.busy = True
        self.spans.append(Span(component, lane.gpu_start, lane.num_gpus, self.now, self.now + seconds, label))
        self._push(self.now + seconds, self._on_lane_done, (lane, on_done))

    def _on_lane_done(self, arg: tuple[Lane, Callable[[], None]]) -> None:
        lane, on_done = arg
        lane.busy = False
        on_done()
        self._dispatch()

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
            self._on_spot_ready((slot, life))
        else:
            self._push(max(ready, after), self._on_spot_ready, (slot, life))

    def _on_spot_ready(self, arg: tuple[int, tuple[float, float]]) -> None:
        slot, life = arg
        gpu_start = self.config.num_gpus + slot * self.config.rollout.tensor_parallel
        instance_id = self.pool.add_instance(gpu_start, "spot")
        self.spot_instance[slot] = instance_id
        _, stop = serving_window(life, self.market)
        self._push(stop, self._on_spot_notice, instance_id)
        self._push(life[1], self._on_spot_kill, (slot, life))
        self._submit_parked()
        if self.budget_spent or self.balancer.expired(self.now, self.start):
            self._offload()

    def _on_spot_notice(self, instance_id: int) -> None:
        self.pool.stop_accepting(instance_id)

    def _on_spot_kill(self, arg: tuple[int, tuple[float, float]]) -> None:
        slot, life = arg
        instance_id = self.spot_instance.pop(slot)
        if self.pool.instances[instance_id].retired_at is None:
            self.preemptions += 1
            self._retire(instance_id, self.config.spot.on_preemption, preempted=True)
        self._schedule_slot(slot, life[1])

    def _on_budget(self, _: object) -> None:
        self.budget_spent = True  # (now - start may round below the budget it was scheduled at)
        self._offload()

    def _offload(self) -> None:
        """Budget spent: local instances stop, their unfinished sequences go to remote ones."""
        if self.offloaded or self.rollout_done:
            return
        view = self._cluster_view()
        if not OffloadBalancer.offload_targets(view):
            return  # nowhere to send them: local rollout goes on, retried when an instance arrives
        self.offloaded = True
        self.pool.remote_only = True
        for instance in OffloadBalancer.offload_sources(view):
            self._retire(instance.instance_id, "migrate")

    def _release_idle_local(self) -> None:
        """Local instances with nothing left to generate hand their GPUs to training at once."""
        view = self._cluster_view()
        sources = OffloadBalancer.offload_sources(view)
        if sources and all(s.num_outstanding == 0 for s in sources) and OffloadBalancer.offload_targets(view):
            self.offloaded = True
            self.pool.remote_only = True
            for instance in sources:
                self._retire(instance.instance_id, "migrate")

    def _cluster_view(self) -> ClusterView:
        """Instances taking work, with their kind, as the offload policy reads them."""
        pool = self.pool
        views: list[InstanceView] = [
            pool.replicas[i].view(self.now)._replace(kind=pool.instances[i].kind)
            for i in pool.accepting_ids()
        ]
        return ClusterView(self.now, views)

    # -- step end -----------------------------------------------------------------------------------
    def _on_step_end(self, _: object) -> None:
        self.end = self.now
        self.pool.close()

    def _result(self) -> StepResult:
        from rollflow.sim.rl.accounting import summarize_step

        return summarize_step(self)
