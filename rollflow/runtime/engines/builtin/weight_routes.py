"""The built-in engine's weights over HTTP: loading a new version and giving memory back.

    POST /update_weights_from_disk    {"model_path", "weight_version", "abort_all_requests"}
    POST /update_weights_from_safetensors?weight_version=N   body: safetensors bytes (all or some tensors)
    POST /update_weights_from_server  {"url", "weight_version", "codec", "transport"}: pull from a weight server
    POST /release_memory_occupation   {"tags": [...]|null}: abort running requests, drop the model and its caches
    POST /resume_memory_occupation    {"tags": [...]|null}: rebuild the model at the version it served
    GET  /is_sleeping                 {"is_sleeping", "released_tags", "weights_bytes", "cached_sequences"}

Every load is checked whole before anything is copied, and copied between two decode steps. With
tensor parallelism (tensor_parallel.py) an upload is split here and each rank is handed its slices,
while a pull makes every rank fetch only its own slices from the weight server; either way the
ranks commit together or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from rollflow.runtime.engines.builtin.edge import parse, require_memory
from rollflow.runtime.engines.builtin.tensor_parallel import Pull, RankGroup
from rollflow.runtime.engines.builtin.weights import (
    WeightChecker,
    read_safetensors_bytes,
    read_safetensors_path,
)
from rollflow.runtime.engines.builtin.worker import EngineFault, GenerationWorker
from rollflow.runtime.http.body import read_body
from rollflow.runtime.http.errors import BadRequest, error_response
from rollflow.runtime.weights import (
    LoadedWeights,
    UnknownVersionError,
    WeightPuller,
    WeightsError,
    WeightTransferError,
)
from rollflow.runtime.weights.slices import shard_state
from rollflow.runtime.wire.builtin import (
    MemoryOccupationBody,
    UpdateWeightsFromDiskBody,
    UpdateWeightsFromServerBody,
)

logger = logging.getLogger(__name__)

WEIGHTS_BODY_HEADROOM = 16 << 20
"""Safetensors header room above the served model's tensor bytes, for the weights upload route."""


