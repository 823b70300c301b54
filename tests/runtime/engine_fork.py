"""The runtime tests' engines, forked from a process that imported torch and transformers once.

A `rollflow engine serve` process spends about 4 s of CPU importing torch and transformers before
it loads a model of a few hundred kilobytes, and the runtime tests start some 180 engines: a third
of the whole suite's CPU on a 2-core machine. `start_forked` runs the same command line (the CLI's
`main`: its parser, its checks, its server, its exit codes) in a process forked from a
multiprocessing forkserver that imported those modules once per test worker. Each engine is still
a process of its own, on its own port, that a test can kill -9, stop or time out; only the imports
are shared. The `rollflow engine serve` command itself is tested exec'd, as users start it
(tests/runtime/engines/), and so is every engine a launcher or a docs page starts.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
from pathlib import Path

_PRELOAD = "tests.runtime.engine_preload"
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([_PRELOAD])
_STARTED: list[ForkedProcess] = []


@atexit.register
def _kill_leftovers() -> None:
    """An engine a failed test left running dies with its test worker, as an exec'd one would be
    reaped (multiprocessing would otherwise wait for it at exit)."""
    for process in _STARTED:
        process.kill()


def _ensure_forkserver() -> None:
    """Start the forkserver (once) without PYTEST_CURRENT_TEST in its environment: a test's id may be
    longer than one environment variable can be for exec (128 KiB; some tests carry their bodies in
    their ids), and the forkserver would then never start."""
    current = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if current is not None:
            os.environ["PYTEST_CURRENT_TEST"] = current


def _serve(argv: list[str], log_path: str, cwd: str, env: dict[str, str]) -> None:
    """The child: `rollflow ARGV` with its output in `log_path`, as an exec'd process would run it."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout.reconfigure(line_buffering=True)  # as `serving on ...` reaches an exec'd engine's log
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    from rollflow.cli import main

    sys.exit(main(argv))


class ForkedProcess:
    """A forked engine with the part of `subprocess.Popen`'s interface the tests use."""

    def __init__(self, argv: list[str], log_path: Path, cwd: Path, env: dict[str, str]) -> None:
        self.args = argv
        # not daemonic: an engine may start processes of its own (it parses big bodies in one)
        self._process = _CONTEXT.Process(target=_serve, args=(argv, str(log_path), str(cwd), env))
        _ensure_forkserver()
        self._process.start()
        self.pid = self._process.pid
        _STARTED.append(self)

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
