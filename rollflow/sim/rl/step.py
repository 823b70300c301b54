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
with those a preemptible instance's preemption left waiting for an instance. The next step's carried
samples reach the instances before its new ones, in no group order (`resume_order`), as live.

Off-policy (`off_policy` >= 1): the runner starts a step's rollout before the previous step has
trained (`lanes_free_at` > `start`). Until then the lanes wait, and so do the rollout instances on
the actor's GPUs: a collocated step starts on its preemptible instances alone, holding back the
samples they cannot batch yet, and adds its local instances when the previous step's sync ends.
A disaggregated step starts each rollout instance once the previous step's lanes have left its
GPUs (`gpus_free_at`: a dynamic actor that grew onto rollout GPUs keeps them until its last
mini-batch), holding back the samples the instances up so far cannot batch.

The step's events share the rollout simulator's queue (`rollflow.sim.events`), with phases after
the serving ones: at equal times every batch that ended is in before the step acts, and the
step's own events go rollout, reward, inference, training, sync, then instance moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollflow.errors import UserError
from rollflow.policy.offload import OffloadBalancer
from rollflow.policy.resources import ResourceScheduler
from rollflow.sim.build import GroupPlan, build_groups
from rollflow.sim.events import Event, Handler, Phase
from rollflow.sim.rl.accounting import summarize_step
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.instances import StepInstances
from rollflow.sim.rl.lanes import Lanes
from rollflow.sim.rl.manager import ManagerCapacity
from rollflow.sim.rl.offload import StepOffload
from rollflow.sim.rl.partial import CarriedSample, PartialRollout, resume_order, step_samples
from rollflow.sim.rl.preemptible import SpotInstances
from rollflow.sim.rl.progress import RolloutProgress
from rollflow.sim.rl.resources import StepResources
from rollflow.sim.rl.rollout import RolloutPool
from rollflow.sim.rl.spot import SpotMarket
from rollflow.sim.rl.trace import InstanceTrace, StepResult, StepTrace


class StepSimulator:
    """One RL step: its parts on the rollout pool's event queue. Each part owns its state and its
    events' handlers, and reaches the others through the step:

        progress     samples generated, delivered, rewarded, ready (`RolloutProgress`)
        lanes        the actor and inference GPUs' work and the weight sync (`Lanes`)
        instances    reserved rollout instances, held and parked samples (`StepInstances`)
        preemptible  spot instances, when there are any (`SpotInstances`)
        offload      local budget and offload, choices by `OffloadBalancer` (`StepOffload`)
        resources    the resource scheduler's decisions (`StepResources`)
        partial      samples carried in and out (`PartialRollout`)
    """

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
        self.collocated = config.placement.kind == "collocated"
        self.end: float | None = None
        requests, earlier_versions = step_samples(config, index, carried)
        self.partial = PartialRollout(self, requests, earlier_versions)
        self.progress = RolloutProgress(self, requests, manager)
        rollout_config = config.rollout_sim_config()
        groups = groups if groups is not None else build_groups(rollout_config)
        self.pool = RolloutPool(rollout_config, groups, self.progress.on_batch_completed, start)
        self.queue = self.pool.sim.events
        self._out: list[Event] = []  # events the handler running now causes
        self.preemptible = SpotInstances(self, market) if market is not None and market.num_slots else None
        self.lanes = Lanes(self, costs)
        self.instances = StepInstances(self, gpus_free_at)
        self.offload = StepOffload(self, balancer)
        self.resources = StepResources(self, scheduler)

    def run(self) -> StepResult:
        self._begin()
        self.queue.push_all(self.emitted())
        self.pool.sim.advance(stop=lambda: self.end is not None)
        if self.end is None:
            waiting = len(self.instances.parked) + len(self.instances.held)
            if waiting:
                raise UserError(
                    f"step {self.index} cannot finish: {waiting} sequences wait for a "
                    "rollout instance and none will come (extend the spot availability trace)"
                )
            raise RuntimeError(
                f"step {self.index} stalled: {self.progress.num_done}/{self.progress.num_samples} generated, "
                f"{len(self.lanes.inferred)} inferred, {len(self.lanes.minibatches)} mini-batches trained"
            )
        return summarize_step(self.trace())

    @property
    def now(self) -> float:
        return self.pool.now

    @property
    def carried_out(self) -> list[CarriedSample]:
        """What the finished step hands to the next (partial rollout)."""
        return self.partial.carried_out

    def emit(self, time: float, phase: Phase, handler: Handler, payload: Any = None) -> None:
        """An event the handler running now causes, numbered now on the one queue."""
        self._out.append(self.queue.event(time, phase, handler, payload=payload))

    def emitted(self) -> list[Event]:
        """What the running handler returns: the events it caused."""
        out, self._out = self._out, []
        return out

    def _begin(self) -> None:
        self.instances.start()
        if self.preemptible is not None:
            self.preemptible.start()
            self.offload.start()
        unfinished = [r for r in self.progress.requests if not r.completed]
        carried_first = resume_order(
            unfinished, len(self.partial.earlier_versions), self.config.seed, self.index
        )
        self.instances.submit_all(carried_first)
        self.resources.decide("step_start")
        self.progress.count_carried_finished()

    def on_sync_end(self, event: Event) -> list[Event]:
        """The weights reached rollout: the step is over."""
        self.end = self.now
        self.pool.close()
        self.partial.carry_finished()
        return self.emitted()

    def trace(self) -> StepTrace:
        """What the finished step did, for accounting."""
        assert self.end is not None, "the step has not finished"
        progress, lanes, instances, partial = self.progress, self.lanes, self.instances, self.partial
        relay, balancer, pool = progress.relay, self.offload.balancer, self.pool
        return StepTrace(
            config=self.config,
            index=self.index,
            start=self.start,
            end=self.end,
            paid_from=self.lanes_free_at,
            rollout_end=progress.rollout_end if progress.rollout_end is not None else self.end,
            sync_ends=self.sync_ends,
            requests=[r for g in sorted(progress.trained_groups) for r in progress.group(g)],
            earlier_versions=partial.earlier_versions,
            num_carried_out=len(partial.carried_out),
            num_tokens_carried_out=partial.num_tokens_carried_out,
            spans=lanes.timer.spans,
            instances=[
                InstanceTrace(
                    place.gpu_start,
                    place.num_gpus,
                    replica.kind,
                    replica.started_at,
                    replica.retired_at,
                    replica.stats.batches,
                )
                for place, replica in zip(pool.places, pool.replicas, strict=True)
            ],
            actor_free_at=lanes.actor_free_at,
            minibatches=lanes.minibatches,
            actor_sizes=lanes.actor_sizes,
            regenerated_tokens=instances.regenerated,
            reprefill_tokens=partial.reprefill + instances.reprefill,
            num_migrated=instances.migrated,
            num_preemptions=self.preemptible.preemptions if self.preemptible is not None else 0,
            preempted_sequences=instances.preempted_sequences,
            spot_market=self.preemptible.market if self.preemptible is not None else None,
            offload_budget_s=balancer.budget_s if balancer is not None else None,
            manager=relay.capacity if relay is not None else None,
            manager_delay_s=relay.delay_s if relay is not None else 0.0,
            manager_max_wait_s=relay.max_wait_s if relay is not None else 0.0,
        )