class EngineWeights:
    """Loads new weights into one GenerationWorker (and its tensor-parallel ranks), and releases them."""

    def __init__(
        self,
        worker: GenerationWorker,
        checker: WeightChecker,
        pull_cache_dir: str | Path,
        pulled: LoadedWeights | None,
        max_body_bytes: int,
        tp: RankGroup | None = None,
        rank_checker: WeightChecker | None = None,
    ) -> None:
        """`checker` knows the whole model's tensors (what uploads hold); `rank_checker` rank 0's
        slices of them (what its pulls hold), the same when there is no `tp` group. `pulled` is
        the version the served weights are, exactly as published (rank 0's slices of it with
        `tp`), when the model folder came from a pull: the base of the next delta."""
        self._worker = worker
        self._checker = checker
        self._rank_checker = rank_checker or checker
        self._tp = tp
        self._weights_lock = asyncio.Lock()
        self._pull_lock = asyncio.Lock()
        self._pull_cache_dir = Path(pull_cache_dir)
        # the loaded weights as published (the delta base); None once anything else was loaded
        self._pulled = pulled
        self._max_body = max_body_bytes
        # the largest valid upload is every tensor of the served model
        self.max_upload_bytes = checker.max_upload_bytes + WEIGHTS_BODY_HEADROOM

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/update_weights_from_disk", self.update_weights_from_disk),
            web.post("/update_weights_from_safetensors", self.update_weights_from_safetensors),
            web.post("/update_weights_from_server", self.update_weights_from_server),
            web.post("/release_memory_occupation", self.release_memory_occupation),
            web.post("/resume_memory_occupation", self.resume_memory_occupation),
            web.get("/is_sleeping", self.is_sleeping),
        ]

    # ---- loads ----------------------------------------------------------------------------------
    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await parse(request, UpdateWeightsFromDiskBody, self._max_body)
        tensors = await asyncio.to_thread(read_safetensors_path, body.model_path)
        return await self._answer(
            self._load(tensors, body.weight_version, full=True, abort=body.abort_all_requests)
        )

    async def update_weights_from_safetensors(self, request: web.Request) -> web.Response:
        version_text = request.query.get("weight_version")
        try:
            version = None if version_text is None else int(version_text)
        except ValueError:
            raise BadRequest(f"weight_version must be an integer, got {version_text!r}") from None
        if version is not None and version < 0:
            raise BadRequest(f"weight_version must be >= 0, got {version}")
        tensors = read_safetensors_bytes(await read_body(request, self.max_upload_bytes))
        abort = request.query.get("abort_all_requests") == "true"
        return await self._answer(self._load(tensors, version, full=False, abort=abort))

    async def update_weights_from_server(self, request: web.Request) -> web.Response:
        """Pull a version (a delta against the last pulled one when the codec says so), verify
        all of it, then load it like a full checkpoint; a failed pull leaves the weights alone.
        With tensor parallelism every rank pulls its own slices at once, and they commit together."""
        body = await parse(request, UpdateWeightsFromServerBody, self._max_body)
        tp = self._tp
        async with self._pull_lock:
            base = self._pulled
            try:
                if tp is not None:
                    command = Pull(body.url, body.weight_version, body.codec, body.transport)
                    await asyncio.wrap_future(self._worker.run(lambda: tp.send(command)))
                tp_rank = (tp.tp_size, 0) if tp is not None else None
                async with WeightPuller(body.url, self._pull_cache_dir, transport=body.transport) as puller:
                    result = await puller.pull(body.weight_version, body.codec, base=base, tp=tp_rank)
            except asyncio.CancelledError:
                if tp is not None:  # the client left mid-pull: the other ranks drop their slices
                    self._worker.run(lambda: tp.commit("the pull was cancelled"))
                raise
            except (WeightsError, EngineFault) as exc:
                if tp is not None and not isinstance(exc, EngineFault):  # the other ranks drop theirs
                    why = str(exc)
                    with contextlib.suppress(EngineFault, WeightsError):
                        await asyncio.wrap_future(self._worker.run(lambda: tp.commit(why)))
                status = 404 if isinstance(exc, UnknownVersionError) else 400
                status = 502 if isinstance(exc, WeightTransferError | EngineFault) else status
                message = f"pulling weight version {body.weight_version} from {body.url} failed: {exc}"
                logger.warning("%s", message)
                return error_response(status, message)
            other_ranks: list[int | None] = []
            answer = await self._load(
                result.weights.state_dict,
                body.weight_version,
                full=True,
                abort=False,
                pulled=result.weights,
                other_ranks_nbytes=other_ranks,
            )
        if isinstance(answer, web.Response):
            return answer
        stats = result.stats
        by_rank = [stats.wire_nbytes, *other_ranks]
        logger.info(
            "pulled version %d (%s over %s, base %s): %d bytes for %d bytes of weights, %d attempts; "
            "bytes by tensor-parallel rank %s",
            body.weight_version,
            result.manifest.codec,
            stats.transport,
            result.manifest.base_version,
            stats.wire_nbytes,
            result.manifest.model_nbytes,
            stats.attempts,
            by_rank,
        )
        answer["pull"] = {
            "codec": result.manifest.codec,
            "transport": stats.transport,
            "base_version": result.manifest.base_version,
            "wire_nbytes": stats.wire_nbytes,
            "wire_nbytes_by_tp_rank": by_rank,
            "model_nbytes": result.manifest.model_nbytes,
            "chunks_downloaded": stats.chunks_downloaded,
            "chunks_reused": stats.chunks_reused,
            "attempts": stats.attempts,
            "fallback_reason": stats.fallback_reason,
        }
        return web.json_response(answer)

    async def _answer(self, load: Any) -> web.Response:
        answer = await load
        return answer if isinstance(answer, web.Response) else web.json_response(answer)

    async def _load(
        self,
        tensors: dict,
        version: int | None,
        full: bool,
        abort: bool,
        pulled: LoadedWeights | None = None,
        other_ranks_nbytes: list[int | None] | None = None,
    ) -> dict[str, Any] | web.Response:
        """Check and load `tensors`: rank 0's slices when `pulled` (each rank pulled its own), else
        whole tensors, split here for the ranks. A 502 when a rank could not take its slices.
        `other_ranks_nbytes` receives the bytes ranks 1..N-1 pulled, once they committed."""
        tp = self._tp
        checker = self._rank_checker if pulled is not None else self._checker
        checked = await asyncio.to_thread(checker.check, tensors, full)
        prepare = None
        if tp is not None:
            if pulled is None:
                shards = await asyncio.to_thread(
                    lambda: [shard_state(checked, tp.tp_size, r) for r in range(tp.tp_size)]
                )
                checked = shards[0]

                def prepare() -> None:
                    tp.stage(shards, full)
                    tp.commit(None)
            else:

                def prepare() -> None:
                    nbytes = tp.commit(None)
                    if other_ranks_nbytes is not None:
                        other_ranks_nbytes.extend(nbytes)

        async with self._weights_lock:
            require_memory(self._worker.released)
            new_version = self._worker.weight_version + 1 if version is None else version
            if abort:
                self._worker.abort_all("aborted for a weight update")
            try:
                await asyncio.wrap_future(self._worker.load_weights(checked, new_version, prepare))
            except (WeightTransferError, EngineFault) as exc:
                message = f"loading weight version {new_version} failed, the engine keeps version "
                message += f"{self._worker.weight_version}: {exc}"
                logger.warning("%s", message)
                return error_response(502, message)
            self._pulled = pulled
        return {"success": True, "message": f"loaded {len(checked)} tensors", "weight_version": new_version}

    # ---- memory occupation ------------------------------------------------------------------------
    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        body = await parse(request, MemoryOccupationBody, self._max_body, allow_empty=True)
        if not self._worker.can_release:
            raise BadRequest(
                "this engine cannot release its memory (it has no model folder to reload from, "
                "or it runs with tensor parallelism)"
            )
        tags = _memory_tags(body)
        async with self._weights_lock:
            await asyncio.wrap_future(self._worker.release_memory(tags, self._backup_path))
            if "weights" in tags:
                self._pulled = None  # the delta base is a copy of the weights: it goes too
        return web.json_response({"success": True, "message": f"released {', '.join(sorted(tags))}"})

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        body = await parse(request, MemoryOccupationBody, self._max_body, allow_empty=True)
        tags = _memory_tags(body)
        async with self._weights_lock:
            await asyncio.wrap_future(self._worker.resume_memory(tags, self._backup_path))
        return web.json_response(
            {
                "success": True,
                "message": f"resumed {', '.join(sorted(tags))}",
                "weight_version": self._worker.weight_version,
            }
        )

    async def is_sleeping(self, request: web.Request) -> web.Response:
        released = self._worker.released
        return web.json_response(
            {
                "is_sleeping": bool(released),
                "released_tags": sorted(released),
                "weights_bytes": self._worker.weights_bytes(),
                "cached_sequences": self._worker.num_cached_sequences(),
            }
        )

    @property
    def _backup_path(self) -> Path:
        return self._pull_cache_dir / "released-weights.safetensors"


def _memory_tags(body: MemoryOccupationBody) -> frozenset[str]:
    tags = frozenset(body.tags) if body.tags is not None else frozenset({"weights", "kv_cache"})
    return tags - {"cuda_graph"}
