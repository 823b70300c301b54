"""`rollflow weights ...`: serve a weight store, publish to it, pull from it.

The publish token is read from the environment (ROLLFLOW_WEIGHTS_TOKEN by default), never
from a flag, so it does not show in `ps`.
"""

from __future__ import annotations

import argparse
import sys

from rollflow.cli_util import add_command, add_listen_arguments
from rollflow.runtime.http import limits
from rollflow.runtime.weights.token import TOKEN_ENV, publish_token

EXAMPLES = """examples:
  rollflow weights serve --dir outputs/weights --port 8650
  rollflow weights publish --url http://127.0.0.1:8650 --version 1 --from path/to/hf_checkpoint/
  rollflow weights versions --url http://127.0.0.1:8650
  rollflow weights pull --url http://127.0.0.1:8650 --out outputs/engine0 --codec int8+zstd
  rollflow weights pull --url http://127.0.0.1:8650 --out outputs/engine0 --codec delta+zstd
"""


def register(group: argparse.ArgumentParser) -> None:
    serve = add_command(group, "serve", _serve)
    serve.add_argument("--dir", required=True, help="weight store folder")
    add_listen_arguments(serve, 8650)
    serve.add_argument(
        "--keep-versions", type=int, default=4, help="newest versions kept for deltas (default: 4)"
    )
    serve.add_argument(
        "--insecure-open-publish",
        action="store_true",
        help=f"without ${TOKEN_ENV}, let anyone who can reach the server publish (default: refuse)",
    )
    serve.add_argument(
        "--max-upload-gb", type=float, default=64.0, help="largest publish upload in GiB (default: 64)"
    )
    limits.add_arguments(serve, body_timeout_s=limits.DEFAULT_UPLOAD_TIMEOUT_S)
    serve.add_argument("--chunk-mb", type=float, default=4.0, help="payload chunk size in MiB (default: 4)")
    serve.add_argument(
        "--mooncake",
        choices=("tcp", "rdma"),
        help="also let engines read payload chunks over Mooncake's transfer engine with this protocol "
        "(weights_transport: mooncake); where Mooncake cannot start, the server says why and serves HTTP only",
    )
    serve.add_argument(
        "--mooncake-host",
        help="address engines reach this server's Mooncake engine at (default: --host; set it when --host is 0.0.0.0)",
    )

    publish = add_command(group, "publish", _publish)
    publish.add_argument("--url", required=True, help="weight server URL")
    publish.add_argument(
        "--version", type=int, required=True, help="version number (greater than the latest)"
    )
    publish.add_argument(
        "--from", dest="source", required=True, help=".safetensors file or checkpoint folder"
    )

    versions = add_command(group, "versions", _versions)
    versions.add_argument("--url", required=True, help="weight server URL")

    pull = add_command(group, "pull", _pull)
    pull.add_argument("--url", required=True, help="weight server URL")
    pull.add_argument("--out", required=True, help="output folder")
    pull.add_argument("--version", type=int, help="version to pull (default: the latest)")
    pull.add_argument(
        "--codec",
        default="zstd",
        help="raw, zstd, int8, int8+zstd (lossy, per-channel int8), delta, delta+zstd (only what changed "
        "since the version already in --out); default: zstd",
    )
    pull.add_argument("--cache-dir", help="where partial pulls are kept (default: OUT/.partial)")
    pull.add_argument(
        "--transport",
        choices=("http", "mooncake"),
        default="http",
        help="how the chunks travel: http, or mooncake from a server started with --mooncake (http, "
        "saying why, where Mooncake cannot be used); default: http",
    )


