"""The serving simulator turned inside out: it stops at every arrival and waits for a decision.

`ServingSimulator.run` calls its router at each arrival; a learning environment instead needs
control back at each arrival, so this wrapper advances the simulator up to the next arrival
(`advance`), exposes its snapshot, and submits the request to the instance it is given (`route`).
It also integrates the number of requests in the system over time between decisions, which
by Little's law sums to the total E2E latency: the dense part of the reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollflow.config import ConfigError
from rollflow.learn.config import LearnConfig
from rollflow.policy.view import ClusterView, InstanceView, RouteRequest
from rollflow.sim.build import GroupPlan
from rollflow.sim.config import SimConfig, SyntheticWorkload, TraceWorkload, WorkloadConfig
from rollflow.sim.events import NO_EVENTS, Event
from rollflow.sim.request import SimRequest
from rollflow.sim.simulator import ServingSimulator


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


class _Unrouted:
    """The stepped simulator routes only the targets it is handed; it never asks a router."""

    name = "unrouted"

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        raise RuntimeError("SteppedSimulator routes requests with route(target)")


class SteppedSimulator:
    def __init__(
        self, config: SimConfig, requests: list[SimRequest], groups: list[GroupPlan] | None = None
    ) -> None:
        if config.cluster.dispatch != "on_arrival":
            raise ConfigError(
                "config error: cluster.dispatch: router learning decides at each arrival; "
                "allowed: on_arrival (late_binding is simulated by `rollflow sim`, not learned yet)"
            )
        self.sim = ServingSimulator(config, router=_Unrouted(), groups=groups, on_complete=self._on_complete)
        self.sim.check_servable(requests)
        self.requests = sorted(requests, key=lambda r: r.arrived_at)
        self.next_index = 0
        self.in_system = 0
        self.latency_integral = 0.0  # request-seconds in the system, since the last `take_latency`
        self._accrued_to = 0.0

    @property
    def done(self) -> bool:
        return self.next_index >= len(self.requests)

    @property
    def pending(self) -> SimRequest:
        return self.requests[self.next_index]

    @property
    def now(self) -> float:
        return self.sim.now

    def advance(self) -> None:
        """Process every event before the next arrival (all of them once no arrival is left)."""
        until = self.pending.arrived_at if not self.done else math.inf
        self.sim.advance(until)
        if not self.done:
            self._accrue(until)

    def view(self) -> ClusterView:
        return self.sim.snapshot(None if self.done else self.pending)

    def route(self, target: int) -> None:
        """Send the pending request to replica `target`, then run up to the next arrival."""
        self.sim.submit(self.pending, target)
        self.in_system += 1
        self.next_index += 1
        self.advance()

    def take_latency(self) -> float:
        value, self.latency_integral = self.latency_integral, 0.0
        return value

    def _on_complete(self, requests: list[SimRequest], now: float) -> Sequence[Event]:
        self._accrue(now)
        self.in_system -= len(requests)
        return NO_EVENTS

    def _accrue(self, time: float) -> None:
        self.latency_integral += self.in_system * (time - self._accrued_to)
        self._accrued_to = time


def request_of(request: SimRequest) -> RouteRequest:
    return RouteRequest(request.id, request.prompt_tokens, request.output_tokens, request.prefix_key)


def token_load_cv(instances: list[InstanceView]) -> float:
    """Coefficient of variation of token load across instances (0 = perfectly even)."""
    loads = [inst.token_load for inst in instances]
    mean = sum(loads) / len(loads)
    if mean <= 0:
        return 0.0
    return math.sqrt(sum((x - mean) ** 2 for x in loads) / len(loads)) / mean
