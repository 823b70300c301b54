"""Checkpoint folders <-> published versions: what `rollflow weights publish` / `pull` and the
trainer share, so a version published by either carries the same tensors and text files.

    publish_checkpoint(url, 3, "outputs/train/weights/v3", token)   # tensors + config.json, ...
    published_versions(url)                                         # (1, 2, 3)
    base = read_saved_weights("outputs/engine0")                    # what a pull left there, or None
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import safetensors.torch

from rollflow.runtime.weights.errors import WeightsError
from rollflow.runtime.weights.io import Manifest
from rollflow.runtime.weights.puller import SAVED_VERSION_FILE, LoadedWeights, WeightPuller
from rollflow.runtime.weights.tensors import StateDict

# small text files of a checkpoint folder that travel with its tensors
CHECKPOINT_TEXT_FILES = ("config.json", "generation_config.json")


def read_checkpoint(source: str | Path) -> tuple[StateDict, dict[str, str]]:
    """Tensors of a .safetensors file, or of every .safetensors file of a folder plus its text files."""
    path = Path(source)
    if path.is_file():
        tensor_files, folder = [path], None
    elif path.is_dir():
        tensor_files, folder = sorted(path.glob("*.safetensors")), path
    else:
        raise WeightsError(f"{source}: no such file or folder")
    if not tensor_files:
        raise WeightsError(f"{source}: no .safetensors file there")
    state = {}
    for file in tensor_files:
        state.update(safetensors.torch.load_file(str(file)))
    files = {}
    if folder is not None:
        files = {
            name: (folder / name).read_text() for name in CHECKPOINT_TEXT_FILES if (folder / name).is_file()
        }
    return state, files


def publish_checkpoint(url: str, version: int, source: str | Path, token: str | None = None) -> Manifest:
    """Upload a checkpoint (see `read_checkpoint`) to the weight server at `url` as `version`."""
    state, files = read_checkpoint(source)

    async def run() -> Manifest:
        with tempfile.TemporaryDirectory() as cache:
            async with WeightPuller(url, cache, token=token) as puller:
                return await puller.publish(version, state, files=files)

    return asyncio.run(run())


def published_versions(url: str) -> tuple[int, ...]:
    """Versions the weight server at `url` holds."""

    async def run() -> tuple[int, ...]:
        with tempfile.TemporaryDirectory() as cache:
            async with WeightPuller(url, cache) as puller:
                return (await puller.versions()).versions

    return asyncio.run(run())


def read_saved_weights(folder: str | Path) -> LoadedWeights | None:
    """The version `save_weights` left in `folder`, exactly as published (the base of a delta
    pull), or None when the folder holds no pulled version."""
    folder = Path(folder)
    marker, tensors = folder / SAVED_VERSION_FILE, folder / "model.safetensors"
    if not (marker.is_file() and tensors.is_file()):
        return None
    version = json.loads(marker.read_text())["version"]
    return LoadedWeights(version, safetensors.torch.load_file(str(tensors)))
