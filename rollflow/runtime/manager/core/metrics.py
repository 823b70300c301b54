"""Prometheus metrics of one manager (its own registry, so several managers can live in one process)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from enum import Enum
from functools import partial
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
        # every metric lives in this manager's registry, never prometheus_client's global one
        gauge = partial(Gauge, registry=self.registry)
        counter = partial(Counter, registry=self.registry)
        self.queue_depth = gauge("rollflow_queue_depth", "Samples waiting for an engine")
        self.running_samples = gauge("rollflow_running_samples", "Samples streaming from engines")
        self.engines = gauge("rollflow_engines", "Engines in the pool by state", ["state"])
        self.engine_tokens_per_s = gauge(
            "rollflow_engine_tokens_per_s", "Recent generation throughput", ["engine_id", "kind"]
        )
        self.resumed_samples = counter(
            "rollflow_resumed_samples_total", "Samples moved to another attempt", ["reason"]
        )
        self.regenerated_tokens = counter(
            "rollflow_regenerated_tokens_total", "Generated tokens thrown away and made again"
        )
        self.engine_failures = counter(
            "rollflow_engine_failures_total", "Engines taken out of the pool", ["reason"]
        )
        self.router_errors = counter(
            "rollflow_router_errors_total", "Decisions the router failed, routed by least outstanding"
        )
        self.requests_rejected = counter(
            "rollflow_requests_rejected_total", "Requests answered with a 4xx", ["status"]
        )
        self.journal_errors = counter(
            "rollflow_journal_errors", "Journal writes that failed (each try while a failure lasts)"
        )
        self.journal_state = gauge(
            "rollflow_journal_state", "0: the journal writes (or there is none); 1: its writes fail"
        )
        self.journal_unflushed_tokens = gauge(
            "rollflow_journal_unflushed_tokens",
            "Tokens received and not yet committed to the journal: what a crash of the manager now would lose",
        )
        self.resume_delay = Histogram(
            "rollflow_resume_delay_seconds",
            "From an attempt's end (failure detected, move decided) to the sample's first token elsewhere",
            buckets=RESUME_BUCKETS,
            registry=self.registry,
        )
        self.stream_processes = gauge(
            "rollflow_stream_processes", "Stream processes up (processes: N > 1) reading engines' streams"
        )
        self.relays = gauge("rollflow_relays", "Relays connected, reading their nodes' engines' streams")
        self.stream_process_restarts = counter(
            "rollflow_stream_process_restarts_total",
            "Stream processes (processes: N > 1) that died and were started again",
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
        self.registry.register(_HotCounters(self))

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
