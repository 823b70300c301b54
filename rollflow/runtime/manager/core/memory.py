"""Engines that give their device back: drain, release memory, and later wake and rejoin.

Releasing an engine (a device moving to the trainer within a step):

    healthy -> releasing: out of routing; its running samples end their attempts and go back to
               the front of the queue with their tokens (the resume path a failed engine's samples
               take: nothing is regenerated)
            -> released: the engine freed its memory (SGLang `/release_memory_occupation`, vLLM
               `/sleep`, the built-in engine drops its model); it stays up, out of the pool
    released -> resuming -> (updating: loads the newest weight version) -> healthy

An engine that answers but will not sleep goes back into the pool (`EngineWontSleep`); one that
cannot be reached while releasing or waking is retired as failed, its samples already moved.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from rollflow.errors import UserError
from rollflow.runtime.deadline import within
from rollflow.runtime.engines.base import EngineRejectedError, NotSupportedError
from rollflow.runtime.engines.http import ENGINE_ERRORS
from rollflow.runtime.manager.core.fleet import EngineUnavailable
from rollflow.runtime.manager.core.registry import EngineRecord
from rollflow.runtime.manager.core.service import RolloutManager

ADMIN_PATHS = ("/release_memory_occupation", "/resume_memory_occupation")
"""Fan-outs that put every engine to sleep or wake it: admin routes, behind the token."""

log = logging.getLogger("rollflow.manager")

RELEASE_REASON = "engine_released"


class EngineNotReleasable(UserError):
    """The engine is not in a state that allows this move (e.g. releasing one already released)."""


class EngineWontSleep(UserError):
    """The engine answered but refused to free its memory; it went back into the pool."""


class WeightSourceUnavailable(UserError):
    """The weight server named for a resume did not say which version is the newest."""


@dataclass(frozen=True)
class WeightSource:
    """Where a waking engine gets the newest weights: a folder it reads or a weight server."""

    weight_version: int | None  # None: the newest the weight server holds (weights_url only)
    model_path: str | None = None
    weights_url: str | None = None
    codec: str | None = None
    transport: str | None = None  # http or mooncake (weights_url only); None: the engine's default


@dataclass(frozen=True)
class MemoryMove:
    """One release or resume, as the executor logs it."""

    engine_id: int
    kind: str  # "release" or "resume"
    samples_moved: int  # samples that left the engine to resume elsewhere (release)
    drain_s: float  # until every moved sample had left the engine
    seconds: float  # the whole move, drain included
    weight_version: int | None  # what the engine serves after a resume

    def to_json(self) -> dict:
        return {
            "engine_id": self.engine_id,
            "kind": self.kind,
            "samples_moved": self.samples_moved,
            "drain_s": round(self.drain_s, 4),
            "seconds": round(self.seconds, 4),
            "weight_version": self.weight_version,
        }


def _engine(manager: RolloutManager, engine_id: int, state: str) -> EngineRecord:
    engine = manager.registry.get(engine_id)
    if engine is None:
        raise KeyError(engine_id)
    if engine.state != state:
        raise EngineNotReleasable(f"engine {engine_id} is {engine.state}, not {state}")
    return engine


async def release_engine(manager: RolloutManager, engine_id: int) -> MemoryMove:
    """Drain a healthy engine (its samples resume elsewhere from their tokens) and free its memory."""
    loop = asyncio.get_running_loop()
    engine = _engine(manager, engine_id, "healthy")
    started = loop.time()
    engine.state = "releasing"
    moved = await manager.drain_engine(engine, RELEASE_REASON)
    drained = loop.time()
    try:
        await within(engine.client.release_memory_occupation(), manager.config.stall_timeout_s)
    except (NotSupportedError, EngineRejectedError) as exc:
        engine.state = "healthy"
        manager.dispatcher.wake()
        log.warning("engine %d will not release its memory (%s); it stays in the pool", engine_id, exc)
        raise EngineWontSleep(f"engine {engine_id} will not release its memory: {exc}") from None
    except (*ENGINE_ERRORS, TimeoutError) as exc:
        manager.fleet.retire(engine, "release_failed")
        log.warning(
            "engine %d failed while releasing its memory (%s); its %d samples had already moved",
            engine_id,
            exc or type(exc).__name__,
            moved,
        )
        raise EngineUnavailable(f"engine {engine_id} failed while releasing its memory: {exc}") from None
    engine.state = "released"
    move = MemoryMove(engine_id, "release", moved, drained - started, loop.time() - started, None)
    log.info(
        "engine %d released: %d samples moved in %.3fs, memory freed in %.3fs",
        engine_id,
        moved,
        move.drain_s,
        move.seconds - move.drain_s,
    )
    return move


async def resume_engine(
    manager: RolloutManager, engine_id: int, weights: WeightSource | None = None
) -> MemoryMove:
    """Wake a released engine, load `weights` when it serves an older version, and route to it again."""
    loop = asyncio.get_running_loop()
    engine = _engine(manager, engine_id, "released")
    started = loop.time()
    target = await _target_version(manager, weights)
    engine.state = "resuming"
    try:
        await within(engine.client.resume_memory_occupation(), manager.config.stall_timeout_s)
        engine.weight_version = await within(engine.client.weight_version(), manager.config.connect_timeout_s)
    except (*ENGINE_ERRORS, TimeoutError) as exc:
        manager.fleet.retire(engine, "resume_failed")
        raise EngineUnavailable(f"engine {engine_id} failed to wake: {exc or type(exc).__name__}") from None
    if weights is not None and target is not None and engine.weight_version != target:
        engine.state = "updating"
        await manager.fleet.update_engine_weights(
            engine_id,
            target,
            model_path=weights.model_path,
            weights_url=weights.weights_url,
            codec=weights.codec,
            transport=weights.transport,
        )
    engine.state = "healthy"
    manager.dispatcher.wake()
    move = MemoryMove(engine_id, "resume", 0, 0.0, loop.time() - started, engine.weight_version)
    log.info(
        "engine %d resumed on weight version %s in %.3fs", engine_id, engine.weight_version, move.seconds
    )
    return move


async def _target_version(manager: RolloutManager, weights: WeightSource | None) -> int | None:
    """The version to load: the one named, else the newest the weight server holds."""
    if weights is None or weights.weight_version is not None:
        return None if weights is None else weights.weight_version
    url = f"{weights.weights_url.rstrip('/')}/v1/versions"
    timeout = aiohttp.ClientTimeout(total=manager.config.connect_timeout_s)
    try:
        async with manager.http.get(url, timeout=timeout) as resp:
            resp.raise_for_status()
            latest = (await resp.json())["latest"]
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightSourceUnavailable(f"cannot read the newest version from {url}: {exc!r}") from None
    if not isinstance(latest, int):
        raise WeightSourceUnavailable(f"{url} holds no published version yet")
    return latest


async def release_all(manager: RolloutManager) -> list[MemoryMove | str]:
    """Release every healthy engine at once (what sgl-router's `/release_memory_occupation` fans out)."""
    ids = [e.engine_id for e in manager.registry.live() if e.state == "healthy"]
    return await _each(release_engine(manager, engine_id) for engine_id in ids)


async def resume_all(manager: RolloutManager, weights: WeightSource | None = None) -> list[MemoryMove | str]:
    ids = [e.engine_id for e in manager.registry.all() if e.state == "released"]
    return await _each(resume_engine(manager, engine_id, weights) for engine_id in ids)


async def _each(moves) -> list[MemoryMove | str]:
    """Every move's record, or the message of the error it ended with."""
    results = await asyncio.gather(*moves, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, (UserError, KeyError)):
            raise result
    return [r if isinstance(r, MemoryMove) else str(r) for r in results]
