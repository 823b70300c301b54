"""Rollout instances of one RL step, on the serving simulator.

`RolloutPool` holds a `ServingSimulator` whose replicas come and go within a step: instances are
added on a GPU range (reserved `local` ones, preemptible `spot` ones), stop taking work
(preemption notice), and are retired (released by the resource scheduler, offloaded after the
local budget, preempted). A retired instance stops at the first iteration boundary at or after
the retirement (a decode run is cut there, as an arrival would cut it) and hands back its
unfinished sequences, which the caller resumes elsewhere: from prompt plus generated tokens
(`migrate`, re-prefill, no KV transfer) or from the prompt (`restart`).

The pool adds no batching or timing of its own: it drives a `ServingSimulator` through its public
API (batches form in `rollflow.sim.batching` and take the time `rollflow.perf.predictor` gives),
or the same API on the compiled loop (`rollflow.sim.compiled_cluster`) where that covers the
cluster, with the same results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from rollflow.policy.offload import remote_only
from rollflow.policy.routing import Router, make_router
from rollflow.policy.view import ClusterView, InstanceKind, InstanceView, RouteRequest
from rollflow.sim import compiled_cluster
from rollflow.sim.build import GroupPlan
from rollflow.sim.compiled_cluster import CompiledCluster
from rollflow.sim.config import SimConfig
from rollflow.sim.events import Event
from rollflow.sim.replica import Replica
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import OnComplete, OnStopped, ServingSimulator

ResumeMode = Literal["migrate", "restart"]


@dataclass(frozen=True)
class InstancePlace:
    """Where a rollout instance runs; the simulator's replica holds its state."""

    gpu_start: int
    num_gpus: int
    borrowed: bool  # on the actor's GPUs at step start


class _OffloadAwareRouter:
    """After the offload budget, the router picks among remote instances only."""

    def __init__(self, inner: Router, pool: RolloutPool) -> None:
        self.inner = inner
        self.name = inner.name
        self.pool = pool

    @property
    def remote_only(self) -> bool:
        return self.pool.remote_only

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        view = remote_only(view) if self.pool.remote_only else view
        if not view.instances:  # the compiled core's own routing says the same
            raise ValueError("no instance to route to: none takes work")
        return self.inner.pick(request, view)


class RolloutPool:
    """The rollout instances of one step, on a `ServingSimulator` whose queue the step shares."""

    def __init__(
        self, config: SimConfig, groups: list[GroupPlan], on_complete: OnComplete, start_time: float
    ) -> None:
        self.config = config
        router = _OffloadAwareRouter(
            make_router(config.cluster.router, seed=config.seed, path=config.cluster.router_path), self
        )
        empty = [replace(groups[0], num_replicas=0)]  # the step adds its instances itself
        # instances whose count of unfinished sequences changed since `take_touched`: a sequence
        # was placed there or finished there (an instance that stops leaves `live_ids` instead)
        self.touched: set[int] = set()

        def completed(requests: list[SimRequest], now: float) -> Sequence[Event]:
            self.touched.update(request.replica_id for request in requests)
            return on_complete(requests, now)

        self.sim: ServingSimulator | CompiledCluster
        if compiled_cluster.covers(config, empty, router):
            self.sim = CompiledCluster(config, router, empty, completed, start_time)
        else:
            self.sim = ServingSimulator(
                config, router=router, groups=empty, on_complete=completed, start_time=start_time
            )
        self.places: list[InstancePlace] = []
        self.remote_only = False
        # bumped whenever an instance is added, retires or stops: what reads of membership cache on
        self.version = 0
        self._live: tuple[int, list[int]] = (-1, [])

    @property
    def now(self) -> float:
        return self.sim.now

    @property
    def replicas(self) -> list[Replica]:
        return self.sim.replicas

    def add_instance(self, gpu_start: int, kind: InstanceKind = "local", borrowed: bool = False) -> int:
        self.version += 1
        instance_id = self.sim.add_instance(kind=kind)
        layout = self.sim.groups[0].layout
        self.places.append(
            InstancePlace(gpu_start, layout.tensor_parallel * layout.pipeline_stages, borrowed)
        )
        return instance_id

    def view(self, instance_id: int) -> InstanceView:
        return self.sim.view(instance_id)

    def check_servable(self, requests: list[SimRequest]) -> None:
        self.sim.check_servable(requests)

    def accepting_ids(self) -> list[int]:
        return self.sim.accepting_ids()

    def live_ids(self) -> list[int]:
        """Instances neither retired nor retiring (the same list until `version` changes)."""
        if self._live[0] != self.version:
            replicas = self.sim.replicas
            self._live = (
                self.version,
                [r.id for r in replicas if r.retired_at is None and r.on_stopped is None],
            )
        return self._live[1]

    def num_outstanding(self) -> list[int]:
        """Per instance, its unfinished sequences, running or queued."""
        return self.sim.num_outstanding()

    def take_touched(self) -> set[int]:
        """The instances `touched` since the last call (and forget them)."""
        touched, self.touched = self.touched, set()
        return touched

    def is_up(self, instance_id: int) -> bool:
        return self.sim.replicas[instance_id].retired_at is None

    def submit(self, request: SimRequest) -> None:
        """Route one sequence (new or resumed) to an instance that takes work, now."""
        self.sim.submit(request)
        self.touched.add(request.replica_id)

    def stop_accepting(self, instance_id: int) -> None:
        self.sim.stop_accepting(instance_id)

    def retire(self, instance_id: int, on_stopped: OnStopped) -> None:
        """Stop an instance at its next iteration boundary; `on_stopped` gets its unfinished sequences."""
        self.version += 1

        def stopped(requests: list[SimRequest]) -> Sequence[Event]:
            self.version += 1
            return on_stopped(requests)

        self.sim.retire_instance(instance_id, stopped)

    def close(self) -> None:
        """The step is over: every instance still up is let go now (the rollout is finished)."""
        self.version += 1
        self.sim.close()


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
