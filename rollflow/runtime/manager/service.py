"""The manager's core: queue, dispatch, stream, record, resume. No HTTP here (see server.py).

Life of a sample:

    WAITING in the queue -> dispatched: a router picks among eligible engines
    -> RUNNING: tokens stream in and are recorded as they arrive
    -> the engine finishes it (FINISHED), or the attempt ends early (engine died, hung,
       was removed, drained, or the local budget ran out) and the sample goes back to the
       front of the queue with prompt + generated tokens as its next input and
       `max_new_tokens` reduced by what it already has.
    A client's abort (`abort_sample`, or an abort a client sent the engine itself, as slime's
    abort_all does) is no failure: the sample ends there, FINISHED with finish_reason "abort"
    and the tokens it has, and is not resumed.

Eligible engines for a sample: healthy, below capacity, on the sample's weight version
(unless it allows off-policy tokens), and after its batch's local budget expired, remote or
spot only (when any exist). Everything the router sees is a `ClusterView` built from the
registry, so the routers are the simulator's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import os
import uuid
from collections import OrderedDict, deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from rollflow.errors import UserError
from rollflow.policy.offload import OffloadBalancer, StepReport
from rollflow.policy.routing import Router, make_router
from rollflow.policy.view import ClusterView, InstanceKind, RouteRequest
from rollflow.runtime.engines.base import NotSupportedError, SamplingParams
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.engines.http import failure_text
from rollflow.runtime.manager import attempt, recovery
from rollflow.runtime.manager.attempt import ENGINE_ERRORS, Outcome
from rollflow.runtime.manager.config import ManagerConfig
from rollflow.runtime.manager.journal import Journal
from rollflow.runtime.manager.journal_lock import JournalLock
from rollflow.runtime.manager.metrics import ManagerMetrics
from rollflow.runtime.manager.packing import GroupPacker
from rollflow.runtime.manager.registry import EngineRecord, Registry
from rollflow.runtime.manager.request_log import RequestLog
from rollflow.runtime.manager.samples import Sample, SampleRun, SampleState, Watcher
from rollflow.runtime.manager.stall import StallSweep
from rollflow.runtime.manager.view import refresh_load, route_inputs

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("rollflow.manager")

ENGINE_STARTUP_POLL_S = 0.5
LOOP_BEAT_S = 0.25
LOOP_BLOCKED_S = 1.0
"""A beat this much later than due means the loop was blocked, not an engine silent."""
# a move that ends an attempt with nothing left to resume: the sample ends or is gone
MOVE_OUTCOMES = {"cancelled": Outcome.CANCELLED, "client_abort": Outcome.CLIENT_ABORT}


DELETED_BATCHES_KEPT = 1024  # deleted batch ids remembered, each with the message of its deletion


def normalise_url(url: str) -> str:
    """One spelling per engine: lower-case scheme and host, localhost as 127.0.0.1, the default
    port dropped, no trailing slash."""
    parts = urlsplit(url.strip())
    host = (parts.hostname or "").lower()
    if host == "localhost":
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    scheme = parts.scheme.lower()
    port = parts.port
    netloc = host if port is None or port == {"http": 80, "https": 443}.get(scheme) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def sample_sampling(sampling: SamplingParams, group: int, index: int) -> SamplingParams:
    """A batch's seed made one per sample (the samples of a group must differ), derived from the seed
    and the sample's place in the batch, so a batch submitted twice draws the same samples."""
    if sampling.seed is None:
        return sampling
    digest = hashlib.blake2b(f"{sampling.seed}:{group}:{index}".encode(), digest_size=8).digest()
    return dataclasses.replace(sampling, seed=int.from_bytes(digest, "little"))


class EngineUnavailable(UserError):
    """An engine that cannot join: unreachable or unhealthy at registration."""


class EngineAlreadyRegistered(EngineUnavailable):
    """An engine whose url a live record holds already."""


class WeightUpdateNotSupported(UserError):
    """The engine's kind has no route for the update asked (e.g. SGLang pulling from a weight server)."""


@dataclass
class Batch:
    batch_id: str
    groups: list[list[Sample]]
    packer: GroupPacker
    budget_s: float | None  # local time budget; None when offloading is off
    offloaded: bool = False
    completed: list[Sample] = field(default_factory=list)  # samples in completion order
    deleted: str | None = None  # why the batch went away (DELETE /batches/{id}), once it did
    handouts: list[list[int]] = field(default_factory=list)  # group indexes of each micro-batch handed out
    _waiters: list[asyncio.Future] = field(default_factory=list)

    def changed(self) -> asyncio.Future:
        """A future that completes at the next change (a sample done, the batch deleted).

        Each caller takes its own before reading the batch, so a change that lands while it
        reads or writes is never lost (as a shared event cleared after reading would lose it).
        """
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def samples(self) -> list[Sample]:
        return [sample for group in self.groups for sample in group]

    @property
    def done(self) -> bool:
        return len(self.completed) == sum(len(group) for group in self.groups)

    def status(self) -> dict:
        states = {state.name.lower(): 0 for state in SampleState}
        for sample in self.samples:
            states[sample.state.name.lower()] += 1
        return {
            "batch_id": self.batch_id,
            "num_groups": len(self.groups),
            "num_samples": sum(len(group) for group in self.groups),
            "states": states,
            "offloaded": self.offloaded,
            "budget_s": self.budget_s,
        }


