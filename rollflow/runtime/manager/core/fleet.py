"""The engine fleet: who is in the pool, on which weights, healthy or set aside.

Registration (health-checked, one record per url), weight updates (held out of the pool while
loading), health checks, load polls, and the circuit breaker that tries a failed engine again after
a pause that doubles with each failure in a row. What runs on the engines is not the fleet's: when
an engine leaves the pool it tells its `FleetListener` to move that engine's samples, and when the
pool gains room it says so, and the manager dispatches.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from rollflow.errors import UserError
from rollflow.policy.offload import OffloadBalancer
from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineClient, NotSupportedError
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.engines.http import ENGINE_ERRORS, failure_text
from rollflow.runtime.manager.config import EngineEntry, ManagerConfig
from rollflow.runtime.manager.core.loop_watch import LoopWatch
from rollflow.runtime.manager.core.metrics import ManagerMetrics
from rollflow.runtime.manager.core.registry import EngineRecord, Registry
from rollflow.runtime.manager.core.stall import StallSweep
from rollflow.runtime.manager.core.view import refresh_load

log = logging.getLogger("rollflow.manager")

ENGINE_STARTUP_POLL_S = 0.5


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


class EngineUnavailable(UserError):
    """An engine that cannot join: unreachable or unhealthy at registration."""


class EngineAlreadyRegistered(EngineUnavailable):
    """An engine whose url a live record holds already."""


class WeightUpdateNotSupported(UserError):
    """The engine's kind has no route for the update asked (e.g. SGLang pulling from a weight server)."""


class FleetListener(Protocol):
    """What the fleet tells whoever runs samples on its engines."""

    def displace(self, engine: EngineRecord, reason: str) -> None:
        """End the attempts running on an engine leaving the pool (their samples resume elsewhere)."""

    def room_changed(self) -> None:
        """An engine joined, came back or changed weights: what waits may be routable now."""

    def remote_engine_joined(self) -> None:
        """A remote or spot engine joined: offloaded batches may move their local samples to it."""

    def engine_recorded(self, engine: EngineRecord) -> None:
        """An engine's record changed (registered, new weights): the journal keeps it."""

    def engine_forgotten(self, engine: EngineRecord) -> None:
        """An engine was removed for good."""


