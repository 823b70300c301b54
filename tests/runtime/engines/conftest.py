"""A tiny model made once per run (for every worker), one shared built-in engine serving it, and a
weight server of a test's own for the engines to pull from."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollflow.runtime.weights import WeightStore
from tests.once import made_once
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.launch.helpers import BackgroundWeightServer


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from rollflow.runtime.engines.tiny_model import TinyModelSpec, write_tiny_model

    return made_once(tmp_path_factory, "tiny", lambda folder: write_tiny_model(folder, TinyModelSpec(seed=0)))


@pytest.fixture(scope="session")
def engine(tiny_model: Path) -> Iterator[EngineProcess]:
    """Shared by tests that leave the engine as they found it (no weight loads, no pauses)."""
    process = EngineProcess(tiny_model)
    yield process
    process.stop()


@pytest.fixture
def weight_server(tmp_path: Path) -> Iterator[tuple[WeightStore, BackgroundWeightServer]]:
    """An empty weight store and its server on a free port; 16 KiB chunks, so that each of the tiny
    model's payloads (a tensor-parallel rank's slices included) spans several."""
    store = WeightStore(tmp_path / "store", chunk_bytes=16 * 1024)
    server = BackgroundWeightServer(store)
    yield store, server
    server.close()
