"""Real rollflow processes on 127.0.0.1 for the runtime tests: engines and managers.

Each process runs the `rollflow` CLI exactly as a user would, on a free port, and is killed
at the end of the test that started it (kill -9 included, which is the point of some tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from rollflow.runtime.launch.process import free_port, rollflow_command
from rollflow.runtime.launch.process import rollflow_command as rollflow  # tests say rollflow(ARGS)
from tests.runtime.engine_fork import ForkedProcess

REPO = Path(__file__).resolve().parents[2]
# `ROLLFLOW_TEST_MANAGER_PROCESSES=2 pytest tests/runtime`: every manager a test starts runs with
# `processes: 2` unless the test says otherwise (the manager's guarantees hold at N > 1)
MANAGER_PROCESSES = int(os.environ.get("ROLLFLOW_TEST_MANAGER_PROCESSES", "1"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def http(method: str, url: str, body=None, token: str | None = None, timeout: float = 60.0):
    """(status, parsed JSON or text) without raising on 4xx/5xx."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


ROLLFLOW = rollflow_command()  # what every `rollflow` command line starts with


def with_test_processes(config: dict) -> dict:
    """The manager's config with `processes` from ROLLFLOW_TEST_MANAGER_PROCESSES, unless it sets one."""
    return config if MANAGER_PROCESSES == 1 else {"processes": MANAGER_PROCESSES, **config}


class Process:
    """A server process on 127.0.0.1; `url` is where it listens, ready once `ready_path` answers 200."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        ready_path: str = "/health",
        wait: bool = True,
        forked: bool = False,
    ) -> None:
        """`forked`: `argv` is a `rollflow(...)` command line, run forked from the forkserver that
        imported an engine's modules once (engine_fork.py) rather than exec'd."""
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        if forked:
            assert argv[: len(ROLLFLOW)] == ROLLFLOW, argv
            self.proc = ForkedProcess(argv[len(ROLLFLOW) :], log_path, REPO, ENV)
        else:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=self._log, stderr=self._log)
        self.ready_path = ready_path
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 180.0) -> None:
        path = self.ready_path
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.url} not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """kill -9: no goodbye, open streams break mid-token."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets open and answers nothing, as a hung engine does."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a paused process carries on where it stopped."""
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start_engine(
    model_dir: Path,
    tmp_path: Path,
    weight_version: int = 0,
    name: str = "engine",
    wait: bool = True,
    extra_args: tuple[str, ...] = (),
    forked: bool = True,
) -> Process:
    """`forked`: from the forkserver that imported an engine's modules (engine_fork.py), so the engine
    is up in a fraction of a second; False: exec'd, as a user starts it (what benchmarks measure)."""
    port = free_port()
    args = ["engine", "serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--weight-version", str(weight_version), *extra_args]
    return Process(rollflow(*args), port, tmp_path / f"{name}-{port}.log", wait=wait, forked=forked)


def start_manager(tmp_path: Path, config: dict, token: str | None = None) -> Process:
    config = with_test_processes(config)
    port = free_port()
    config_path = tmp_path / f"manager-{port}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    args = ["manager", "serve", "--config", str(config_path), "--port", str(port), "--log-format", "json"]
    if token:
        args += ["--token", token]
    return Process(rollflow(*args), port, tmp_path / f"manager-{port}.log")


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
