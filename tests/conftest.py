"""Fixtures over Vidur's public data in ../shared (tests that need it skip when it is absent)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollflow.perf.grid_cache import CACHE_DIR_ENV
from tests.factories import LLAMA7B_MLP, SHARED, VIDUR_DATA


@pytest.fixture(scope="session")
def vidur_data() -> Path:
    if not LLAMA7B_MLP.is_file():
        pytest.skip("Vidur's public data is not at ../shared/data/vidur")
    return VIDUR_DATA


@pytest.fixture(scope="session")
def attention_table(tmp_path_factory: pytest.TempPathFactory, vidur_data: Path) -> Path:
    """Llama-2-7B/A100 attention table written by the shared tool (Vidur's data has none)."""
    out = tmp_path_factory.mktemp("tables") / "attention.csv"
    tool = SHARED / "tools" / "attention_table.py"
    subprocess.run(
        [
            sys.executable,
            str(tool),
            "--embd",
            "4096",
            "--q-heads",
            "32",
            "--kv-heads",
            "32",
            "--tp",
            "1,2",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session", autouse=True)
def grid_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Tests (and the commands they start) cache operator grids in a folder of their own, not the user's."""
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("grid_cache"))
    yield
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous
