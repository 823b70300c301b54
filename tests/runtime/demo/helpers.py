"""`rollflow demo` run by the demo tests as a user runs it, in the repository."""

from __future__ import annotations

import subprocess

from rollflow.runtime.launch.process import rollflow_command
from tests.runtime.processes import ENV, REPO


def demo(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rollflow demo ARGS`, its output captured; `timeout` bounds a run that hangs."""
    return subprocess.run(
        rollflow_command("demo", *args), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout
    )
