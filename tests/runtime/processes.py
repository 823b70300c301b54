"""Real rollflow processes on 127.0.0.1 for the runtime tests: engines and managers.

Each process runs the `rollflow` CLI exactly as a user would, on a free port, and is killed
at the end of the test that started it (kill -9 included, which is the point of some tests).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from rollflow.runtime.launch import servers
from rollflow.runtime.launch.process import free_port, rollflow_command  # noqa: F401 - the tests take free_port from here
from rollflow.runtime.launch.process import rollflow_command as rollflow  # noqa: F401 - tests say rollflow(ARGS)
from rollflow.runtime.launch.servers import (
    ENV,  # noqa: F401 - the tests take it from here
    ServerProcess,
    http,  # noqa: F401 - the tests take it from here
)
from tests.runtime.engine_fork import ForkedProcess

REPO = Path(__file__).resolve().parents[2]
# `ROLLFLOW_TEST_MANAGER_PROCESSES=2 pytest tests/runtime`: every manager a test starts runs with
# `processes: 2` unless the test says otherwise (the manager's guarantees hold at N > 1)
MANAGER_PROCESSES = int(os.environ.get("ROLLFLOW_TEST_MANAGER_PROCESSES", "1"))

ROLLFLOW = rollflow_command()  # what every `rollflow` command line starts with


def with_test_processes(config: dict) -> dict:
    """The manager's config with `processes` from ROLLFLOW_TEST_MANAGER_PROCESSES, unless it sets one."""
    return config if MANAGER_PROCESSES == 1 else {"processes": MANAGER_PROCESSES, **config}


class Process(ServerProcess):
    """A server process on 127.0.0.1 (servers.py's), run in the repository, or forked."""

    def __init__(self, *args: Any, forked: bool = False, **options: Any) -> None:
        """ServerProcess's arguments; `forked`: its argv is a `rollflow(...)` command line, run forked
        from the forkserver that imported an engine's modules once (engine_fork.py) rather than exec'd."""
        self._forked = forked
        super().__init__(*args, **options)

    def _spawn(self, argv: list[str]):
        if not self._forked:
            return super()._spawn(argv)
        assert argv[: len(ROLLFLOW)] == ROLLFLOW, argv
        return ForkedProcess(argv[len(ROLLFLOW) :], self.log_path, self.cwd, dict(self.env))


def start_engine(model_dir: Path, tmp_path: Path, *args: Any, forked: bool = True, **kwargs: Any) -> Process:
    """servers.start_engine's engine (its other arguments, after `model_dir` and the log folder) as a
    test's `Process`. `forked`: from the forkserver that imported an engine's modules
    (engine_fork.py), so the engine is up in a fraction of a second; False: exec'd, as a user starts
    it (what benchmarks measure)."""
    process = functools.partial(Process, forked=forked)
    return servers.start_engine(model_dir, tmp_path, *args, process=process, **kwargs)


def start_manager(
    tmp_path: Path,
    config: dict,
    token: str | None = None,
    *,
    port: int | None = None,
    name: str = "manager",
    wait: bool = True,
    extra_args: tuple[str, ...] = (),
) -> Process:
    """servers.start_manager's manager as a test's `Process`, logging JSON, with `token` if given and
    the test's manager processes (ROLLFLOW_TEST_MANAGER_PROCESSES)."""
    extra_args = ("--log-format", "json", *(("--token", token) if token else ()), *extra_args)
    config = with_test_processes(config)
    return servers.start_manager(config, tmp_path, port, name, wait, extra_args, process=Process)


def descendants(pid: int) -> set[int]:
    """`pid` and every process started under it."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        found |= frontier
        frontier = {child for child, parent in parent_of.items() if parent in frontier} - found
    return found
