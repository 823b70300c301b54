"""Real engine processes for tests: the built-in engine started as a user starts it, on a free port."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from rollflow.runtime.launch.process import rollflow_command, wait_or_kill
from tests.factories import REPO

STARTUP_TIMEOUT_S = 180.0


class EngineProcess:
    """`rollflow engine serve --port 0`; `url` is read from the line it prints once it listens."""

    def __init__(self, model_dir: Path, *extra_args: str) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            rollflow_command(
                "engine",
                "serve",
                "--model",
                str(model_dir),
                "--port",
                "0",
                "--threads",
                "1",
                *extra_args,
            ),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        ready = threading.Event()
        self.url = ""

        def read() -> None:
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("serving on "):
                    self.url = line.split()[-1]
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(STARTUP_TIMEOUT_S) or not self.url:
            self.stop()
            raise RuntimeError("engine did not start:\n" + "".join(self.output))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            wait_or_kill(self.proc, 10)
