"""`parallelism: fsdp` with `weights_transport: mooncake`: each rank lends its own shard, no rank gathers.

Without this, a weight version under FSDP is gathered whole on rank 0 (sharded.full_state_dict) and
uploaded to the weight server, which copies it into its Mooncake memory: rank 0 holds the whole
model, and every byte passes through two more processes. Here, at each version rank 0 tells every
rank to export: each encodes its own rows of every tensor (FSDP2 shards dimension 0) into memory
registered with its own Mooncake TransferEngine (weights/shards.py), and answers where they lie;
rank 0 merges the answers into one manifest and puts it on the weight server (PUT /v1/sharded/N).
An engine told to pull version N over Mooncake reads each block straight from the rank that holds
it. A rank keeps its last two versions registered (an engine may still be reading the older).

Every rank must be able to start a TransferEngine; where one cannot (the package does not import,
the engine does not start), rank 0 says which and why, and versions are gathered on rank 0 and
published whole, as without Mooncake.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass

import torch
from torch import nn

from rollflow.errors import UserError
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.distributed import DataParallel
from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.mooncake import Unavailable, load_engine
from rollflow.runtime.weights.shards import RankExport, ShardedManifest, ShardExporter
from rollflow.runtime.weights.token import publish_token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportShards:
    """Rank 0 to every rank: export your rows of `version` and answer where they lie."""

    version: int


class RankShards:
    """This rank's exporter, and (rank 0) the merge and publish of each version's manifest."""

    def __init__(self, parallel: DataParallel, exporter: ShardExporter, config: TrainConfig) -> None:
        self.parallel = parallel
        self.exporter = exporter
        self.config = config
        self.exported_nbytes = 0  # bytes of this rank's rows exported, over all versions

    def export(self, policy: nn.Module, version: int) -> RankExport:
        """Every rank: register this rank's rows of `policy` as `version`."""
        export = self.exporter.export(version, local_rows(policy, self.parallel.rank))
        self.exported_nbytes += export.nbytes
        return export

    def publish(self, policy: nn.Module, version: int) -> ShardedManifest:
        """Rank 0: have every rank export `version`, then put the merged manifest on the weight server."""
        self.parallel.tell_all(ExportShards(version))
        exports = self.parallel.gather(self.export(policy, version))
        manifest = ShardedManifest.merge(version, self.exporter.codec, exports, _text_files(policy))
        _put_manifest(self.config.weights_url, manifest)
        log.info(
            "weight version %d held by %d ranks (rows bytes per rank %s of %d; none gathered), manifest on %s",
            version,
            len(exports),
            [e.nbytes for e in exports],
            manifest.model_nbytes,
            self.config.weights_url,
        )
        return manifest


def start_rank_shards(
    config: TrainConfig, parallel: DataParallel | None, policy: nn.Module
) -> RankShards | None:
    """Collective (every rank, at the same point): this rank's RankShards when versions are to be
    read from the ranks (fsdp, mooncake, a weight server), None otherwise or where a rank cannot
    use Mooncake (rank 0 logs which and why)."""
    if (
        parallel is None
        or not parallel.sharded
        or config.weights_transport != "mooncake"
        or config.weights_url is None
    ):
        return None
    engine = load_engine(config.mooncake_host, config.mooncake_protocol)
    why = engine.reason if isinstance(engine, Unavailable) else None
    reasons = parallel.gather(why)
    failed = parallel.broadcast([f"rank {rank}: {r}" for rank, r in enumerate(reasons) if r is not None])
    if failed:
        if parallel.is_leader:
            log.warning(
                "weights_transport mooncake: not every rank can export its shard (%s); each version is "
                "gathered on rank 0 and published to the weight server whole",
                "; ".join(failed),
            )
        return None
    exporter = ShardExporter(engine, parallel.rank, CodecSpec.parse(config.weights_codec))
    if parallel.is_leader:
        log.info("weights_transport mooncake: each rank exports its own shard of every version")
    return RankShards(parallel, exporter, config)


def local_rows(module: nn.Module, rank: int) -> dict[str, tuple[torch.Tensor, int, tuple[int, ...]]]:
    """This rank's rows of every tensor of `module`'s state: name -> (rows, first row, whole shape).

    FSDP2 leaves each parameter a DTensor sharded on dimension 0; buffers are whole on every rank
    and exported by rank 0. Tied tensors (one parameter under two names) are exported once: loading
    either name sets both in an engine."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    rows: dict[str, tuple[torch.Tensor, int, tuple[int, ...]]] = {}
    seen: set[int] = set()
    for name, value in module.state_dict(keep_vars=True).items():
        if id(value) in seen:
            continue
        seen.add(id(value))
        if not isinstance(value, DTensor):
            if rank == 0:
                rows[name] = (value.detach(), 0, tuple(value.shape))
            continue
        if tuple(value.placements) != (Shard(0),):
            raise UserError(f"{name} is placed {value.placements}; exporting shards needs FSDP's Shard(0)")
        shape = tuple(value.shape)
        local_shape, offset = compute_local_shape_and_global_offset(
            shape, value.device_mesh, value.placements
        )
        local = value.to_local().detach()
        if tuple(local.shape) != tuple(local_shape):
            raise UserError(
                f"{name}: this rank holds {list(local.shape)}, FSDP's split says {list(local_shape)}"
            )
        rows[name] = (local, offset[0] if shape else 0, shape)
    return rows


def _text_files(policy: nn.Module) -> dict[str, str]:
    """config.json (what makes a pulled version a loadable checkpoint), as save_pretrained writes it."""
    config = getattr(policy, "config", None)
    return {"config.json": config.to_json_string()} if config is not None else {}


def _put_manifest(url: str, manifest: ShardedManifest) -> None:
    token = publish_token()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/sharded/{manifest.version}",
        data=manifest.to_json().encode(),
        method="PUT",
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    try:
        with urllib.request.urlopen(request, timeout=300):
            pass
    except urllib.error.HTTPError as exc:
        raise UserError(
            f"the weight server at {url} refused version {manifest.version}'s manifest "
            f"({exc.code}): {exc.read().decode(errors='replace')[:500]}"
        ) from None
    except OSError as exc:
        raise UserError(f"the weight server at {url} did not answer: {exc}") from None
