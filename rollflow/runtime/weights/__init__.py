"""Versioned weights that engines pull: store, codecs, HTTP server and resumable puller.

store = WeightStore("ckpt/weights")                  # trainer side
store.publish(7, model.state_dict())
server = WeightServer(store); await server.start()   # 127.0.0.1, a free port

async with WeightPuller(server.url, "cache/") as puller:   # engine side
    result = await puller.pull(codec="delta+zstd", base=current)
    model.load_state_dict(result.weights.state_dict); current = result.weights
"""

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import (
    CodecError,
    UnknownVersionError,
    WeightIntegrityError,
    WeightsError,
    WeightTransferError,
)
from rollflow.runtime.weights.io import ChunkEntry, Manifest, TensorEntry, VersionList
from rollflow.runtime.weights.puller import LoadedWeights, PullResult, PullStats, WeightPuller, save_weights
from rollflow.runtime.weights.server import WeightServer
from rollflow.runtime.weights.store import WeightStore
from rollflow.runtime.weights.tensors import state_digest

__all__ = [
    "ChunkEntry",
    "CodecError",
    "CodecSpec",
    "LoadedWeights",
    "Manifest",
    "PullResult",
    "PullStats",
    "TensorEntry",
    "UnknownVersionError",
    "VersionList",
    "WeightIntegrityError",
    "WeightPuller",
    "WeightServer",
    "WeightStore",
    "WeightTransferError",
    "WeightsError",
    "save_weights",
    "state_digest",
]
