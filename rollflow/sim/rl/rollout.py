"""Rollout instances of one RL step, driven by the serving simulator's own event handlers.

`RolloutPool` is a `ServingSimulator` whose replicas come and go within a step: instances are
added on a GPU range (reserved `local` ones, preemptible `spot` ones), stop taking work
(preemption notice), and are retired (released by the resource scheduler, offloaded after the
local budget, preempted). A retired instance stops at the first iteration boundary at or after
the retirement (a decode run is cut there, as an arrival would cut it) and hands back its
unfinished sequences, which the caller resumes elsewhere: from prompt plus generated tokens
(`migrate`, re-prefill, no KV transfer) or from the prompt (`restart`).

The pool adds no batching or timing of its own: batches form in `rollflow.sim.batching`, take
the time `rollflow.perf.predictor` gives, and advance through `ServingSimulator`'s handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rollflow.perf.specs import ParallelLayout
from rollflow.policy.offload import remote_only
from rollflow.policy.routing import Router
from rollflow.policy.view import ClusterView, InstanceKind, InstanceView, RouteRequest, SnapshotInstances
from rollflow.sim.config import SimConfig
from rollflow.sim.engine import ServingSimulator, build_scheduler, check_servable, resolve_model
from rollflow.sim.events import Phase
from rollflow.sim.replica import Replica
from rollflow.sim.request import Batch, SimRequest

ResumeMode = Literal["migrate", "restart"]


@dataclass
class InstanceInfo:
    """Where a rollout instance runs and when; the replica itself holds its batches."""

    gpu_start: int
    num_gpus: int
    kind: InstanceKind
    borrowed: bool  # on the actor's GPUs at step start
    started_at: float
    retired_at: float | None = None
    accepting: bool = True
    retiring: Callable[[list[SimRequest]], None] | None = None  # receives its sequences once stopped


class TrackedReplica(Replica):
    """A replica that reports the requests each finished batch completed."""

    on_complete: Callable[[list[SimRequest], float], None]

    def finish_batch(self, batch: Batch, now: float) -> list[SimRequest]:
        completed = super().finish_batch(batch, now)
        if completed:
            self.on_complete(completed, now)
        return completed


class _RoutableInstances:
    """Restricts a router to instances that take work; after offload, to remote ones only."""

    def __init__(self, inner: Router, pool: RolloutPool) -> None:
        self.inner = inner
        self.name = inner.name
        self.pool = pool

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        pool = self.pool
        infos, instances = pool.instances, view.instances
        ids = pool.accepting_ids()

        def build(j: int) -> InstanceView:
            kind = infos[ids[j]].kind
            instance = instances[ids[j]]
            return instance if kind == "local" else instance._replace(kind=kind)

        sub = ClusterView(view.now, SnapshotInstances(len(ids), build))
        if pool.remote_only:
            sub = remote_only(sub)
        return self.inner.pick(request, sub)


class RolloutPool(ServingSimulator):
    def __init__(
        self,
        config: SimConfig,
        on_complete: Callable[[list[SimRequest], float], None],
        start_time: float,
    ) -> None:
        super().__init__(config, [])
        self.router = _RoutableInstances(self.router, self)
        template = self.replicas[0]
        self._predictor = template.predictor
        self._model = resolve_model(config)
        self._layout_args = (config.cluster.tensor_parallel, config.cluster.pipeline_stages)
        self.replicas = []
        self.instances: list[InstanceInfo] = []
        self.on_complete = on_complete
        self.remote_only = False
        self.now = start_time
        self._accepting: list[int] | None = None

    # -- instances ----------------------------------------------------------------------------
    def add_instance(self, gpu_start: int, kind: InstanceKind = "local", borrowed: bool = False) -> int:
        scheduler = build_scheduler(self.config, self._model, ParallelLayout(*self._layout_args))
        replica = TrackedReplica(
            len(self.replicas), scheduler, self._predictor, self.config.simulator.fast_forward
        )
        replica.on_complete = self.on_complete
        self.replicas.append(replica)
        gpus = self._layout_args[0] * self._layout_args[1]
        self.instances.append(InstanceInfo(gpu_start, gpus, kind, borrowed, self.now))
        self._accepting = None
        return replica.id

    def check_servable(self, requests: list[SimRequest]) -> None:
        check_servable(requests, self.replicas[0].scheduler, self.config)

    def accepting_ids(self) -> list[int]:
        """Instances that take new work (cached: routing asks once per sequence)."""
        if self._accepting is None:
            self._accepting = [
                i for i, info in enumerate(self.instances) if info.accepting and info.retired_at is None
            ]
        return self._accepting

    def live_ids(self) -> list[int]:
        return [
            i for i, info in enumerate(self.instances) if info.retired_at is None and info.retiring is None
        ]

    def num_sequences(self, instance_id: int) -> int:
        scheduler = self.replicas[instance_id].scheduler
        return scheduler.num_resident + len(scheduler.waiting)

    def submit(self, request: SimRequest) -> None:
        """Route one sequence (new or resumed) to an instance that takes work, at `self.now`."""
        self._on_arrival(request)

    def stop_accepting(self, instance_id: int) -> None:
        self.instances[instance_id].accepting = False
        self._accepting = None

    def retire(self, instance_id: int, on_stopped: Callable[[list[SimRequest]], None]) -> None:
        """Stop an instance at its next iteration boundary; `on_stopped` gets its unfinished sequences."""
        info = self.instances[instance_id]
        info.accepting = False
        info.retiring = on_stopped
        self._accepting = None
        replica = self.replicas[instance_id]
        run = replica.run_in_flight
        if run is not None and replica.cut_run(run, self.now):
            self.events.push(run.end_time, Phase.STAGE_END, instance_id, 0, run, run.version)
        if replica.num_running_batches == 0:
            self._stop(instance_id)

    def close(self) -> None:
        """The step is over: every instance still up is let go now (the rollout is finished)."""
        for info in self.instances:
            if info.retired_at is None:
                info.accepting = False
                info.retired_at = self.now
        self._accepting = None

    # -- event loop ---------------------------------------------------------------------------
    def step(self) -> None:
        """Apply the next serving event (a batch end or a scheduling decision)."""
        event = self.events.pop()
        self.now = event.time
        self.num_events += 1
        if event.phase is Phase.STAGE_END:
            self._on_stage_end(event.replica_id, event.stage, event.batch, event.version)
        else:
            self._on_schedule(event.replica_id)

    def _on_schedule(self, replica_id: int) -> None:
        info = self.instances[replica_id]
        if info.retired_at is not None:
            return
        if info.retiring is not None:
            self._stop(replica_id)
            return
        super()._on_schedule(replica_id)

    def _stop(self, instance_id: int) -> None:
        info = self.instances[instance_id]
        scheduler = self.replicas[instance_id].scheduler
        unfinished = [*scheduler.waiting, *scheduler.running]
        if scheduler.cohort is not None:
            unfinished.extend(scheduler.cohort.release_all())
        scheduler.waiting.clear()
        scheduler.running.clear()
        info.retired_at = self.now
        callback, info.retiring = info.retiring, None
        callback(sorted(unfinished, key=lambda r: r.id))


def resume(request: SimRequest, mode: ResumeMode) -> tuple[int, int]:
    """Reset a stopped sequence to run again elsewhere; return (tokens to re-prefill, tokens lost).

    Known tokens are the prompt plus every token already sampled. `migrate` re-prefills them
    all and generates only the rest; `restart` drops the generated ones (regenerated later).
    """
    total = request.num_prefill + request.num_decode
    known = request.processed if request.prefill_done else request.num_prefill
    known = max(known, request.prompt_tokens)
    generated = known - request.prompt_tokens
    if mode == "restart":
        known = request.prompt_tokens
    request.num_prefill = known
    request.num_decode = total - known
    request.processed = 0
    request.prefill_done = False
    request.blocks = 0
    return known, generated if mode == "restart" else 0
