"""Build a read-only artefact once per test run, shared by every pytest-xdist worker of that run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `make(folder)` in the first worker that asks for it.

    The others wait on a lock and get the same folder, so a tiny model is built once per run,
    not once per worker. Outside xdist it is the run's own temporary folder, as before. Tests must
    only read what is in it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder; each worker's own is below it
    folder, made = root / name, root / f"{name}.made"
    with FileLock(str(root / f"{name}.lock")):
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed half-way
            make(folder)
            made.touch()
    return folder
