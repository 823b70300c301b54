"""HTTP front of a WeightStore (aiohttp), bound to 127.0.0.1 unless told otherwise.

    GET  /v1/versions[?newer_than=N&wait_s=S]   {"versions": [...], "latest": N}; waits up to S
                                                seconds for a version newer than N (how an
                                                engine is "told" without the trainer knowing it)
    GET  /v1/manifest?version=N|latest&codec=C[&base=B][&tp_size=T&tp_rank=R]
                                  the payload's manifest (builds it); with tp_size, the payload
                                  holds only rank R's slices for T-way tensor parallelism
    GET  /v1/payloads/{payload_id}/chunks/{index}         one chunk's wire bytes
    GET  /v1/payloads/{payload_id}/mooncake   where the payload's chunks lie in this server's
                                  Mooncake-registered memory ({"session", "chunks": [{"index",
                                  "address", "nbytes"}]}); 409 when it serves no Mooncake
    PUT  /v1/sharded/{version}    body: a sharded manifest (shards.py): a version the trainer
                                  ranks hold and engines read from them over Mooncake; needs
                                  the token; /v1/versions lists it from then on
    GET  /v1/sharded/{version}|latest   that manifest (404 when no ranks hold the version)
    PUT  /v1/versions/{version}   body: a safetensors file (small text files as JSON in its
                                  metadata under "rollflow.files"); needs the bearer token
                                  (refused when the server has none, unless open_publish)
    GET  /health                  (also /healthz, its older name)

Payload builds and publishes run in a worker thread, so chunk downloads keep flowing while a
new payload is encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import safetensors.torch
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollflow.runtime.deadline import within
from rollflow.runtime.http.auth import require_bearer
from rollflow.runtime.http.body import iter_body
from rollflow.runtime.http.errors import errors_as_json, http_error, too_large
from rollflow.runtime.http.limits import UPLOAD_LIMITS, BodyLimits
from rollflow.runtime.http.listen import bind
from rollflow.runtime.http.serve import GuardedRunner
from rollflow.runtime.weights.errors import UnknownVersionError, WeightsError
from rollflow.runtime.weights.io import VersionList
from rollflow.runtime.weights.mooncake import PayloadExporter
from rollflow.runtime.weights.shards import ShardedManifest
from rollflow.runtime.weights.store import MAX_VERSION, WeightStore
from rollflow.runtime.weights.token import TOKEN_ENV

logger = logging.getLogger(__name__)

MAX_WAIT_S = 300.0
MAX_UPLOAD_BYTES = 64 << 30
MAX_SHARDED_MANIFEST_BYTES = 256 << 20  # a few hundred bytes per 4 MiB block: a 1 TB model's fits
"""Default limit of a publish upload (a 16B-parameter bf16 model is 32 GiB); 413 above it."""
FILES_METADATA_KEY = "rollflow.files"
_POLL_S = 0.1


class VersionsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    newer_than: int | None = None
    """Wait for a version greater than this one."""
    wait_s: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)
    """How long to wait for it before answering with what is held."""


class ManifestQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int | None = None
    """Version to fetch; absent or "latest" for the newest."""
    codec: str = "zstd"
    """Codec name, e.g. raw, zstd, int8+zstd, delta+zstd."""
    base: int | None = None
    """Version the puller holds, for delta codecs."""
    tp_size: int = Field(default=1, ge=1)
    """Ranks of the tensor-parallel engine pulling; above 1 the payload holds one rank's slices."""
    tp_rank: int = Field(default=0, ge=0)
    """The rank whose slices (rollflow.runtime.weights.slices) the payload holds."""