class EngineFleet:
    def __init__(self, config: ManagerConfig, metrics: ManagerMetrics, listener: FleetListener) -> None:
        self.config = config
        self.metrics = metrics
        self.registry = Registry()
        self._listener = listener
        self._session: aiohttp.ClientSession | None = None
        self._loop_watch: LoopWatch | None = None
        self._closing: set[asyncio.Task] = set()  # clients of retired engines, closing

    def open(self, loop_watch: LoopWatch) -> None:
        """Open the fleet's one HTTP session (in the running loop)."""
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        self._loop_watch = loop_watch

    async def close(self) -> None:
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        """The manager's one HTTP session to its engines."""
        assert self._session is not None, "the manager is not started"
        return self._session

    async def add_engine(self, entry: EngineEntry) -> EngineRecord:
        """Health-check an engine, read its weight version, and put it in the pool at once.

        The url is normalised (one engine, one record); a failed engine's url may register again
        (a restarted engine rejoins), replacing the failed record.
        """
        try:
            url = normalise_url(entry.url)
        except ValueError as exc:
            raise EngineUnavailable(f"bad engine url {entry.url!r}: {exc}") from None
        existing = self.registry.by_url(url)
        if existing is not None and existing.state != "failed":
            raise EngineAlreadyRegistered(
                f"an engine with url {url} is already registered (id {existing.engine_id}, {existing.state})"
            )
        client = make_client(entry.engine_type, url, self.http, api_key=entry.api_key)
        try:
            healthy = await within(client.health(), self.config.connect_timeout_s)
            version = await within(client.weight_version(), self.config.connect_timeout_s)
        except (*ENGINE_ERRORS, TimeoutError) as exc:
            raise EngineUnavailable(f"engine at {url} is unreachable: {failure_text(exc)}") from None
        if not healthy:
            raise EngineUnavailable(f"engine at {url} is not healthy")
        if existing is not None:
            self.registry.forget(existing.engine_id)
        engine = self._record(entry, url, client, version)
        log.info("engine %d joined: %s kind=%s version=%s", engine.engine_id, url, entry.kind, version)
        self._listener.engine_recorded(engine)
        if OffloadBalancer.offload_targets([engine]):
            self._listener.remote_engine_joined()
        self._listener.room_changed()
        return engine

    def stall_sweep(self) -> StallSweep:
        """The one sweep that notices every engine that produces nothing for anyone while it has work
        (a request queued in a producing engine is not silent) and retires it as hung; the manager
        may have been the silent one (its loop blocked), which excuses them."""
        stall_s = self.config.stall_timeout_s
        return StallSweep(
            stall_s,
            lambda: [engine for engine in self.registry.all() if engine.running],  # draining ones too
            lambda engine: self.retire(engine, "hung"),
            lambda: self._loop_watch.blocked_within(stall_s),
        )

    async def add_configured(self, index: int, entry: EngineEntry) -> None:
        """Register `engines[index]` of the config, waiting up to `engine_startup_timeout_s` for it to
        come up (engines take seconds to load a model; sgl-router's worker_startup_timeout_secs)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.engine_startup_timeout_s
        waited = False
        while True:
            try:
                await self.add_engine(entry)
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

    def add_failed_engine(self, entry: EngineEntry) -> EngineRecord:
        """An engine known from before a restart (its url normalised then) that does not answer yet:
        set aside in the circuit breaker, whose half-open checks register it again once it answers."""
        client = make_client(entry.engine_type, entry.url, self.http, api_key=entry.api_key)
        engine = self._record(entry, entry.url, client, None)
        engine.state = "failed"
        self._open_breaker(engine)
        self._listener.engine_recorded(engine)
        return engine

    def _record(
        self, entry: EngineEntry, url: str, client: EngineClient, version: int | None
    ) -> EngineRecord:
        """`entry` in the registry under its normalised `url`, called through `client`."""
        fields = entry.model_dump() | {"url": url}  # an EngineRecord's registration fields are EngineEntry's
        return self.registry.add(**fields, client=client, weight_version=version)

    async def remove_engine(self, engine_id: int) -> EngineRecord:
        """Deregister and forget: the engine's running samples resume elsewhere with their tokens,
        and its url may register again."""
        engine = self.registry.get(engine_id)
        if engine is None:
            raise KeyError(engine_id)
        self._retire(engine, "removed", reason="engine_removed")
        engine.state = "removed"  # a failed engine is removed too
        self.registry.forget(engine_id)
        self._listener.engine_forgotten(engine)
        return engine

    async def update_engine_weights(
        self,
        engine_id: int,
        version: int,
        *,
        model_path: str | None = None,
        weights_url: str | None = None,
        codec: str | None = None,
        transport: str | None = None,
    ) -> EngineRecord:
        """Hold the engine out of the pool while it loads new weights (from `model_path`, or pulled
        from the weight server at `weights_url` with `codec` over `transport`, None for the engine's
        defaults); it rejoins on `version` only.

        An engine that failed to load is retired; one whose kind cannot pull (NotSupportedError)
        loaded nothing, so it rejoins on its old weights and WeightUpdateNotSupported is raised.
        """
        if (model_path is None) == (weights_url is None):
            raise ValueError("give exactly one of model_path and weights_url")
        engine = self.registry.get(engine_id)
        if engine is None or engine.state not in ("healthy", "updating"):
            raise KeyError(engine_id)
        engine.state = "updating"
        self._listener.displace(engine, "weight_update")
        try:
            if weights_url is not None:
                await engine.client.update_weights_from_server(weights_url, version, codec, transport)
            else:
                await engine.client.update_weights_from_disk(model_path, version)
            loaded = await engine.client.weight_version()
        except NotSupportedError as exc:
            engine.state = "healthy"
            self._listener.room_changed()
            raise WeightUpdateNotSupported(f"engine {engine_id} cannot take this update: {exc}") from None
        except ENGINE_ERRORS as exc:
            self._retire(engine, "failed", reason="weight_update_failed")
            raise EngineUnavailable(f"engine {engine_id} failed to load weights: {exc}") from None
        if loaded != version:
            self._retire(engine, "failed", reason="weight_update_failed")
            raise EngineUnavailable(f"engine {engine_id} reports version {loaded} after loading {version}")
        engine.weight_version = version
        engine.state = "healthy"
        self._listener.engine_recorded(engine)
        self._listener.room_changed()
        return engine

    def record_weight_version(self, engine: EngineRecord, version: int | None) -> None:
        """An engine loaded new weights outside `update_engine_weights` (a pass-through
        `/update_weights_from_disk`): route by its new version at once."""
        engine.weight_version = version
        self._listener.room_changed()

    def retire(self, engine: EngineRecord, reason: str) -> None:
        """Take a failed engine out of the pool (its samples resume elsewhere); the breaker retries it."""
        self._retire(engine, "failed", reason)

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
        self._listener.displace(engine, reason if state == "failed" else "engine_removed")
        task = asyncio.get_running_loop().create_task(engine.client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        self._listener.room_changed()

    def _open_breaker(self, engine: EngineRecord) -> None:
        """Set a failed engine aside for a pause that doubles with each failure in a row."""
        engine.consecutive_failures += 1
        pause = self.config.breaker_pause_s * 2 ** (engine.consecutive_failures - 1)
        engine.retry_at = asyncio.get_running_loop().time() + min(pause, self.config.breaker_max_pause_s)

    async def _half_open(self, engine: EngineRecord) -> None:
        """Try a failed engine whose pause is over: healthy, it registers again under its url (a new
        id, its weight version read afresh, as a restarted engine would); else it waits longer."""
        try:
            rejoined = await self.add_engine(engine.entry())
        except EngineAlreadyRegistered:  # registered again by hand meanwhile
            self.registry.forget(engine.engine_id)
        except EngineUnavailable as exc:
            self._open_breaker(engine)
            log.info("engine %d is still down (%s); next try in a while", engine.engine_id, exc)
        else:
            rejoined.consecutive_failures = engine.consecutive_failures
            log.info("engine %d rejoined as engine %d after its pause", engine.engine_id, rejoined.engine_id)

    async def health_loop(self) -> None:
        """Every `health_interval_s`: the engines' token rates, a health check of each live engine
        (retired after `health_failures_to_remove` failures in a row), and the breaker's retries."""
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
                *(within(e.client.health(), interval) for e in engines), return_exceptions=True
            )
            # a check that timed out while the manager's own loop was blocked (a big body parsed, a
            # starved CPU) says nothing about the engine: its answer may be waiting unread
            blocked = self._loop_watch is not None and self._loop_watch.blocked_since(checked_at)
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

    async def load_loop(self) -> None:
        """Ask every live engine what it holds, every `load_poll_interval_s` (see view.py)."""
        while True:
            await asyncio.sleep(self.config.load_poll_interval_s)
            engines = self.registry.live()
            await asyncio.gather(*(refresh_load(e, self.config.load_poll_interval_s) for e in engines))
