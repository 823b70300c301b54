"""A tiny model made once per run (for every worker) and one shared built-in engine serving it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.once import made_once
from tests.runtime.engines.processes import EngineProcess


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
