"""Fixtures for the runtime tests: a tiny model made at test time, and process factories."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.runtime.processes import ENV, REPO, Process, start_engine, start_manager


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny causal LM with an in-process trained tokenizer, written by the CLI."""
    folder = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [sys.executable, "-m", "rollflow.cli", "engine", "init-model", str(folder)],
        cwd=REPO,
        env=ENV,
        check=True,
        capture_output=True,
    )
    return folder


@pytest.fixture
def processes(tmp_path, tiny_model):
    """Start engines and managers; everything started is stopped after the test."""

    class Factory:
        def __init__(self) -> None:
            self.started: list[Process] = []

        def engine(self, weight_version: int = 0) -> Process:
            process = start_engine(tiny_model, tmp_path, weight_version)
            self.started.append(process)
            return process

        def manager(self, token: str | None = None, **config) -> Process:
            process = start_manager(tmp_path, config, token)
            self.started.append(process)
            return process

    factory = Factory()
    yield factory
    for process in factory.started:
        process.stop()
