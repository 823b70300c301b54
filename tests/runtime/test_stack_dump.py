"""`kill -USR1` on a rollflow server prints every thread's stack to its log and leaves it serving:
how a hung server is diagnosed where no debugger is installed (the docs tier does it to every
rollflow process of a page that timed out)."""

from __future__ import annotations

import os
import signal
import time

from tests.runtime.processes import http


def test_sigusr1_prints_every_threads_stack_and_the_manager_serves_on(processes):
    manager = processes.manager(engines=[])
    os.kill(manager.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while "most recent call first" not in manager.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = manager.log()
    assert "Current thread" in log and "most recent call first" in log, log
    assert 'rollflow/cli.py", line' in log, log  # the main thread's stack, down from the command
    assert http("GET", manager.url + "/health")[0] == 200
