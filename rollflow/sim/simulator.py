"""The serving-cluster simulator: arrivals are routed by a policy, replicas batch and run them.

    arrival     -> snapshot the cluster, router picks a replica, enqueue (cut a decode run)
    stage end   -> pass the batch to the next stage, or apply it and free finished requests
    schedule    -> the replica forms its next batches and starts them

With `cluster.dispatch: late_binding` an arrival joins one cluster queue instead, and queued
requests are routed, in arrival order, whenever a replica holds fewer than `cluster.capacity`
requests (after arrivals, completions, added instances): the rollout manager's dispatch.

Other simulators compose it through its public API rather than its handlers: `submit` routes
a request now, `advance` runs the loop until a time or a condition, `add_instance`,
`stop_accepting` and `retire_instance` change the cluster (a retired instance hands back its
unfinished requests through its scheduler), `snapshot` is the frozen view policies read. Their
own events go on the same queue (`events`), with their own phases.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush

from rollflow.policy.routing import Router, make_router
from rollflow.policy.view import ClusterView, InstanceKind, InstanceView, RouteRequest, id_only_view
from rollflow.sim import compiled
from rollflow.sim.build import GroupPlan, build_groups
from rollflow.sim.config import SimConfig
from rollflow.sim.events import NO_EVENTS, Event, EventQueue, Phase
from rollflow.sim.membership import ReplicaMembership
from rollflow.sim.replica import Replica
from rollflow.sim.request import IterationBatch, SimRequest

_new_tuple = tuple.__new__  # builds a NamedTuple from a tuple of every field: twice as fast as calling it

OnComplete = Callable[[list[SimRequest], float], Sequence[Event]]
OnStopped = Callable[[list[SimRequest]], Sequence[Event]]


@dataclass
class SimResult:
    requests: list[SimRequest]
    replicas: list[Replica]
    simulated_time_s: float
    num_events: int
    operator_source: str
    peak_flops_per_gpu: float  # of the first replica's GPU
    peak_flops_by_replica: list[float]
    compiled_loop: bool = False  # the C loop ran it (rollflow.sim.compiled), not the Python one


class ServingSimulator(ReplicaMembership):
    """Deterministic for a given config and request list.

    `groups` are prebuilt replica groups (`build_groups`), to share operator grids between
    simulations of one config; `on_complete(requests, now)` hears of every finished request and
    returns the events that causes.
    """

    def __init__(
        self,
        config: SimConfig,
        requests: Sequence[SimRequest] = (),
        router: Router | None = None,
        groups: list[GroupPlan] | None = None,
        on_complete: OnComplete | None = None,
        start_time: float = 0.0,
    ) -> None:
        self.config = config
        self.groups = groups if groups is not None else build_groups(config)
        self.replicas: list[Replica] = []
        self.peak_flops_by_replica: list[float] = []
        self.events = EventQueue()
        self.now = start_time
        self.num_events = 0
        self.on_complete = on_complete
        self.late_binding = config.cluster.dispatch == "late_binding"
        self.capacity = config.cluster.capacity
        self.cluster_queue: deque[SimRequest] = deque()  # late binding: arrived, not yet routed
        self._overhead_s = config.execution.request_overhead_ms * 1e-3
        for group in self.groups:
            for _ in range(group.num_replicas):
                self.add_instance(group)
        self.operator_source = self.groups[-1].operator_source
        cluster = config.cluster
        self.router = router or make_router(
            cluster.router,
            seed=config.seed,
            path=cluster.router_path,
            thresholds=cluster.affinity.model_dump(),
        )
        self._reads_cache = getattr(self.router, "reads_cache", False)
        self._reads_load = getattr(self.router, "reads_load", True)
        self.requests = sorted(requests, key=lambda r: r.arrived_at)
        self.check_servable(self.requests)
        self._accepting: list[int] | None = None
        self._id_only_views: tuple[list[int] | None, tuple[InstanceView, ...]] = (None, ())
        if self.requests:  # arrivals are events, fed one at a time (each handler adds the next)
            self.events.push(self.events.event(self._reaches_replica(0), Phase.ARRIVAL, self._on_arrival))

    # -- the loop ---------------------------------------------------------------------------
    def run(self, on_progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate every arrival to the end (or to `simulator.time_limit_s`): a simulator's last call.

        Where the compiled loop covers the cluster (see `compiled`), it runs instead of `_apply`,
        with the same results."""
        limit = self.config.simulator.time_limit_s
        until = math.nextafter(limit, math.inf) if limit else math.inf  # events at the limit still run
        ran_compiled = compiled.covers(self)
        if ran_compiled:
            compiled.run(self, until, on_progress)
        elif on_progress is None:
            self._apply(until)
        else:
            self._run_with_progress(until, on_progress)
        peaks = self.peak_flops_by_replica
        return SimResult(
            self.requests,
            self.replicas,
            self.now,
            self.num_events,
            self.operator_source,
            peaks[0],
            peaks,
            ran_compiled,
        )

    def advance(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Apply events in order while they are earlier than `until` and `stop()` is false; once
        only events at or after a finite `until` are left, the clock reads `until`.

        An event at `until` itself is left for later: a request submitted at `until` sorts
        before it (arrivals come first at equal times).
        """
        if not self._apply(until, stop) and until != math.inf:
            self.now = max(self.now, until)

    def _apply(self, until: float, stop: Callable[[], bool] | None = None) -> bool:
        """The loop; True if `stop()` ended it."""
        heap = self.events.heap
        if stop is None:  # the common case, without the per-event check
            while heap and heap[0].time < until:
                event = heappop(heap)
                self.now = event.time
                self.num_events += 1
                for new in event.handler(event):
                    heappush(heap, new)
            return False
        while heap and heap[0].time < until:
            event = heappop(heap)
            self.now = event.time
            self.num_events += 1
            for new in event.handler(event):
                heappush(heap, new)
            if stop():
                return True
        return False

    def _run_with_progress(self, until: float, on_progress: Callable[[int], None]) -> None:
        every = max(1, len(self.requests) // 200)
        completed = 0
        outer = self.on_complete

        def count(requests: list[SimRequest], now: float) -> Sequence[Event]:
            nonlocal completed
            completed += len(requests)
            if completed % every < len(requests):
                on_progress(completed)
            return outer(requests, now) if outer is not None else NO_EVENTS

        self.on_complete = count
        try:
            self._apply(until)
        finally:
            self.on_complete = outer
        on_progress(sum(1 for r in self.requests if r.completed_at is not None))

    # -- public API ---------------------------------------------------------------------------
    def submit(self, request: SimRequest, target: int | None = None) -> None:
        """Route `request` now: to `target`, or the router's pick (with late binding: queue it and
        dispatch what has a free slot).

        The clock moves to the request's arrival if that is later (a caller stepping arrivals
        itself); a request that arrived earlier (resumed elsewhere) is routed at the current time.
        """
        self.now = max(self.now, request.arrived_at)
        self.events.push_all(self._route(request, target))

    def snapshot(self, request: SimRequest | None = None) -> ClusterView:
        """The instances taking work, as a policy sees them now; frozen (later events change nothing).

        With `request`, each instance's `cached_tokens` is how much of its prompt the instance's
        prefix cache holds now."""
        now, replicas = self.now, self.replicas
        return ClusterView(now, tuple([replicas[i].view(now, request) for i in self.accepting_ids()]))

    def view(self, instance_id: int) -> InstanceView:
        """One instance as a policy sees it now (taking work or not)."""
        return self.replicas[instance_id].view(self.now)

    @property
    def decode_tokens(self) -> int:
        """Tokens the decode iterations of every batch ended so far sampled, on every replica."""
        return sum(r.stats.decode_tokens for r in self.replicas)

    def num_outstanding(self) -> list[int]:
        """Per instance, the requests on it, running or queued (as its view counts them)."""
        return [r.scheduler.num_resident + len(r.scheduler.waiting) for r in self.replicas]

    def add_instance(self, group: GroupPlan | None = None, kind: InstanceKind = "local") -> int:
        """A new replica of `group` (the first group by default), empty, taking work from now."""
        group = group or self.groups[0]
        replica = self._add_replica(group, kind)
        self.peak_flops_by_replica.append(group.peak_flops)
        if self.cluster_queue:
            events: list[Event] = []
            self._dispatch_queued(events)
            self.events.push_all(events)
        return replica.id

    def _id_views(self) -> tuple[InstanceView, ...]:
        """The accepting instances as views that carry only their ids and kinds, loads left at zero
        (cached with the ids)."""
        ids = self.accepting_ids()
        if self._id_only_views[0] is not ids:  # accepting_ids() made a new list: the cluster changed
            replicas = self.replicas
            views = tuple([id_only_view(i, replicas[i].kind) for i in ids])
            self._id_only_views = (ids, views)
        return self._id_only_views[1]

    def retire_instance(self, instance_id: int, on_stopped: OnStopped) -> None:
        """Stop an instance at its next iteration boundary (a decode run is cut there, as an arrival
        would cut it); its scheduler then releases its unfinished requests, with their KV blocks,
        to `on_stopped`, whose events join the queue."""
        replica = self.replicas[instance_id]
        self.stop_accepting(instance_id)
        replica.on_stopped = on_stopped
        events: list[Event] = []
        self._cut_run(replica, events)
        if replica.num_running_batches == 0:
            self._stop(replica, events)
        self.events.push_all(events)

    # -- handlers ---------------------------------------------------------------------------
    def _reaches_replica(self, index: int) -> float:
        """When the workload's request `index` reaches the cluster: its arrival plus the request
        overhead (its latencies still count from its arrival)."""
        return self.requests[index].arrived_at + self._overhead_s

    def _on_arrival(self, event: Event) -> list[Event]:
        index = event.target
        requests = self.requests
        events = self._route(requests[index], None)
        index += 1
        if index < len(requests):
            # Built inline (the hot path); the same as self.events.event(...).
            reaches, seq = self._reaches_replica(index), self.events.next_seq()
            events.append(_new_tuple(Event, (reaches, _ARRIVAL, seq, self._on_arrival, index, 0, None, 0)))
        return events

    def _on_stage_end(self, event: Event) -> Sequence[Event]:
        batch: IterationBatch = event.payload
        if event.version != batch.version:
            return NO_EVENTS  # superseded: the run was cut and has a newer end event
        replica = self.replicas[event.target]
        stage = event.stage
        replica.stage_busy[stage] = False
        events: list[Event] = []
        if stage + 1 < replica.num_stages:
            replica.stage_queues[stage + 1].append(batch)
            self._start_stage(replica, stage + 1, events)
        else:
            completed = replica.finish_batch(batch, self.now)
            if completed:
                if self.on_complete is not None:
                    events.extend(self.on_complete(completed, self.now))
                if self.cluster_queue:
                    self._dispatch_queued(events)  # before the replica schedules: slots just freed
            if replica.num_stages == 1:
                # Every arrival and stage end at this time is already in (they sort earlier), and a
                # one-stage replica has no other batch in flight: schedule now, without an event
                # (which starts the stage, if it formed a batch).
                self._schedule(replica, events)
                return events
            self._request_schedule(replica, events)
        self._start_stage(replica, stage, events)
        return events

    def _on_schedule(self, event: Event) -> list[Event]:
        events: list[Event] = []
        self._schedule(self.replicas[event.target], events)
        return events

    # -- helpers ----------------------------------------------------------------------------
    def _route(self, request: SimRequest, target: int | None) -> list[Event]:
        events: list[Event] = []
        if target is not None:
            self._place(request, target, events)
        elif self.late_binding:
            self.cluster_queue.append(request)
            self._dispatch_queued(events)
        else:
            route = _new_tuple(
                RouteRequest, (request.id, request.prompt_tokens, request.output_tokens, request.prefix_key)
            )
            if self._reads_load:
                view = self.snapshot(request if self._reads_cache else None)
            else:  # the router reads ids only (see Router)
                view = ClusterView(self.now, self._id_views())
            self._place(request, self.router.pick(route, view), events)
        return events

    def _place(self, request: SimRequest, target: int, events: list[Event]) -> None:
        replica = self.replicas[target]
        request.replica_id = target
        replica.scheduler.add_request(request)
        self._cut_run(replica, events)
        self._request_schedule(replica, events)

    def _dispatch_queued(self, events: list[Event]) -> None:
        """Late binding: route queued requests, in order, while some replica has a free slot."""
        queue, now, capacity = self.cluster_queue, self.now, self.capacity
        while queue:
            free = [
                view
                for view in (
                    self.replicas[i].view(now, queue[0] if self._reads_cache else None)
                    for i in self.accepting_ids()
                )
                if view.num_running + view.num_queued < capacity
            ]
            if not free:
                return
            request = queue.popleft()
            route = RouteRequest(request.id, request.prompt_tokens, request.output_tokens, request.prefix_key)
            self._place(request, self.router.pick(route, ClusterView(now, tuple(free))), events)

    def _cut_run(self, replica: Replica, events: list[Event]) -> None:
        run = replica.run_in_flight
        if run is not None and replica.cut_run(run, self.now):
            events.append(
                self.events.event(
                    run.end_time, Phase.STAGE_END, self._on_stage_end, replica.id, 0, run, run.version
                )
            )

    def _schedule(self, replica: Replica, events: list[Event]) -> None:
        if replica.on_stopped is not None:
            self._stop(replica, events)  # retiring: stop at this iteration boundary
            return
        if replica.retired_at is not None:
            return
        replica.schedule_pending = False
        for batch in replica.form_batches(self.now):
            replica.stage_queues[0].append(batch)
        self._start_stage(replica, 0, events)

    def _stop(self, replica: Replica, events: list[Event]) -> None:
        unfinished = replica.scheduler.release_all()
        replica.retired_at = self.now
        on_stopped, replica.on_stopped = replica.on_stopped, None
        events.extend(on_stopped(sorted(unfinished, key=lambda r: r.id)))
        if self.cluster_queue:
            self._dispatch_queued(events)

    def _request_schedule(self, replica: Replica, events: list[Event]) -> None:
        if not replica.schedule_pending and replica.num_running_batches < replica.num_stages:
            replica.schedule_pending = True
            seq = self.events.next_seq()  # built inline, the same as self.events.event(...)
            events.append(
                _new_tuple(Event, (self.now, _SCHEDULE, seq, self._on_schedule, replica.id, 0, None, 0))
            )

    def _start_stage(self, replica: Replica, stage: int, events: list[Event]) -> None:
        queue = replica.stage_queues[stage]
        if replica.stage_busy[stage] or not queue:
            return
        batch = queue.popleft()
        replica.stage_busy[stage] = True
        start = self.now + batch.wakeup_s if stage == 0 else self.now  # an idle replica wakes first
        if stage == replica.num_stages - 1:
            end = start + batch.last_stage_s
            batch.end_time = end
            if batch.num_iterations > 1:
                replica.run_in_flight = batch
        else:
            end = start + batch.stage_seconds[0]
        # Built inline (the hot path); the same as self.events.event(...).
        seq = self.events.next_seq()
        events.append(
            _new_tuple(
                Event, (end, _STAGE_END, seq, self._on_stage_end, replica.id, stage, batch, batch.version)
            )
        )


_ARRIVAL, _STAGE_END, _SCHEDULE = Phase.ARRIVAL, Phase.STAGE_END, Phase.SCHEDULE
