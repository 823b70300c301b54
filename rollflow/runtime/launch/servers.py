"""rollflow servers on 127.0.0.1 started as a user starts them, for the tests and the benchmarks: an
engine or a manager runs its `rollflow` command on a free port, is ready once it answers, and is
stopped (or killed, paused, resumed: what some tests and benchmarks are about) by its process. The
launcher's own children are process.py's `ChildProcess`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rollflow.runtime.launch.process import free_port, rollflow_command, wait_or_kill

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]
"""The checkout rollflow runs from: the servers' working folder, as the tests and benchmarks run there."""

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def run_rollflow(
    *args: str, env: Mapping[str, str] = ENV, timeout: float | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """`rollflow ARGS` run to its end as a user runs it (in `cwd`, the checkout unless told, with
    `env`), its output captured as text: a command that ends (an input error, `engine init-model`,
    `sim serve`) rather than a server, which ServerProcess starts."""
    return subprocess.run(
        rollflow_command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


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


def wait_until(
    condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.02, what: str = "condition"
) -> T:
    """`condition()`'s first true value, polled every `interval`; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metric(server: Any, name: str) -> float:
    """Sum of a Prometheus metric of `server` (anything with a `url`) over its labels."""
    _, text = http("GET", server.url + "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def workers(manager: Any) -> dict[str, dict]:
    """Engine url -> its record on the manager (failed engines included)."""
    return {w["url"]: w for w in http("GET", manager.url + "/workers?include_failed=true")[1]["workers"]}


class ServerProcess:
    """A server process on 127.0.0.1; `url` is where it listens, ready once `ready_path` answers 200.

    It runs in `cwd` (the checkout unless told) with `env` (ENV unless told: a peer such as vLLM
    needs its own); `wait` waits up to `ready_timeout_s` for it to answer, and stops it when it
    does not, so a failed start leaves no process behind."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        log_path: Path,
        ready_path: str = "/health",
        wait: bool = True,
        *,
        cwd: Path = REPO,
        env: Mapping[str, str] = ENV,
        ready_timeout_s: float = 180.0,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.cwd = cwd
        self.env = env
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = self._spawn(argv)
        self.ready_path = ready_path
        if wait:
            try:
                self.wait_ready(ready_timeout_s)
            except RuntimeError:
                self.stop()
                raise

    def _spawn(self, argv: list[str]) -> Any:
        """The process running `argv` (a Popen, or what behaves as one)."""
        return subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=self._log, stderr=self._log)

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

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (after SIGCONT, should it be paused), then SIGKILL after `grace_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            wait_or_kill(self.proc, grace_s)
        self._log.close()


def engine_command(
    model_dir: Path, port: int, weight_version: int = 0, extra_args: tuple[str, ...] = ()
) -> list[str]:
    """`rollflow engine serve` of `model_dir` on 127.0.0.1:`port`."""
    args = ["engine", "serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    return rollflow_command(*args, "--weight-version", str(weight_version), *extra_args)


def start_engine(
    model_dir: Path,
    log_dir: Path,
    weight_version: int = 0,
    name: str = "engine",
    wait: bool = True,
    extra_args: tuple[str, ...] = (),
    process: Callable[..., ServerProcess] = ServerProcess,
) -> ServerProcess:
    """A built-in engine serving `model_dir` on a free port, its log `log_dir/<name>-<port>.log`;
    `process` starts it (the tests' forks engines from a warm forkserver)."""
    port = free_port()
    argv = engine_command(model_dir, port, weight_version, extra_args)
    return process(argv, port, log_dir / f"{name}-{port}.log", wait=wait)


def manager_config(
    engine_urls: list[str], capacity: int = 1024, engine_type: str | None = None, **config
) -> dict:
    """A manager config over `engine_urls`, each taking `capacity` requests at once (and of
    `engine_type`, when given), plus `config`'s other keys (router, journal, ...)."""
    engine = {"capacity": capacity} | ({"engine_type": engine_type} if engine_type else {})
    return {"engines": [{"url": url, **engine} for url in engine_urls], **config}


def manager_command(
    config: dict, folder: Path, port: int, name: str = "manager", extra_args: tuple[str, ...] = ()
) -> list[str]:
    """`rollflow manager serve` of `config` (written to `folder/<name>-<port>.yaml`) on 127.0.0.1:`port`."""
    path = folder / f"{name}-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return rollflow_command("manager", "serve", "--config", str(path), "--port", str(port), *extra_args)


def start_manager(
    config: dict,
    folder: Path,
    port: int | None = None,
    name: str = "manager",
    wait: bool = True,
    extra_args: tuple[str, ...] = (),
    process: Callable[..., ServerProcess] = ServerProcess,
) -> ServerProcess:
    """A manager of `config` on `port` (a free one unless given: a restarted manager takes its old
    one), its config and log `folder/<name>-<port>.yaml|.log`; `process` starts it (the tests' own)."""
    port = port or free_port()
    argv = manager_command(config, folder, port, name, extra_args)
    return process(argv, port, folder / f"{name}-{port}.log", wait=wait)