@dataclass(eq=False)
class WeightServer:
    """Serves one store over HTTP; `await start()`, then pullers use `url`, then `await stop()`.

    `port=0` picks a free port. Publishing needs `Authorization: Bearer <token>`; a server without a
    token refuses publishes, unless `open_publish` lets anyone who can reach `host` publish (what
    `--insecure-open-publish` asks for). `body_limits`: how slowly an upload may come before its
    connection is closed (rollflow.runtime.http.limits). `mooncake`: the exporter that lets pullers
    read chunks over Mooncake, or why there is none (a 409 tells them)."""

    store: WeightStore
    _: KW_ONLY
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = field(default=None, repr=False)
    open_publish: bool = False
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    body_limits: BodyLimits = UPLOAD_LIMITS
    mooncake: PayloadExporter | str | None = None
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)
    _new_version: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def build_app(self) -> web.Application:
        # store errors: an unknown version is a 404, anything else the caller got wrong a 400
        errors = errors_as_json({UnknownVersionError: 404, WeightsError: 400})
        # publishes stream to disk under their own limit; no other route takes a body
        app = web.Application(client_max_size=1 << 20, middlewares=[errors])
        app.add_routes(
            [
                web.get("/health", self._health),
                web.get("/healthz", self._health),
                web.get("/v1/versions", self._versions),
                web.put("/v1/versions/{version}", self._publish),
                web.get("/v1/manifest", self._manifest),
                web.get("/v1/payloads/{payload_id}/chunks/{index}", self._chunk),
                web.get("/v1/payloads/{payload_id}/mooncake", self._mooncake_location),
                web.put("/v1/sharded/{version}", self._publish_sharded),
                web.get("/v1/sharded/{version}", self._sharded),
            ]
        )
        return app

    async def start(self) -> str:
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._runner = GuardedRunner(self.build_app(), self.body_limits, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        logger.info("weight server on %s serving %s", self.url, self.store.root)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if isinstance(self.mooncake, PayloadExporter):
            self.mooncake.close()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _versions(self, request: web.Request) -> web.Response:
        query = _parse(VersionsQuery, request)
        deadline = time.monotonic() + query.wait_s
        held = self._held()
        while query.newer_than is not None and (held.latest or -1) <= query.newer_than:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._new_version.clear()
            # a publish through this server wakes us at once; one from another process is polled
            with contextlib.suppress(TimeoutError):
                await within(self._new_version.wait(), min(remaining, _POLL_S))
            held = self._held()
        return web.json_response({"versions": list(held.versions), "latest": held.latest})

    def _held(self) -> VersionList:
        """Versions engines can pull: the store's, and those trainer ranks hold (sharded)."""
        both = set(self.store.versions().versions) | set(self.store.sharded_versions().versions)
        return VersionList(tuple(sorted(both)))

    async def _manifest(self, request: web.Request) -> web.Response:
        query = _parse(ManifestQuery, request)
        held, sharded = self.store.versions().versions, self.store.sharded_versions().versions
        if query.version is not None and query.version not in held and query.version in sharded:
            raise UnknownVersionError(
                f"weight version {query.version} is held by the trainer ranks, not this server: "
                "pull it with transport mooncake (GET /v1/sharded/{version})"
            )
        manifest = await asyncio.to_thread(
            self.store.manifest, query.version, query.codec, query.base, (query.tp_size, query.tp_rank)
        )
        return web.Response(body=manifest.to_json().encode(), content_type="application/json")

    async def _chunk(self, request: web.Request) -> web.StreamResponse:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            raise http_error(web.HTTPBadRequest, "chunk index must be an integer") from None
        return web.FileResponse(self.store.chunk_path(request.match_info["payload_id"], index))

    async def _mooncake_location(self, request: web.Request) -> web.Response:
        if not isinstance(self.mooncake, PayloadExporter):
            why = self.mooncake or "it was started without --mooncake"
            raise http_error(web.HTTPConflict, f"this weight server serves no Mooncake transport: {why}")
        paths = self.store.chunk_paths(request.match_info["payload_id"])
        location = await asyncio.to_thread(self.mooncake.export, request.match_info["payload_id"], paths)
        return web.json_response(location.to_json())

    async def _sharded(self, request: web.Request) -> web.Response:
        text = request.match_info["version"]
        try:
            version = None if text == "latest" else int(text)
        except ValueError:
            raise http_error(web.HTTPBadRequest, "version must be an integer or latest") from None
        manifest = await asyncio.to_thread(self.store.sharded, version)
        return web.Response(body=manifest.to_json().encode(), content_type="application/json")

    async def _publish_sharded(self, request: web.Request) -> web.Response:
        self._check_token(request)
        version = _path_version(request)
        body = bytearray()
        async for block in iter_body(request, 1 << 20):
            body += block
            if len(body) > MAX_SHARDED_MANIFEST_BYTES:
                raise too_large("the sharded manifest", len(body), MAX_SHARDED_MANIFEST_BYTES)
        manifest = ShardedManifest.from_json(bytes(body))
        if manifest.version != version:
            raise http_error(
                web.HTTPBadRequest, f"the manifest is of version {manifest.version}, not {version}"
            )
        await asyncio.to_thread(self.store.publish_sharded, manifest)
        self._new_version.set()
        return web.json_response({"version": version, "tensors": len(manifest.tensors)})

    async def _publish(self, request: web.Request) -> web.Response:
        self._check_token(request)
        version = _path_version(request)
        if not 0 <= version <= MAX_VERSION:
            raise http_error(web.HTTPBadRequest, f"version {version} is outside 0..{MAX_VERSION}")
        with tempfile.NamedTemporaryFile(dir=self.store.root / "tmp", suffix=".safetensors") as upload:
            declared = request.content_length
            if declared is not None and declared > self.max_upload_bytes:
                raise too_large("the upload", declared, self.max_upload_bytes, " (--max-upload-gb)")
            size = 0
            async for block in iter_body(request, 1 << 20):
                size += len(block)
                if size > self.max_upload_bytes:
                    raise too_large("the upload", size, self.max_upload_bytes, " (--max-upload-gb)")
                upload.write(block)
            upload.flush()
            manifest = await asyncio.to_thread(_publish_file, self.store, version, Path(upload.name))
        self._new_version.set()
        return web.Response(body=manifest.to_json().encode(), content_type="application/json")

    def _check_token(self, request: web.Request) -> None:
        if self.token is None:
            if self.open_publish:
                return
            raise http_error(
                web.HTTPForbidden,
                "this weight server takes no publishes: start it with a token "
                f"(${TOKEN_ENV}) or with --insecure-open-publish",
            )
        require_bearer(request, self.token, "publishing")


def _path_version(request: web.Request) -> int:
    """The version a publish's path names (a 400 unless it is an integer)."""
    try:
        return int(request.match_info["version"])
    except ValueError:
        raise http_error(web.HTTPBadRequest, "version must be an integer") from None


def _publish_file(store: WeightStore, version: int, path: Path):
    """Publish an uploaded safetensors file; its metadata may carry the small text files."""
    try:
        state = safetensors.torch.load_file(str(path))
        with safetensors.safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for a bad header
        raise WeightsError(f"upload is not a safetensors file: {exc}") from None
    return store.publish(version, state, files=_published_files(metadata))


def _published_files(metadata: dict[str, str]) -> dict[str, str]:
    """The text files an upload's metadata carries under "rollflow.files": a JSON object of file
    name -> text (a 400 naming what is wrong otherwise; the store checks the names)."""
    raw = metadata.get(FILES_METADATA_KEY, "{}")
    try:
        files = json.loads(raw)
    except ValueError as exc:
        raise WeightsError(f'metadata "{FILES_METADATA_KEY}" is not JSON ({exc})') from None
    if not isinstance(files, dict):
        raise WeightsError(
            f'metadata "{FILES_METADATA_KEY}" must be a JSON object of file name -> text, '
            f"not a JSON {type(files).__name__}"
        )
    bad = next((name for name, text in files.items() if not isinstance(text, str)), None)
    if bad is not None:
        raise WeightsError(
            f'metadata "{FILES_METADATA_KEY}": file {bad!r} holds a JSON {type(files[bad]).__name__}, '
            "not text"
        )
    return files


def _parse(model: type[BaseModel], request: web.Request):
    raw = {k: v for k, v in request.query.items() if not (k == "version" and v == "latest")}
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise http_error(web.HTTPBadRequest, f"{where}: {error['msg']}") from None
