"""Fixtures for the runtime tests: a tiny model made at test time, and process factories."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollflow.runtime.launch.servers import run_rollflow
from tests.once import made_once
from tests.runtime import processes as processes_module
from tests.runtime.processes import Process, start_engine, start_manager


@pytest.fixture(params=[1, 2], ids=["1-process", "2-processes"])
def both_manager_process_modes(request, monkeypatch) -> int:
    """Runs the test twice (`@pytest.mark.usefixtures("both_manager_process_modes")`): every manager
    it starts with `processes: 1`, then with `processes: 2`, so its guarantees are checked with the
    engines' streams read by a stream process too."""
    monkeypatch.setattr(processes_module, "MANAGER_PROCESSES", request.param)
    return request.param


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random tiny causal LM with an in-process trained tokenizer, written by the CLI once per run."""

    def init_model(folder: Path) -> None:
        run_rollflow("engine", "init-model", str(folder)).check_returncode()

    return made_once(tmp_path_factory, "tiny-model", init_model)


class ProcessFactory:
    """Starts engines and managers with logs in one folder; `stop_all` ends every one of them."""

    def __init__(self, folder, model) -> None:
        self.folder = folder
        self.model = model
        self.started: list[Process] = []

    def engine(self, weight_version: int = 0, extra_args: tuple[str, ...] = ()) -> Process:
        process = start_engine(self.model, self.folder, weight_version, extra_args=extra_args)
        self.started.append(process)
        return process

    def manager(self, token: str | None = None, **config) -> Process:
        process = start_manager(self.folder, config, token)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


@pytest.fixture
def processes(tmp_path, tiny_model):
    """Processes that live for one test (the ones a test kills or pauses)."""
    factory = ProcessFactory(tmp_path, tiny_model)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory, tiny_model):
    """Processes shared by the tests of one module (none of which harms them)."""
    factory = ProcessFactory(tmp_path_factory.mktemp("processes"), tiny_model)
    yield factory
    factory.stop_all()
