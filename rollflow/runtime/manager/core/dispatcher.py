"""The queue of samples waiting for an engine, and the routing of each: the eligible engines'
snapshot (a `ClusterView`, as the simulator builds it), the router's pick, and the attempt started.

Eligible engines for a sample: healthy, below capacity, on the sample's weight version (unless it
allows off-policy tokens), and after its batch's local budget expired, remote or spot only (when any
exist). A session's turns go through the session router; a router that fails or picks outside the
view is overruled by least-outstanding, because one bad policy must not stop every rollout.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from rollflow.policy.offload import OffloadBalancer
from rollflow.policy.routing import Router, make_router
from rollflow.policy.view import ClusterView, RouteRequest
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.core.batches import BatchBook
from rollflow.runtime.manager.core.metrics import ManagerMetrics
from rollflow.runtime.manager.core.prefixes import session_key
from rollflow.runtime.manager.core.registry import EngineRecord, Registry
from rollflow.runtime.manager.core.samples import Sample, SampleState
from rollflow.runtime.manager.core.view import route_inputs

log = logging.getLogger("rollflow.manager")


class Dispatcher:
    def __init__(
        self,
        config: ManagerConfig,
        registry: Registry,
        batches: BatchBook,
        metrics: ManagerMetrics,
        start_attempt: Callable[[Sample, EngineRecord], None],
        router: Router | None = None,
    ) -> None:
        """`start_attempt(sample, engine)` runs the sample on the engine the router picked."""
        self.router = router or make_router(config.router, seed=config.seed, path=config.router_path)
        self._fallback_router = make_router("least_outstanding")
        self.reads_cache = getattr(self.router, "reads_cache", False)  # fill the view's cached_tokens
        self._reads_load = getattr(self.router, "reads_load", True)  # False: ids and order only
        self.session_router = make_router("session", seed=config.seed)  # routes sessions' turns
        self._registry = registry
        self._batches = batches
        self._metrics = metrics
        self._start_attempt = start_attempt
        self._queue: deque[Sample] = deque()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.paused = False  # a client paused generation (vllm_control.py): samples wait, none is routed

    def __len__(self) -> int:
        """Samples waiting for an engine."""
        return len(self._queue)

    def enqueue(self, sample: Sample, front: bool = False, wake: bool = True) -> None:
        """Queue the sample; `wake` the dispatch loop to route it (False: the caller dispatches now)."""
        sample.state = SampleState.WAITING
        sample.engine_id = None
        if front:
            self._queue.appendleft(sample)
        else:
            self._queue.append(sample)
        if wake:
            self._wake.set()

    def enqueue_all(self, samples: list[Sample]) -> None:
        """Samples new to the queue (a batch's), at its end in their order."""
        self._queue.extend(samples)
        self._wake.set()

    def discard(self, keep: Callable[[Sample], bool]) -> None:
        """Drop the queued samples `keep` says no to."""
        self._queue = deque(sample for sample in self._queue if keep(sample))

    def end_session(self, session_id: str) -> None:
        """The client says a session is over (vllm-router's `/finish_session`): its engine is no
        longer kept for it."""
        self.session_router.end(session_key(session_id))

    def pause(self) -> None:
        """Route nothing until `resume`: new and resumed samples wait in the queue (a trainer's pause
        around a weight update; what runs is the pauser's to drain or wait for)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    def wake(self) -> None:
        """Engines have room, or samples wait: route what can be routed, a loop turn from now."""
        self._wake.set()

    def wake_if_waiting(self) -> None:
        if self._queue:
            self._wake.set()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.dispatch()

    def dispatch(self) -> None:
        """Route every queued sample that has an eligible engine, in queue order."""
        routable = self._registry.routable() if self._queue and not self.paused else None
        if not routable:
            return
        now = (self._loop or asyncio.get_running_loop()).time()
        blocked: deque[Sample] = deque()
        while self._queue:
            sample = self._queue.popleft()
            candidates = self._eligible(sample, routable)
            if not candidates:
                blocked.append(sample)
                continue
            router, reads_cache, reads_load = (
                (self.router, self.reads_cache, self._reads_load)
                if sample.session_id is None
                else (self.session_router, False, True)
            )
            request, view = route_inputs(sample, candidates, now, reads_cache, reads_load)
            self._start_attempt(sample, self._route(request, view, router, sample, candidates))
            if not self._queue:
                break
            routable = self._registry.routable()  # the engine it went to may be full now
            if not routable:
                break
        if blocked:
            blocked.extend(self._queue)
            self._queue = blocked

    def _route(
        self,
        request: RouteRequest,
        view: ClusterView,
        router: Router,
        sample: Sample,
        candidates: list[EngineRecord],
    ) -> EngineRecord:
        """The router's pick; a router that fails or picks outside the view is logged, counted and
        overruled by least-outstanding (on the engines' whole views)."""
        try:
            chosen = router.pick(request, view)
            if chosen not in [engine.engine_id for engine in candidates]:
                raise ValueError(f"picked engine {chosen}, not among {[e.engine_id for e in candidates]}")
        except Exception as exc:  # any policy failure takes the same fallback
            self._metrics.router_errors.inc()
            log.error("router %s failed (%s); routing by least outstanding", router.name, exc)
            _, whole = route_inputs(sample, candidates, view.now, reads_cache=False)
            chosen = self._fallback_router.pick(request, whole)
        return self._registry.get(chosen)

    def _eligible(self, sample: Sample, engines: list[EngineRecord]) -> list[EngineRecord]:
        """Which of the `engines` with room may take the sample (its weight version, its batch's
        offload)."""
        version = sample.weight_version
        if version is not None and not sample.allow_off_policy:
            engines = [e for e in engines if e.weight_version == version]
        batch = self._batches.get(sample.batch_id)
        if batch is not None and batch.offloaded and OffloadBalancer.offload_targets(self._registry.live()):
            engines = OffloadBalancer.offload_targets(engines)
        return engines
