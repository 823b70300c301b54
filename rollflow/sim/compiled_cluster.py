"""`ServingSimulator`'s public API on the compiled loop, for simulators that act between its events.

The RL step's rollout composes a serving cluster whose instances come and go while it runs and
whose completions it hears of one batch at a time (`rollflow.sim.rl.rollout`). `CompiledCluster`
gives it the calls it makes of `ServingSimulator` (submit, advance, add_instance, stop_accepting,
retire_instance, close, view) over `rollflow.sim._loop.Cluster`, which keeps the replicas,
batches and serving events in C and takes the decisions the Python loop takes, in the same order.

Two queues, one order: the serving events live in C, the caller's own events (phases after the
serving ones, `rollflow.sim.events`) in `events`. `advance` lets C apply every serving event up
to the caller's next event (at equal times the serving ones sort first), then applies that one.
Each queue numbers its own events; as the two never share a (time, phase), the order is the
Python loop's. A hook (`on_complete`, a retiring instance's `on_stopped`) is called when C
reports it, before anything later happens, and must only return events (as every handler does).

The replicas are `Replica` objects as in the Python simulator: their membership (kind, accepting,
when started and retired) and their stats' batch rows are kept on them; their schedulers' state
lives in C, so `view` reads it there and `close` writes it back. Covered: what the closed
compiled loop covers (`rollflow.sim.compiled`), routing on submission by an argmin router
(decided in C) or by a router that reads ids only. Anything else runs `ServingSimulator`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush

from rollflow.native import extension
from rollflow.policy.routing import (
    LeastOutstandingRequestsRouter,
    LeastOutstandingRouter,
    LeastTokensRouter,
    Router,
)
from rollflow.policy.view import ClusterView, InstanceKind, InstanceView, RouteRequest, id_only_view
from rollflow.sim import compiled
from rollflow.sim.build import GroupPlan
from rollflow.sim.config import SimConfig
from rollflow.sim.events import EventQueue
from rollflow.sim.membership import ReplicaMembership
from rollflow.sim.replica import Replica
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import OnComplete, OnStopped

# The argmin routers whose pick the C cluster takes itself, by the load code of _loop.c.
_LOADS = {LeastOutstandingRequestsRouter: 1, LeastOutstandingRouter: 2, LeastTokensRouter: 3}
_COMPLETED = 0  # a report's kind (the other: a retiring instance stopped)


def _inner(router: Router) -> Router:
    """The router that picks, under a wrapper that only narrows the view (`inner`)."""
    return getattr(router, "inner", router)


def covers(config: SimConfig, groups: list[GroupPlan], router: Router) -> bool:
    """Whether `CompiledCluster` simulates this cluster exactly (and is built): one group, whose
    replicas the compiled loop covers, routed on submission by a router it can serve."""
    loop = extension("rollflow.sim._loop")
    if loop is None or not hasattr(loop, "Cluster") or len(groups) != 1:
        return False
    if config.cluster.dispatch == "late_binding":
        return False
    inner = _inner(router)
    if type(inner) not in _LOADS and getattr(inner, "reads_load", True):
        return False
    group = groups[0]
    scheduler = group.new_scheduler()
    return (
        group.predictor.num_stages == 1
        and group.predictor.compiled
        and type(scheduler) in compiled.SCHEDULERS
        and scheduler.cohort is not None
        and scheduler.prefix_cache is None
    )


class CompiledCluster(ReplicaMembership):
    """A serving cluster on the compiled loop; starts empty (instances are added by the caller)."""

    def __init__(
        self,
        config: SimConfig,
        router: Router,
        groups: list[GroupPlan],
        on_complete: OnComplete | None = None,
        start_time: float = 0.0,
    ) -> None:
        """`router` may narrow every view to the remote instances while its `remote_only` is true
        (the RL step's offload, `rollflow.sim.rl.rollout`)."""
        loop = extension("rollflow.sim._loop")
        assert loop is not None
        self.config = config
        self.groups = groups
        self.router = router
        self.on_complete = on_complete
        self.core = loop.Cluster(InstanceView, start_time)
        self.events = EventQueue()  # the caller's events; the serving ones are in `core`
        self.replicas: list[Replica] = []
        self._load = _LOADS.get(type(_inner(router)), 0)  # 0: the router picks, from ids
        self._num_own_events = 0
        self._accepting: list[int] | None = None

    @property
    def now(self) -> float:
        return self.core.now

    @property
    def decode_tokens(self) -> int:
        """As `ServingSimulator.decode_tokens`, counted in C."""
        return self.core.decode_tokens

    @property
    def num_events(self) -> int:
        return self.core.num_events + self._num_own_events

    # -- the loop -----------------------------------------------------------------------------
    def advance(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """As `ServingSimulator.advance`: events earlier than `until`, while `stop()` is false."""
        if not self._apply(until, stop) and until != math.inf:
            self.core.now = max(self.now, until)

    def _apply(self, until: float, stop: Callable[[], bool] | None) -> bool:
        heap, core = self.events.heap, self.core
        below = math.nextafter(until, -math.inf)  # serving events at `until` are left for later
        while True:
            reports = core.run(min(heap[0].time, below) if heap else below)
            if reports:
                self._hear(reports)
                if stop is not None and stop():
                    return True
                continue
            if not heap or heap[0].time >= until:
                return False
            event = heappop(heap)
            core.now = event.time
            self._num_own_events += 1
            for new in event.handler(event):
                heappush(heap, new)
            if stop is not None and stop():
                return True

    def _hear(self, reports: list[tuple[int, int, float, list[SimRequest]]]) -> None:
        """Call the hooks C reported, in its order: finished requests, instances that stopped."""
        for kind, replica_id, time, requests in reports:
            if kind == _COMPLETED:
                if self.on_complete is not None:
                    self.events.push_all(self.on_complete(requests, time))
                continue
            replica = self.replicas[replica_id]
            replica.retired_at = time
            on_stopped, replica.on_stopped = replica.on_stopped, None
            assert on_stopped is not None
            self.events.push_all(on_stopped(requests))

    # -- public API (ServingSimulator's) ----------------------------------------------------------
    def submit(self, request: SimRequest, target: int | None = None) -> None:
        """Route `request` now (to `target`, or the router's pick) and place it there."""
        core = self.core
        core.now = max(self.now, request.arrived_at)
        remote_only = bool(getattr(self.router, "remote_only", False))
        if target is None and not self._load:
            route = RouteRequest(request.id, request.prompt_tokens, request.output_tokens, request.prefix_key)
            ids = self.accepting_ids()
            view = ClusterView(self.now, tuple([id_only_view(i, self.replicas[i].kind) for i in ids]))
            target = self.router.pick(route, view)
        request.replica_id = core.submit(request, -1 if target is None else target, self._load, remote_only)

    def add_instance(self, group: GroupPlan | None = None, kind: InstanceKind = "local") -> int:
        replica = self._add_replica(group or self.groups[0], kind)
        return self.core.add_replica(
            compiled.replica_spec(replica), replica.stats.batches, replica.stats.kv_samples
        )

    def view(self, instance_id: int) -> InstanceView:
        """The instance as a policy sees it now."""
        return self.core.view(instance_id)

    def num_outstanding(self) -> list[int]:
        """Per instance, the requests on it, running or queued (as its view counts them)."""
        return self.core.num_outstanding()

    def stop_accepting(self, instance_id: int) -> None:
        super().stop_accepting(instance_id)
        self.core.stop_accepting(instance_id)

    def retire_instance(self, instance_id: int, on_stopped: OnStopped) -> None:
        """As `ServingSimulator.retire_instance`: now if the instance runs no batch, else when C
        reports that it stopped."""
        replica = self.replicas[instance_id]
        self.stop_accepting(instance_id)
        replica.on_stopped = on_stopped
        unfinished = self.core.retire(instance_id)
        if unfinished is not None:
            self._hear([(1, instance_id, self.now, unfinished)])

    def close(self) -> None:
        """Every instance still up is let go now; every request and replica is written back."""
        super().close()
        self.core.write_back()
        for replica in self.replicas:
            compiled.write_back(replica, self.core.totals(replica.id))