def _serve(args: argparse.Namespace, started_at: float) -> None:
    """serve a weight store folder over HTTP

    Serve the versions in --dir to pullers (creating the folder if needed). Publishing over HTTP
    needs the bearer token in $ROLLFLOW_WEIGHTS_TOKEN; without it the server takes no publishes
    unless started with --insecure-open-publish.

    example: rollflow weights serve --dir outputs/weights --port 8650
    """
    import asyncio

    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.signals import run_until_sigterm
    from rollflow.runtime.weights.server import WeightServer
    from rollflow.runtime.weights.store import WeightStore

    store = WeightStore(
        args.dir, keep_versions=args.keep_versions, chunk_bytes=int(args.chunk_mb * (1 << 20))
    )
    setup_logging("text")
    mooncake = _mooncake(args) if args.mooncake else None
    server = WeightServer(
        store,
        host=args.host,
        port=args.port,
        token=publish_token(),
        open_publish=args.insecure_open_publish,
        max_upload_bytes=int(args.max_upload_gb * (1 << 30)),
        body_limits=limits.from_arguments(args),
        mooncake=mooncake,
    )

    async def run() -> None:
        url = await server.start()
        print(
            f"serving weight store {args.dir} on {url} (latest version: {store.versions().latest})",
            flush=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    run_until_sigterm(run)


def _mooncake(args: argparse.Namespace):
    """The exporter of the server's Mooncake engine, or why there is none (logged, and told to pullers)."""
    import logging

    from rollflow.runtime.weights.mooncake import PayloadExporter, Unavailable, load_engine

    engine = load_engine(args.mooncake_host or args.host, args.mooncake)
    if isinstance(engine, Unavailable):
        logging.getLogger(__name__).warning(
            "mooncake unavailable, serving weights over http only: %s", engine.reason
        )
        return engine.reason
    print(f"mooncake {args.mooncake} transfer engine at {engine.session}", flush=True)
    return PayloadExporter(engine)


def _publish(args: argparse.Namespace, started_at: float) -> None:
    """upload a version to a weight server

    Upload the tensors of a .safetensors file, or of every .safetensors file in a checkpoint folder
    (with its config.json and generation_config.json), as --version.

    example: rollflow weights publish --url http://127.0.0.1:8650 --version 3 --from ckpt/
    """
    from rollflow.runtime.weights.checkpoint import publish_checkpoint

    manifest = publish_checkpoint(args.url, args.version, args.source, publish_token())
    print(
        f"published version {manifest.version}: {len(manifest.tensors)} tensors, {manifest.model_nbytes:,} bytes"
    )


def _versions(args: argparse.Namespace, started_at: float) -> None:
    """list the versions a weight server holds

    example: rollflow weights versions --url http://127.0.0.1:8650
    """
    import asyncio
    import tempfile

    from rollflow.runtime.weights.puller import WeightPuller

    async def run():
        with tempfile.TemporaryDirectory() as cache:
            async with WeightPuller(args.url, cache) as puller:
                return await puller.versions()

    held = asyncio.run(run())
    print(f"versions: {', '.join(map(str, held.versions)) or 'none'} (latest: {held.latest})")


def _pull(args: argparse.Namespace, started_at: float) -> None:
    """pull a version into a checkpoint folder

    Fetch, verify and decode a version; writes model.safetensors, the published text files and
    rollflow_weights.json to --out. An interrupted pull resumes from the chunks kept in
    --cache-dir.

    example: rollflow weights pull --url http://127.0.0.1:8650 --out outputs/engine0 --codec zstd
    """
    import asyncio
    from pathlib import Path

    from rollflow.runtime.weights.checkpoint import read_saved_weights
    from rollflow.runtime.weights.puller import WeightPuller, save_weights

    cache = Path(args.cache_dir) if args.cache_dir else Path(args.out) / ".partial"
    base = read_saved_weights(args.out) if "delta" in args.codec else None
    with _ChunkProgress() as progress:

        async def run():
            async with WeightPuller(
                args.url, cache, on_chunk=progress.update, transport=args.transport
            ) as puller:
                return await puller.pull(args.version, args.codec, base=base)

        result = asyncio.run(run())
    save_weights(result.weights, args.out)
    if not args.cache_dir and not any(cache.iterdir()):
        cache.rmdir()
    stats = result.stats
    print(
        f"pulled version {result.weights.version} ({result.manifest.codec} over {stats.transport}) into {args.out}: "
        f"{stats.wire_nbytes:,} bytes downloaded for {result.manifest.model_nbytes:,} bytes of weights, "
        f"{stats.chunks_reused} chunks resumed, {stats.seconds:.2f} s"
    )


class _ChunkProgress:
    """A rich progress bar over chunks when stdout is a terminal; silent otherwise."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def __enter__(self) -> _ChunkProgress:
        if sys.stdout.isatty():
            from rich.progress import Progress

            self.progress = Progress(transient=True)
            self.progress.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, done: int, total: int) -> None:
        if self.progress is None:
            return
        if self.task is None:
            self.task = self.progress.add_task("pulling weights", total=total)
        self.progress.update(self.task, completed=done, total=total)
