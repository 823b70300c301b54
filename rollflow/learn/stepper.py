"""The serving simulator turned inside out: it stops at every arrival and waits for a decision.

`ServingSimulator.run` calls its router at each arrival; a learning environment instead needs
control back at each arrival, so this subclass runs the same handlers in the same order up to
the next arrival (`advance`), exposes the snapshot, and routes the request it is given (`route`).
It also integrates the number of requests in the system over time between decisions, which
by Little's law sums to the total E2E latency: the dense part of the reward.
"""

from __future__ import annotations

import math

from rollflow.learn.config import LearnConfig
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest
from rollflow.sim.config import SimConfig, SyntheticWorkload, TraceWorkload, WorkloadConfig
from rollflow.sim.engine import ServingSimulator
from rollflow.sim.events import Phase
from rollflow.sim.request import SimRequest


def sim_config(config: LearnConfig, workload: WorkloadConfig, seed: int, num_requests: int) -> SimConfig:
    """The serving simulation of one episode or held-out run: the learning config's cluster."""
    if isinstance(workload, SyntheticWorkload):
        workload = workload.model_copy(update={"num_requests": num_requests, "duration_s": None})
    elif isinstance(workload, TraceWorkload):
        workload = workload.model_copy(update={"num_requests": num_requests})
    return SimConfig(
        seed=seed,
        cluster=config.cluster,
        scheduler=config.scheduler,
        execution=config.execution,
        workload=workload,
        output={"progress": False, "plots": False, "chrome_trace": False, "requests_csv": False},
    )


class _Chosen:
    """Router that returns the decision the stepper was handed."""

    name = "chosen"

    def __init__(self) -> None:
        self.target = 0

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        return self.target


class SteppedSimulator(ServingSimulator):
    def __init__(self, config: SimConfig, requests: list[SimRequest]) -> None:
        self._chosen = _Chosen()
        super().__init__(config, requests, router=self._chosen)
        self.next_index = 0
        self.in_system = 0
        self.latency_integral = 0.0  # request-seconds in the system, since the last `take_latency`

    @property
    def done(self) -> bool:
        return self.next_index >= len(self.requests)

    @property
    def pending(self) -> SimRequest:
        return self.requests[self.next_index]

    def advance(self) -> None:
        """Process every event before the next arrival (all of them once no arrival is left)."""
        until = self.pending.arrived_at if not self.done else math.inf
        events = self.events
        while events.next_time() < until:
            event = events.pop()
            self._accrue(event.time)
            if event.phase is Phase.STAGE_END:
                self.in_system -= self._on_stage_end(
                    event.replica_id, event.stage, event.batch, event.version
                )
            else:
                self._on_schedule(event.replica_id)
            self.num_events += 1
        if not self.done:
            self._accrue(until)

    def view(self) -> ClusterView:
        now = self.now
        return ClusterView(now, [replica.view(now) for replica in self.replicas])

    def route(self, target: int) -> None:
        """Send the pending request to replica `target`, then run up to the next arrival."""
        self._chosen.target = target
        self._on_arrival(self.pending)
        self.in_system += 1
        self.next_index += 1
        self.advance()

    def take_latency(self) -> float:
        value, self.latency_integral = self.latency_integral, 0.0
        return value

    def _accrue(self, time: float) -> None:
        self.latency_integral += self.in_system * (time - self.now)
        self.now = time


def request_of(request: SimRequest) -> RouteRequest:
    return RouteRequest(request.id, request.prompt_tokens, request.output_tokens)


def token_load_cv(instances: list[InstanceView]) -> float:
    """Coefficient of variation of token load across instances (0 = perfectly even)."""
    loads = [inst.token_load for inst in instances]
    mean = sum(loads) / len(loads)
    if mean <= 0:
        return 0.0
    return math.sqrt(sum((x - mean) ** 2 for x in loads) / len(loads)) / mean
