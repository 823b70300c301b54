"""One child process of the launcher: a `rollflow` CLI command with its log in a file.

Children are tied to the launcher's life: on Linux each asks the kernel for SIGKILL when the
launcher dies (PR_SET_PDEATHSIG), so even a launcher killed with -9 leaves no orphan engine
behind. The kernel's "parent" is the thread that started the child, so start children only from
threads that live as long as the launch; a normal exit stops them with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from rollflow.errors import UserError

_PR_SET_PDEATHSIG = 1


class LaunchError(UserError):
    """A process the launch needs did not come up, or died; the message says which and why."""


def free_port() -> int:
    """A port free on 127.0.0.1 now (the child binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rollflow_command(*args: str) -> list[str]:
    """The command line of `rollflow ARGS` in this interpreter: what the launcher starts, and what
    tests and benchmarks run."""
    return [sys.executable, "-m", "rollflow.cli", *args]


def wait_or_kill(proc: subprocess.Popen, grace_s: float) -> int:
    """`proc`'s exit code once it is gone: it has `grace_s` to exit on its own (after it was told to
    stop: a Stop message, SIGTERM), then gets SIGKILL, so a stuck process cannot hang its parent."""
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ChildProcess:
    """A started process; `name` is how logs and errors refer to it."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=child_env, preexec_fn=_die_with_parent
            )

    def exit_code(self) -> int | None:
        """None while running."""
        return self.proc.poll()

    def log_tail(self, num_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL, no grace; waits until the process is gone."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; waits until the process is gone."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        wait_or_kill(self.proc, grace_s)
