"""Prometheus metrics of one manager (its own registry, so several managers can live in one process)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from enum import Enum
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from rollflow.runtime.manager.core.registry import EngineRecord, EngineState

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
        self.resumed_samples = Counter(
            "rollflow_resumed_samples_total", "Samples moved to another attempt", ["reason"], registry=r
        )
        self.regenerated_tokens = Counter(
            "rollflow_regenerated_tokens_total", "Generated tokens thrown away and made again", registry=r
        )
        self.engine_failures = Counter(
            "rollflow_engine_failures_total", "Engines taken out of the pool", ["reason"], registry=r
        )
        self.router_errors = Counter(
            "rollflow_router_errors_total",
            "Decisions the router failed, routed by least outstanding",
            registry=r,
        )
        self.requests_rejected = Counter(
            "rollflow_requests_rejected_total", "Requests answered with a 4xx", ["status"], registry=r
        )
        self.journal_errors = Counter(
            "rollflow_journal_errors",
            "Journal writes that failed (each try while a failure lasts)",
            registry=r,
        )
        self.journal_state = Gauge(
            "rollflow_journal_state",
            "0: the journal writes (or there is none); 1: its writes fail",
            registry=r,
        )
        self.resume_delay = Histogram(
            "rollflow_resume_delay_seconds",
            "From an attempt's end (failure detected, move decided) to the sample's first token elsewhere",
            buckets=RESUME_BUCKETS,
            registry=r,
        )
        self.stream_processes = Gauge(
            "rollflow_stream_processes",
            "Stream processes up (processes: N > 1) reading engines' streams",
            registry=r,
        )
        self.relays = Gauge(
            "rollflow_relays", "Relays connected, reading their nodes' engines' streams", registry=r
        )
        self.stream_process_restarts = Counter(
            "rollflow_stream_process_restarts_total",
            "Stream processes (processes: N > 1) that died and were started again",
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
        # labelled children looked up once: `labels()` takes a lock and builds a key on every call
        self.engines_by_state = {state: self.engines.labels(state) for state in ENGINE_STATES}
        # bumped per streamed chunk and per finished sample: plain ints, made metrics when scraped
        self.generated_tokens: defaultdict[int, int] = defaultdict(int)  # by engine id
        self.finished_samples: defaultdict[Enum, int] = defaultdict(int)  # by final state
        r.register(_HotCounters(self))

    def set_gauges(self, engines: list[EngineRecord], queued: int, readers_up: tuple[int, int]) -> None:
        """Set the state gauges from the engines, the samples queued and the stream processes and
        relays connected; called as /metrics renders them, not at every change."""
        counts = dict.fromkeys(self.engines_by_state, 0)
        for engine in engines:
            counts[engine.state] += 1
        for state, count in counts.items():
            self.engines_by_state[state].set(count)
        self.queue_depth.set(queued)
        self.running_samples.set(sum(len(engine.running) for engine in engines))
        self.stream_processes.set(readers_up[0])
        self.relays.set(readers_up[1])

    def render(self) -> bytes:
        self._before_render()
        return generate_latest(self.registry)


class _HotCounters:
    """`rollflow_generated_tokens_total` and `rollflow_finished_samples_total`, read from the plain
    ints the manager bumps on its hottest path: a prometheus_client Counter's `inc` (a lock and
    three calls each) cost about 3% of the manager's instructions per /generate."""

    def __init__(self, metrics: ManagerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> list[CounterMetricFamily]:
        tokens = CounterMetricFamily(
            "rollflow_generated_tokens", "Tokens received from engines", labels=["engine_id"]
        )
        for engine_id, count in sorted(self._metrics.generated_tokens.items()):
            tokens.add_metric([str(engine_id)], count)
        finished = CounterMetricFamily("rollflow_finished_samples", "Samples finished", labels=["state"])
        for state, count in sorted(self._metrics.finished_samples.items()):
            finished.add_metric([state.name.lower()], count)
        return [tokens, finished]
