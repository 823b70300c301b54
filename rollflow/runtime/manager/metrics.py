"""Prometheus metrics of one manager (its own registry, so several managers can live in one process)."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rollflow.runtime.manager.registry import EngineState

ENGINE_STATES = get_args(EngineState)
RESUME_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0)


class ManagerMetrics:
    def __init__(self, before_render: Callable[[], None] = lambda: None) -> None:
        """`before_render` sets the gauges of the manager's state, read only when they are scraped
        (setting them at every dispatch cost more than the routing itself)."""
        self._before_render = before_render
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("rollflow_queue_depth", "Samples waiting for an engine", registry=r)
        self.running_samples = Gauge("rollflow_running_samples", "Samples streaming from engines", registry=r)
        self.engines = Gauge("rollflow_engines", "Engines in the pool by state", ["state"], registry=r)
        self.engine_tokens_per_s = Gauge(
            "rollflow_engine_tokens_per_s", "Recent generation throughput", ["engine_id", "kind"], registry=r
        )
        self.generated_tokens = Counter(
            "rollflow_generated_tokens_total", "Tokens received from engines", ["engine_id"], registry=r
        )
        self.resumed_samples = Counter(
            "rollflow_resumed_samples_total", "Samples moved to another attempt", ["reason"], registry=r
        )
        self.regenerated_tokens = Counter(
            "rollflow_regenerated_tokens_total", "Generated tokens thrown away and made again", registry=r
        )
        self.engine_failures = Counter(
            "rollflow_engine_failures_total", "Engines taken out of the pool", ["reason"], registry=r
        )
        self.finished_samples = Counter(
            "rollflow_finished_samples_total", "Samples finished", ["state"], registry=r
        )
        self.router_errors = Counter(
            "rollflow_router_errors_total",
            "Decisions the router failed, routed by least outstanding",
            registry=r,
        )
        self.requests_rejected = Counter(
            "rollflow_requests_rejected_total", "Requests answered with a 4xx", ["status"], registry=r
        )
        self.resume_delay = Histogram(
            "rollflow_resume_delay_seconds",
            "From an attempt's end (failure detected, move decided) to the sample's first token elsewhere",
            buckets=RESUME_BUCKETS,
            registry=r,
        )
        for reason in (
            "engine_failed",
            "engine_hung",
            "engine_aborted",
            "engine_removed",
            "engine_released",
            "offloaded",
        ):
            self.resumed_samples.labels(reason)
        self.regenerated_tokens.inc(0)
        # labelled children looked up once: `labels()` takes a lock and builds a key on every call,
        # and these are touched per dispatch or per streamed chunk
        self.engines_by_state = {state: self.engines.labels(state) for state in ENGINE_STATES}
        self._generated_by_engine: dict[int, Counter] = {}
        self._finished_by_state: dict[Enum, Counter] = {}

    def generated_tokens_of(self, engine_id: int) -> Counter:
        """The `rollflow_generated_tokens_total` child of one engine."""
        child = self._generated_by_engine.get(engine_id)
        if child is None:
            child = self._generated_by_engine[engine_id] = self.generated_tokens.labels(str(engine_id))
        return child

    def finished_of(self, state: Enum) -> Counter:
        """The `rollflow_finished_samples_total` child of a sample's final state (one per sample)."""
        child = self._finished_by_state.get(state)
        if child is None:
            child = self._finished_by_state[state] = self.finished_samples.labels(state.name.lower())
        return child

    def render(self) -> bytes:
        self._before_render()
        return generate_latest(self.registry)