class RolloutManager:
    def __init__(self, config: ManagerConfig, router: Router | None = None) -> None:
        self.config = config
        self.router = router or make_router(config.router, seed=config.seed, path=config.router_path)
        self._fallback_router = make_router("least_outstanding")
        self.reads_cache = getattr(self.router, "reads_cache", False)  # fill the view's cached_tokens
        self._reads_load = getattr(self.router, "reads_load", True)  # False: ids and order only
        self.session_router = make_router("session", seed=config.seed)  # routes sessions' turns (sessions.py)
        # decodes output tokens (server.py sets it from `tokenizer:`): cuts a spanning stop at its token
        self.tokenizer: Tokenizer | None = None
        self.registry = Registry()
        self.metrics = ManagerMetrics(before_render=self._update_gauges)
        self.num_step_reports = 0
        self.last_step_report: dict | None = None  # what the trainer reported last
        self.balancer = OffloadBalancer(config.offload.settings()) if config.offload.enabled else None
        self.batches: dict[str, Batch] = {}
        # why each of the latest deleted batches went: a /next or stream that reaches the manager
        # just after its batch's DELETE (a race of two of the trainer's own calls) is told so
        self.deleted_batches: OrderedDict[str, str] = OrderedDict()
        self._queue: deque[Sample] = deque()
        self._runs: dict[str, SampleRun] = {}  # sample id -> live state, while the manager tracks it
        self.journal: Journal | None = None  # with `journal:` set, from start() on
        self.journal_lock: JournalLock | None = None  # held from start() to close()
        self._restarts = 0  # managers that ran on this journal before this one (a part of each rid)
        self._seq = itertools.count()
        # a single request's sample id: this process's random half and its arrival number (unique
        # across restarts and managers sharing an engine, with no random bytes drawn per request)
        self._id_prefix = os.urandom(8).hex()
        self._wake = asyncio.Event()
        self._background: set[asyncio.Task] = set()
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self._last_tick = 0.0  # last beat of the loop watch
        self._loop_blocked_at = float("-inf")  # when the manager's own loop was last seen blocked
        self.request_log = RequestLog(config.request_log) if config.request_log else None
        from rollflow.runtime.manager.sessions import SessionStore  # sessions.py imports this module

        self.sessions = SessionStore(self)  # multi-turn sessions, restored with the batches

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        # kept: Python 3.11's get_running_loop() makes a getpid() system call per call
        self._loop = asyncio.get_running_loop()
        self._last_tick = self._loop.time()
        try:
            snapshot = await recovery.restore(self) if self.config.journal else None
        except BaseException:  # a journal refused (locked, read-only, corrupt...): nothing else started
            await self._session.close()
            raise
        self.spawn(self._dispatch_loop())
        self.spawn(self._health_loop())
        self.spawn(self._load_loop())
        self.spawn(self._loop_watch())
        # one sweep notices every engine that produces nothing for anyone while it has work (a
        # request queued in a producing engine is not silent); the manager may have been the silent one
        sweep = StallSweep(
            self.config.stall_timeout_s, self._busy_engines, self._stalled, self._manager_stalled
        )
        self.spawn(sweep.run())
        try:
            for index, entry in enumerate(self.config.engines):
                await self._add_configured_engine(index, entry)
            if snapshot is not None:
                await recovery.rejoin_engines(self, snapshot)
        except BaseException:
            await self.close()  # no task or session outlives a manager that failed to start
            raise

    async def _add_configured_engine(self, index: int, entry) -> None:
        """Register `engines[index]` of the config, waiting up to `engine_startup_timeout_s` for it to
        come up (engines take seconds to load a model; sgl-router's worker_startup_timeout_secs)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.engine_startup_timeout_s
        waited = False
        while True:
            try:
                await self.add_engine(entry.url, entry.kind, entry.engine_type, entry.capacity, entry.api_key)
                return
            except EngineAlreadyRegistered:
                raise
            except EngineUnavailable as exc:
                if loop.time() >= deadline:
                    waited_for = (
                        f" (waited {self.config.engine_startup_timeout_s:g}s, engine_startup_timeout_s)"
                    )
                    raise EngineUnavailable(
                        f"{exc}{waited_for if waited else ''}; start the engine first, or correct or "
                        f"remove engines.{index} of the config"
                    ) from None
                if not waited:
                    log.info("waiting for engine %s to come up: %s", entry.url, exc)
                    waited = True
                await asyncio.sleep(min(ENGINE_STARTUP_POLL_S, max(0.0, deadline - loop.time())))

    async def close(self) -> None:
        self.sessions.stop()
        tasks = [*self._background, *(run.task for run in self._runs.values() if run.task is not None)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.journal is not None:
            await self.journal.close()
        if self.journal_lock is not None:
            self.journal_lock.release()
        if self._session is not None:
            await self._session.close()
        if self.request_log is not None:
            await asyncio.to_thread(self.request_log.close)

    @property
    def journal_error(self) -> str | None:
        """Why the journal cannot write, while it cannot: what is asked of the manager that it would
        have to journal (a batch, a session) is refused with it meanwhile."""
        return self.journal.error if self.journal is not None else None

    def journal_written(self, error: str | None) -> None:
        """The journal's word after a failed write (`error`) and once writes succeed again (None)."""
        if error is not None:
            self.metrics.journal_errors.inc()
        self.metrics.journal_state.set(0 if error is None else 1)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run `coro` in the background, kept until it ends and cancelled when the manager closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------------ engines

    async def add_engine(
        self,
        url: str,
        kind: InstanceKind = "local",
        engine_type: str = "sglang",
        capacity: int = 64,
        api_key: str | None = None,
    ) -> EngineRecord:
        """Health-check an engine, read its weight version, and put it in the pool at once.

        The url is normalised (one engine, one record); a failed engine's url may register again
        (a restarted engine rejoins), replacing the failed record.
        """
        try:
            url = normalise_url(url)
        except ValueError as exc:
            raise EngineUnavailable(f"bad engine url {url!r}: {exc}") from None
        existing = self.registry.by_url(url)
        if existing is not None and existing.state != "failed":
            raise EngineAlreadyRegistered(
                f"an engine with url {url} is already registered (id {existing.engine_id}, {existing.state})"
            )
        client = make_client(engine_type, url, self._session, api_key=api_key)
        try:
            healthy = await asyncio.wait_for(client.health(), self.config.connect_timeout_s)
            version = await asyncio.wait_for(client.weight_version(), self.config.connect_timeout_s)
        except (*ENGINE_ERRORS, TimeoutError) as exc:
            raise EngineUnavailable(f"engine at {url} is unreachable: {failure_text(exc)}") from None
        if not healthy:
            raise EngineUnavailable(f"engine at {url} is not healthy")
        if existing is not None:
            self.registry.forget(existing.engine_id)
        engine = self.registry.add(
            url=url,
            kind=kind,
            engine_type=engine_type,
            capacity=capacity,
            client=client,
            weight_version=version,
            api_key=api_key,
        )
        log.info("engine %d joined: %s kind=%s version=%s", engine.engine_id, url, kind, version)
        self._journal_engine(engine)
        if kind != "local":
            for batch in self.batches.values():
                if batch.offloaded:
                    self._move_local_samples(batch)
        self._wake.set()
        return engine

    def add_failed_engine(
        self, url: str, kind: InstanceKind, engine_type: str, capacity: int, api_key: str | None
    ) -> EngineRecord:
        """An engine known from before a restart that does not answer yet: set aside in the circuit
        breaker, whose half-open checks register it again once it answers."""
        client = make_client(engine_type, url, self._session, api_key=api_key)
        engine = self.registry.add(
            url=url,
            kind=kind,
            engine_type=engine_type,
            capacity=capacity,
            client=client,
            weight_version=None,
            api_key=api_key,
        )
        engine.state = "failed"
        self._open_breaker(engine)
        self._journal_engine(engine)
        return engine

    async def remove_engine(self, engine_id: int) -> EngineRecord:
        """Deregister and forget: the engine's running samples resume elsewhere with their tokens,
        and its url may register again."""
        engine = self.registry.get(engine_id)
        if engine is None:
            raise KeyError(engine_id)
        self._retire(engine, "removed", reason="engine_removed")
        engine.state = "removed"  # a failed engine is removed too
        self.registry.forget(engine_id)
        if self.journal is not None:
            self.journal.engine_removed(engine.url)
        return engine

    async def update_engine_weights(
        self,
        engine_id: int,
        version: int,
        *,
        model_path: str | None = None,
        weights_url: str | None = None,
        codec: str | None = None,
    ) -> EngineRecord:
        """Hold the engine out of the pool while it loads new weights (from `model_path`, or pulled
        from the weight server at `weights_url` with `codec`, None for the engine's default); it
        rejoins on `version` only.

        An engine that failed to load is retired; one whose kind cannot pull (NotSupportedError)
        loaded nothing, so it rejoins on its old weights and WeightUpdateNotSupported is raised.
        """
        if (model_path is None) == (weights_url is None):
            raise ValueError("give exactly one of model_path and weights_url")
        engine = self.registry.get(engine_id)
        if engine is None or engine.state not in ("healthy", "updating"):
            raise KeyError(engine_id)
        engine.state = "updating"
        for sample_id in list(engine.running):
            self._move(sample_id, "weight_update")
        try:
            if weights_url is not None:
                await engine.client.update_weights_from_server(weights_url, version, codec)
            else:
                await engine.client.update_weights_from_disk(model_path, version)
            loaded = await engine.client.weight_version()
        except NotSupportedError as exc:
            engine.state = "healthy"
            self._wake.set()
            raise WeightUpdateNotSupported(f"engine {engine_id} cannot take this update: {exc}") from None
        except ENGINE_ERRORS as exc:
            self._retire(engine, "failed", reason="weight_update_failed")
            raise EngineUnavailable(f"engine {engine_id} failed to load weights: {exc}") from None
        if loaded != version:
            self._retire(engine, "failed", reason="weight_update_failed")
            raise EngineUnavailable(f"engine {engine_id} reports version {loaded} after loading {version}")
        engine.weight_version = version
        engine.state = "healthy"
        self._journal_engine(engine)
        self._wake.set()
        return engine

    def record_weight_version(self, engine: EngineRecord, version: int | None) -> None:
        """An engine loaded new weights outside `update_engine_weights` (a pass-through
        `/update_weights_from_disk`): route by its new version at once."""
        engine.weight_version = version
        self._wake.set()

    def _journal_engine(self, engine: EngineRecord) -> None:
        if self.journal is not None:
            self.journal.engine_registered(engine.url, recovery.engine_record(engine))
            self.journal.set_state("next_engine_id", self.registry.next_id)

    async def drain_engine(self, engine: EngineRecord, reason: str) -> int:
        """End every attempt running on an engine already out of routing; the samples resume
        elsewhere from their tokens. Returns once all of them have left it: how many there were."""
        moved = list(engine.running)
        for sample_id in moved:
            self._move(sample_id, reason)
        runs = [self._runs.get(s) for s in moved]
        tasks = [run.task for run in runs if run is not None and run.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        return len(moved)

    def route_again(self) -> None:
        """An engine came back into routing: dispatch what waits."""
        self._wake.set()

    def retire(self, engine: EngineRecord, reason: str) -> None:
        """Take a failed engine out of the pool (its samples resume elsewhere); the breaker retries it."""
        self._retire(engine, "failed", reason)

    def loop_time(self) -> float:
        return self._loop.time()

    @property
    def http(self) -> aiohttp.ClientSession:
        """The manager's one HTTP session."""
        assert self._session is not None, "the manager is not started"
        return self._session

    def _retire(self, engine: EngineRecord, state: str, reason: str) -> None:
        if engine.state in ("failed", "removed"):
            return
        engine.state = state
        if state == "failed":
            self.metrics.engine_failures.labels(reason).inc()
            self._open_breaker(engine)
            log.warning(
                "engine %d (%s) left the pool: %s; retried in %.0fs",
                engine.engine_id,
                engine.url,
                reason,
                engine.retry_at - asyncio.get_running_loop().time(),
            )
        for sample_id in list(engine.running):
            self._move(sample_id, reason if state == "failed" else "engine_removed")
        self.spawn(engine.client.close())
        self._wake.set()

    def _open_breaker(self, engine: EngineRecord) -> None:
        """Set a failed engine aside for a pause that doubles with each failure in a row."""
        engine.consecutive_failures += 1
        pause = self.config.breaker_pause_s * 2 ** (engine.consecutive_failures - 1)
        engine.retry_at = asyncio.get_running_loop().time() + min(pause, self.config.breaker_max_pause_s)

    async def _half_open(self, engine: EngineRecord) -> None:
        """Try a failed engine whose pause is over: healthy, it registers again under its url (a new
        id, its weight version read afresh, as a restarted engine would); else it waits longer."""
        try:
            rejoined = await self.add_engine(
                engine.url,
                kind=engine.kind,
                engine_type=engine.engine_type,
                capacity=engine.capacity,
                api_key=engine.api_key,
            )
        except EngineAlreadyRegistered:  # registered again by hand meanwhile
            self.registry.forget(engine.engine_id)
        except EngineUnavailable as exc:
            self._open_breaker(engine)
            log.info("engine %d is still down (%s); next try in a while", engine.engine_id, exc)
        else:
            rejoined.consecutive_failures = engine.consecutive_failures
            log.info("engine %d rejoined as engine %d after its pause", engine.engine_id, rejoined.engine_id)

    async def _health_loop(self) -> None:
        interval = self.config.health_interval_s
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for engine in self.registry.live():
                engine.tokens_per_s = engine.window_tokens / max(now - last, 1e-9)
                engine.window_tokens = 0
                self.metrics.engine_tokens_per_s.labels(str(engine.engine_id), engine.kind).set(
                    engine.tokens_per_s
                )
            last = now
            engines = self.registry.live()
            checked_at = loop.time()
            results = await asyncio.gather(
                *(asyncio.wait_for(e.client.health(), interval) for e in engines), return_exceptions=True
            )
            # a check that timed out while the manager's own loop was blocked (a big body parsed, a
            # starved CPU) says nothing about the engine: its answer may be waiting unread
            blocked = self._loop_blocked_at >= checked_at or self._manager_stalled_now()
            for engine, healthy in zip(engines, results, strict=True):
                if healthy is True:
                    engine.health_failures = 0
                    continue
                if blocked and isinstance(healthy, TimeoutError):
                    continue
                engine.health_failures += 1
                if engine.health_failures >= self.config.health_failures_to_remove:
                    self._retire(engine, "failed", reason="health_check")
            due = [e for e in self.registry.failed() if e.retry_at <= loop.time()]
            await asyncio.gather(*(self._half_open(engine) for engine in due))

    async def _load_loop(self) -> None:
        """Ask every live engine what it holds, every `load_poll_interval_s` (see view.py)."""
        while True:
            await asyncio.sleep(self.config.load_poll_interval_s)
            engines = self.registry.live()
            await asyncio.gather(*(refresh_load(e, self.config.load_poll_interval_s) for e in engines))

    async def _loop_watch(self) -> None:
        """Beat every LOOP_BEAT_S and note when a beat came late: the manager itself was blocked
        (a big body, a slow callback), so a stream that sent nothing meanwhile is not a hung engine."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LOOP_BEAT_S)
            now = loop.time()
            if now - self._last_tick > LOOP_BEAT_S + LOOP_BLOCKED_S:
                self._loop_blocked_at = now
                log.warning(
                    "the manager's event loop was blocked for %.1fs", now - self._last_tick - LOOP_BEAT_S
                )
            self._last_tick = now

    def _busy_engines(self) -> list[EngineRecord]:
        """The engines some attempt streams from (in any state: a draining engine may hang too)."""
        return [engine for engine in self.registry.all() if engine.running]

    def _stalled(self, engine: EngineRecord) -> None:
        """An engine sent no chunk to any stream for a whole stall window while it had work: it is
        hung (its samples move)."""
        self._retire(engine, "failed", reason="hung")

    def _manager_stalled(self) -> bool:
        """True when the manager's loop was blocked within the last stall window (or is just now)."""
        now = asyncio.get_running_loop().time()
        return now - self._loop_blocked_at < self.config.stall_timeout_s or self._manager_stalled_now()

    def _manager_stalled_now(self) -> bool:
        """True when the loop's last beat is overdue: it is blocked now, before the watch notes it."""
        return asyncio.get_running_loop().time() - self._last_tick > LOOP_BEAT_S + LOOP_BLOCKED_S

    def _update_gauges(self) -> None:
        """Set the state gauges; called as /metrics renders them, not at every change."""
        counts = dict.fromkeys(self.metrics.engines_by_state, 0)
        for engine in self.registry.all():
            counts[engine.state] += 1
        for state, count in counts.items():
            self.metrics.engines_by_state[state].set(count)
        self.metrics.queue_depth.set(len(self._queue))
        self.metrics.running_samples.set(sum(len(e.running) for e in self.registry.all()))

    # ------------------------------------------------------------------ samples

    @property
    def num_queued(self) -> int:
        """Samples waiting in the manager for an engine."""
        return len(self._queue)

    def submit_sample(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        allow_off_policy: bool = False,
        sample_id: str | None = None,
        session_id: str | None = None,
        pinned_version: int | None = None,
        watcher: Watcher | None = None,
    ) -> Sample:
        """One request a caller waits on; a session's turn names its session (routed by
        `session_router`) and the weight version the session holds to. `watcher` is told of each
        update (default: an asyncio.Event, which `wait_for_update` waits on)."""
        seq = next(self._seq)
        sample = Sample(
            seq=seq,
            sample_id=sample_id or f"{self._id_prefix}{seq:016x}",
            prompt_ids=list(prompt_ids),
            sampling=sampling,
            allow_off_policy=allow_off_policy,
            session_id=session_id,
            pinned_version=pinned_version,
        )
        self._runs[sample.sample_id] = SampleRun(sample, watcher=watcher or asyncio.Event())
        self._enqueue(sample, wake=False)
        self._dispatch()  # routed now rather than a loop turn later: a request's latency is the manager's
        if self._queue:  # no engine had room: the dispatch loop tries again when one has
            self._wake.set()
        return sample

    def submit_batch(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        allow_off_policy: bool = False,
        batch_id: str | None = None,
    ) -> Batch:
        """A batch of `n` samples per prompt; `batch_id` (the client's, so that a retried submission
        finds its batch) must be new."""
        batch_id = batch_id or uuid.uuid4().hex[:12]
        self.deleted_batches.pop(batch_id, None)  # an id used again names the new batch
        groups = [
            [
                Sample(
                    seq=next(self._seq),
                    sample_id=f"{batch_id}-{g}-{i}",
                    prompt_ids=list(prompt),
                    sampling=sample_sampling(sampling, g, i),
                    allow_off_policy=allow_off_policy,
                    batch_id=batch_id,
                    group_index=g,
                )
                for i in range(n)
            ]
            for g, prompt in enumerate(prompts)
        ]
        loop = asyncio.get_running_loop()
        budget = self.balancer.budget_s if self.balancer is not None else None
        batch = Batch(batch_id, groups, GroupPacker(groups), budget)
        self.batches[batch_id] = batch
        for sample in batch.samples:
            self._runs[sample.sample_id] = SampleRun(sample)
        self._queue.extend(batch.samples)
        if self.journal is not None:
            submission = recovery.batch_submission(prompts, n, sampling, allow_off_policy, budget)
            self.journal.batch_submitted(batch_id, submission, batch.samples)
        if budget is not None:
            loop.call_later(budget, self._expire_budget, batch)
        self._wake.set()
        return batch

    def forget_batch(self, batch_id: str, deleted: str | None = None) -> None:
        """Drop a batch the trainer is done with (delivered, or no longer wanted: its unfinished
        samples stop). `deleted` says why a batch was dropped unfinished: its waiting `next` calls
        and sample streams end with that message."""
        batch = self.batches.pop(batch_id)
        if self.journal is not None:
            self.journal.batch_gone(batch_id)
        if deleted is not None:
            batch.deleted = deleted
            batch.packer.cancel(deleted)
            batch.notify()
            self.deleted_batches[batch_id] = deleted
            if len(self.deleted_batches) > DELETED_BATCHES_KEPT:
                self.deleted_batches.popitem(last=False)
        for sample in batch.samples:
            if sample.state < SampleState.FINISHED:
                self._move(sample.sample_id, "cancelled")
                sample.state = SampleState.FAILED
                sample.error = "batch cancelled"
            self._runs.pop(sample.sample_id, None)
        self._queue = deque(s for s in self._queue if s.batch_id != batch_id)

    def report_step(
        self, step_time_s: float, bubble_s: float, rollout_s: float | None = None
    ) -> float | None:
        """The trainer's measurement of one step; returns the next local budget (None if offload is off)."""
        self.num_step_reports += 1
        self.last_step_report = {"step_time_s": step_time_s, "bubble_s": bubble_s, "rollout_s": rollout_s}
        budget = (
            self.balancer.update(StepReport(step_time_s, bubble_s)) if self.balancer is not None else None
        )
        if self.journal is not None:
            self.journal.set_state("step_reports", recovery.step_reports(self))
        return budget

    async def hand_out(self, batch: Batch, groups: list[list[Sample]], client_keeps: bool = False) -> None:
        """Note a micro-batch handed to the trainer, so that a restarted manager never hands those
        groups out again. With a journal it is on disk before the trainer hears of it, unless the
        client keeps the record itself (`client_keeps`: it sends the hand-outs it holds with its next
        call, see `adopt_handouts`); then it rides the journal's next flush."""
        if not groups:
            return
        batch.handouts.append([group[0].group_index for group in groups])
        if self.journal is not None:
            self.journal.handed_out(batch.batch_id, len(batch.handouts) - 1, batch.handouts[-1])
            if not client_keeps:
                await self.journal.durable()

    def adopt_handouts(self, batch: Batch, received: list[list[int]]) -> None:
        """Take the client's word for the micro-batches it holds beyond those this manager knows of:
        handed out by a manager that died before journaling them. Raises ValueError when `received`
        contradicts what this manager handed out (another client took them, or a wrong batch)."""
        known = batch.handouts
        if received[: len(known)] != known[: len(received)]:
            raise ValueError(
                f"received does not match the micro-batches of batch {batch.batch_id} handed out so far"
            )
        new = received[len(known) :]
        if not new:
            return
        indexes = [index for handout in new for index in handout]
        if not all(handout for handout in new) or len(set(indexes)) != len(indexes):
            raise ValueError("received holds an empty micro-batch or a group twice")
        for index in indexes:
            if not 0 <= index < len(batch.groups) or batch.packer.delivered(index):
                raise ValueError(
                    f"received holds group {index}: batch {batch.batch_id} has no such group, or "
                    "handed it out in another micro-batch"
                )
        for handout in new:
            known.append(list(handout))
            if self.journal is not None:
                self.journal.handed_out(batch.batch_id, len(known) - 1, known[-1])
        batch.packer.mark_delivered(indexes)
        log.info(
            "batch %s: %d micro-batches the client holds were handed out before a restart, not journaled",
            batch.batch_id,
            len(new),
        )

    async def wait_for_update(self, sample: Sample) -> None:
        """Return once the sample has new tokens or a final state."""
        event = self._runs[sample.sample_id].watcher
        await event.wait()
        event.clear()

    def release(self, sample: Sample) -> None:
        """A single request's caller is done with it (finished or disconnected)."""
        if sample.state < SampleState.FINISHED:
            self._move(sample.sample_id, "cancelled")
            sample.state = SampleState.FAILED
            sample.error = "client went away"
            self._queue = deque(s for s in self._queue if s is not sample)
        self._runs.pop(sample.sample_id, None)

    def _enqueue(self, sample: Sample, front: bool = False, wake: bool = True) -> None:
        """Queue the sample; `wake` the dispatch loop to route it (False: the caller dispatches now)."""
        sample.state = SampleState.WAITING
        sample.engine_id = None
        if front:
            self._queue.appendleft(sample)
        else:
            self._queue.append(sample)
        if wake:
            self._wake.set()

    def notify(self, sample: Sample) -> None:
        """Tell whoever waits on the sample (a single request's caller) that it changed."""
        run = self._runs.get(sample.sample_id)
        if run is not None and run.watcher is not None:
            run.watcher.set()

    # ----------------------------------------------------------------- dispatch

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._dispatch()

    def _dispatch(self) -> None:
        """Route every queued sample that has an eligible engine, in queue order."""
        routable = self.registry.routable() if self._queue else None
        if not routable:
            return
        now = self._loop.time()
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
            routable = self.registry.routable()  # the engine it went to may be full now
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
        overruled by least-outstanding (on the engines' whole views), because one bad policy must not
        stop every rollout."""
        try:
            chosen = router.pick(request, view)
            if chosen not in [engine.engine_id for engine in candidates]:
                raise ValueError(f"picked engine {chosen}, not among {[e.engine_id for e in candidates]}")
        except Exception as exc:  # any policy failure takes the same fallback
            self.metrics.router_errors.inc()
            log.error("router %s failed (%s); routing by least outstanding", router.name, exc)
            _, whole = route_inputs(sample, candidates, view.now, reads_cache=False)
            chosen = self._fallback_router.pick(request, whole)
        return self.registry.get(chosen)

    def _eligible(self, sample: Sample, engines: list[EngineRecord]) -> list[EngineRecord]:
        """Which of the `engines` with room may take the sample (its weight version, its batch's
        offload)."""
        version = sample.weight_version
        if version is not None and not sample.allow_off_policy:
            engines = [e for e in engines if e.weight_version == version]
        batch = self.batches.get(sample.batch_id)
        if batch is not None and batch.offloaded and any(e.kind != "local" for e in self.registry.live()):
            engines = [e for e in engines if e.kind != "local"]
        return engines

    def _rid(self, sample: Sample) -> str:
        """The engine's request id of the sample's current attempt, unique across manager restarts."""
        rid = f"{sample.sample_id}.{sample.attempts}"
        return f"{rid}.r{self._restarts}" if self._restarts else rid

    def _start_attempt(self, sample: Sample, engine: EngineRecord) -> None:
        sample.begin_attempt(engine.engine_id)
        if not engine.running:  # the stall sweep's clock starts when an idle engine is given work
            engine.heard_at = self._loop.time()
        if self.reads_cache:  # the record's only reader: routers that never read it pay nothing
            engine.prefixes.sent(sample.prompt_ids + sample.output_ids)  # a resume sends its tokens too
        engine.dispatched(
            sample.sample_id, len(sample.prompt_ids) + len(sample.output_ids), sample.remaining_tokens
        )
        if self.journal is not None:
            self.journal.attempt_started(sample, self._rid(sample), engine.url)
        run = self._runs[sample.sample_id]
        run.task = self._loop.create_task(self._run_attempt(run, engine))

    def _move(self, sample_id: str, reason: str) -> None:
        """End a running attempt early; `_run_attempt` puts the sample back in the queue."""
        run = self._runs.get(sample_id)
        task = run.task if run is not None else None
        if task is None or task is asyncio.current_task():
            return  # no attempt, or the attempt that noticed the failure resumes its own sample
        if not task.done() and run.move_reason is None:
            run.move_reason = reason
            task.cancel()

    def _expire_budget(self, batch: Batch) -> None:
        if self.batches.get(batch.batch_id) is not batch or batch.done:
            return
        batch.offloaded = True
        if self.journal is not None:
            self.journal.batch_offloaded(batch.batch_id)
        log.info("batch %s: local budget of %.2fs expired", batch.batch_id, batch.budget_s)
        self._move_local_samples(batch)
        self._wake.set()

    def _move_local_samples(self, batch: Batch) -> None:
        if not any(e.kind != "local" for e in self.registry.live()):
            return  # nowhere to offload to; local engines keep going
        for sample in batch.samples:
            engine = self.registry.get(sample.engine_id) if sample.state == SampleState.RUNNING else None
            if engine is not None and engine.kind == "local":
                self._move(sample.sample_id, "offloaded")

    # ------------------------------------------------------------------ streaming

    async def _run_attempt(self, run: SampleRun, engine: EngineRecord) -> None:
        """Run one attempt, then decide from its outcome: finish, resume elsewhere, or fail."""
        sample = run.sample
        rid = self._rid(sample)
        moved_for: str | None = None
        try:
            outcome = await attempt.stream(self, run, engine, rid)
        except asyncio.CancelledError:
            moved_for, run.move_reason = run.move_reason, None
            if moved_for is None:
                raise  # the manager is shutting down
            asyncio.current_task().uncancel()
            self.spawn(attempt.abort_quietly(engine, rid, self.config.connect_timeout_s))
            outcome = MOVE_OUTCOMES.get(moved_for, Outcome.MOVED)
        except Exception as exc:  # a fault of the manager's own code: the sample must end, not hang
            log.exception("attempt %s on engine %d failed unexpectedly", rid, engine.engine_id)
            sample.error = f"internal error reading engine {engine.engine_id}'s answer: {exc!r}"
            outcome = Outcome.REQUEST_FAILED  # tried elsewhere, then failed with this error
        finally:
            engine.ended(sample.sample_id)
            run.task = None
            if self.journal is not None:
                self.journal.attempt_ended(sample)
            if self._queue:  # the engine has room again for what waits (a resume below wakes anyway)
                self._wake.set()
        if outcome is Outcome.FINISHED:
            self._finish(sample)
        elif outcome is Outcome.CLIENT_ABORT:
            self._end_aborted(sample, sample.error or "aborted by request")
        elif outcome is Outcome.REJECTED:  # the request itself is bad: another engine would refuse it too
            sample.state = SampleState.FAILED
            sample.refused = True
            self._complete(sample)
        elif outcome is Outcome.REQUEST_FAILED and not self._note_request_failure(sample):
            sample.state = SampleState.FAILED
            log.warning("sample %s failed: %s", sample.sample_id, sample.error)
            self._complete(sample)
        elif outcome is not Outcome.CANCELLED:
            self._resume(sample, moved_for or outcome.value)

    def _note_request_failure(self, sample: Sample) -> bool:
        """Count a request an engine failed; True while the sample may try another engine (up to
        `request_failures_to_fail` failures)."""
        sample.request_failures += 1
        return sample.request_failures < self.config.request_failures_to_fail

    def _resume(self, sample: Sample, reason: str) -> None:
        sample.resumes += 1
        self.metrics.resumed_samples.labels(reason).inc()
        if self.config.resume == "restart" and sample.output_ids:
            self.metrics.regenerated_tokens.inc(len(sample.output_ids))
            sample.discard_output()
            if self.journal is not None:
                self.journal.output_discarded(sample)
        if sample.attempts >= self.config.max_attempts:
            sample.state = SampleState.FAILED
            sample.error = f"gave up after {sample.attempts} attempts (last: {reason})"
            log.error("sample %s: %s", sample.sample_id, sample.error)
            self._complete(sample)
            return
        log.info(
            "sample %s resumes (%s) with %d tokens kept", sample.sample_id, reason, len(sample.output_ids)
        )
        self._runs[sample.sample_id].resumed_at = asyncio.get_running_loop().time()
        if self.journal is not None:
            self.journal.sample_changed(sample)
        self._enqueue(sample, front=True)

    def abort_sample(self, sample: Sample, message: str = "aborted by request") -> None:
        """A client's abort (`/abort_request`): the sample ends now, FINISHED with finish_reason
        "abort" and the tokens it has; it is not resumed anywhere."""
        if sample.state >= SampleState.FINISHED:
            return
        sample.error = message
        run = self._runs.get(sample.sample_id)
        if run is not None and run.task is not None and not run.task.done():
            # `_run_attempt` aborts it on its engine and ends it, whatever move was pending
            run.move_reason = "client_abort"
            run.task.cancel()
            return
        self._queue = deque(s for s in self._queue if s is not sample)
        self._end_aborted(sample, message)

    def _end_aborted(self, sample: Sample, message: str) -> None:
        sample.state = SampleState.FINISHED
        sample.finish_reason = "abort"
        sample.error = message
        log.info("sample %s aborted with %d tokens: %s", sample.sample_id, len(sample.output_ids), message)
        self._complete(sample)

    def _finish(self, sample: Sample) -> None:
        sample.state = SampleState.FINISHED
        sample.error = None  # an earlier attempt's request error, outlived
        self._complete(sample)

    def _complete(self, sample: Sample) -> None:
        sample.engine_id = None
        run = self._runs.get(sample.sample_id)
        if run is not None and run.watcher is None:
            del self._runs[sample.sample_id]  # a batch's sample: its batch holds it from here on
        self.metrics.finished_samples[sample.state] += 1
        if self.request_log is not None:
            self.request_log.record(sample)
        batch = self.batches.get(sample.batch_id)
        if batch is not None:
            batch.completed.append(sample)
            if self.journal is not None:
                self.journal.sample_changed(sample, completed=len(batch.completed) - 1)
            batch.packer.sample_done(sample)
            batch.notify()
        self.notify(sample)
