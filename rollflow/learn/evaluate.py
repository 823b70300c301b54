"""Run routers on held-out workloads and summarise latency, SLO attainment and decision time."""

from __future__ import annotations

import time

import numpy as np

from rollflow.learn.config import LearnConfig
from rollflow.learn.stepper import sim_config
from rollflow.policy.routing import Router
from rollflow.policy.view import ClusterView, RouteRequest
from rollflow.sim.build import GroupPlan, build_groups
from rollflow.sim.metrics import request_table
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests


class TimedRouter:
    """Wraps a router and records how long each decision took (wall clock, nanoseconds).

    The simulator's snapshot is built before the router is called, so the time is the policy's
    own (features and network), as in a manager that holds its views.
    """

    def __init__(self, router: Router) -> None:
        self.router = router
        self.name = router.name
        self.decision_ns: list[int] = []

    def pick(self, request: RouteRequest, view: ClusterView) -> int:
        start = time.perf_counter_ns()
        target = self.router.pick(request, view)
        self.decision_ns.append(time.perf_counter_ns() - start)
        return target


def run_router(
    config: LearnConfig, router: Router, seeds: list[int], num_requests: int
) -> dict[str, np.ndarray]:
    """E2E and TTFT of every request over one simulation per seed (the held-out workload)."""
    workload = config.eval_workload or config.workload
    e2e, ttft = [], []
    groups: list[GroupPlan] | None = None  # operator grids: the seeds share the cluster and max_tokens
    for seed in seeds:
        sim = sim_config(config, workload, seed, num_requests)
        groups = groups or build_groups(sim)
        requests = build_requests(sim.workload, seed)[:num_requests]
        result = ServingSimulator(sim, requests, router=router, groups=groups).run()
        columns = request_table(result).columns
        if len(columns["e2e"]) < len(requests):
            raise RuntimeError(
                f"{router.name}: {len(requests) - len(columns['e2e'])} requests never finished"
            )
        e2e.append(columns["e2e"])
        ttft.append(columns["ttft"])
    return {"e2e": np.concatenate(e2e), "ttft": np.concatenate(ttft)}


def summarize_latencies(config: LearnConfig, latencies: dict[str, np.ndarray]) -> dict[str, float]:
    e2e, ttft = latencies["e2e"], latencies["ttft"]
    slo = config.reward
    met = (e2e <= slo.slo_e2e_s) & (ttft <= slo.slo_ttft_s)
    return {
        "e2e_p99": float(np.percentile(e2e, 99)),
        "e2e_mean": float(e2e.mean()),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "ttft_mean": float(ttft.mean()),
        "slo_attainment": float(met.mean()),
    }


def decision_latency_us(router: TimedRouter) -> dict[str, float]:
    ns = np.array(router.decision_ns[1:] or router.decision_ns, dtype=np.float64)  # first call warms caches
    return {
        "median_us": float(np.median(ns) / 1e3),
        "mean_us": float(ns.mean() / 1e3),
        "p99_us": float(np.percentile(ns, 99) / 1e3),
    }
