"""Where one launched process runs: a slot on this machine, or a Ray actor on a cluster node.

The launcher asks a backend for a slot (with placement hints), then asks the slot for a free
port, to pull weights, and to start one command. Everything a process needs from its machine
(ports, pulled weights, the interpreter) is done by the slot on that machine, so the same
launcher code drives both backends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from rollflow.runtime.launch.join import pull_newest_model
from rollflow.runtime.launch.process import ChildProcess, LaunchError, free_port, rollflow_command

_POLL_S = 0.1


class Slot(Protocol):
    name: str
    host: str  # address the process binds and is reached at

    def free_port(self) -> int: ...

    def pull_weights(self, weights_url: str, tokenizer_dir: str, out_dir: str) -> int:
        """Pull the newest version into `out_dir` on the slot's machine; returns the version."""
        ...

    def start(
        self, argv: list[str], log_path: str, env: dict[str, str], rollflow: bool, files: dict[str, str]
    ) -> None:
        """Write `files` (path -> text), then start `argv` (with `rollflow`: `rollflow ARGV` in the
        slot's own interpreter)."""
        ...

    def exit_code(self) -> int | None:
        """None while running; a slot whose machine or actor is gone counts as exited."""
        ...

    def log_tail(self) -> str: ...

    def kill(self) -> None:
        """End the process at once (SIGKILL, or the actor's death): what a preempted machine does."""
        ...

    def stop(self) -> None: ...


def wait_answering(slot: Slot, answers: Callable[[], bool], target: str, timeout_s: float) -> None:
    """Wait until `answers()` (the slot's process answers at `target`); a process that exits first,
    or one still silent after `timeout_s` (launch.startup_timeout_s), is a LaunchError with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = slot.exit_code()
        if code is not None:
            raise LaunchError(f"{slot.name} exited with code {code} while starting:\n{slot.log_tail()}")
        if answers():
            return
        time.sleep(_POLL_S)
    raise LaunchError(
        f"{slot.name} did not answer {target} within {timeout_s:g}s"
        f" (launch.startup_timeout_s); its log ends:\n{slot.log_tail()}"
    )


class LocalSlot:
    """A child process of the launcher on this machine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.host = "127.0.0.1"
        self.process: ChildProcess | None = None

    def free_port(self) -> int:
        return free_port()

    def pull_weights(self, weights_url: str, tokenizer_dir: str, out_dir: str) -> int:
        return pull_newest_model(weights_url, tokenizer_dir, out_dir)

    def start(
        self, argv: list[str], log_path: str, env: dict[str, str], rollflow: bool, files: dict[str, str]
    ) -> None:
        for path, text in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        if rollflow:
            argv = rollflow_command(*argv)
        self.process = ChildProcess(self.name, argv, Path(log_path), env)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.exit_code()

    def log_tail(self) -> str:
        return "" if self.process is None else self.process.log_tail()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
