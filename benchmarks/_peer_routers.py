"""The routers the manager's benchmarks measure against, each pinned to one version and
pip-installed into a venv of its own at the repository root.

A comparison is only as good as the version it names: the benchmarks that measure the manager
against a router install that router's pinned version into `.venv-<name>/` the first time they
need it (as the vLLM tier's `.venv-vllm/`), so every machine runs the same router and its
dependencies leave rollflow's venv alone. The version a results file records is read from that venv
on every run. A benchmark that cannot install its peer exits non-zero saying why; it never runs
without it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class PeerRouter:
    """A router from PyPI, pinned, in `.venv-<distribution>/`, started in front of engines."""

    distribution: str  # its name on PyPI, and its venv's
    version: str  # the one version every run installs
    launch: tuple[str, ...]  # what starts it, the first word a program in its venv's bin/
    log_level: str  # its --log-level that keeps warnings and errors only

    @property
    def venv(self) -> Path:
        return REPO / f".venv-{self.distribution}"

    def python(self) -> Path:
        """The interpreter of its venv, the pinned version installed on first use; SystemExit
        naming what failed when pip cannot install it (it needs PyPI)."""
        interpreter = self.venv / "bin" / "python"
        stamp = self.venv / f".installed-{self.version}"
        if stamp.exists() and interpreter.exists():
            return interpreter
        pinned = f"{self.distribution}=={self.version}"
        print(f"installing {pinned} into {self.venv.relative_to(REPO)}/ (once)", file=sys.stderr, flush=True)
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(self.venv)],
            [str(interpreter), "-m", "pip", "install", "-q", pinned],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
                raise SystemExit(
                    f"could not install {pinned}, the peer this benchmark compares "
                    f"against ({' '.join(step[:4])} ... exited {done.returncode}):\n{tail}"
                )
        stamp.touch()
        return interpreter

    def installed_version(self, interpreter: Path) -> str | None:
        """The version installed for `interpreter` (None when it is not there): what a results
        file records, read on every run rather than trusted from the pin."""
        code = f"import importlib.metadata as m; print(m.version({self.distribution!r}))"
        done = subprocess.run([str(interpreter), "-c", code], capture_output=True, text=True)
        return (done.stdout.strip() or None) if done.returncode == 0 else None

    def argv(
        self, interpreter: Path, worker_urls: list[str], port: int, metrics_port: int, *options: str
    ) -> list[str]:
        """The router on 127.0.0.1:`port` (its metrics on `metrics_port`) in front of
        `worker_urls`, with the benchmark's own `options` (policy, health checks)."""
        program, *args = self.launch
        argv = [str(interpreter.parent / program), *args, "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--worker-urls", *worker_urls, "--prometheus-host", "127.0.0.1"]
        return [*argv, "--prometheus-port", str(metrics_port), "--log-level", self.log_level, *options]


SGLANG_ROUTER = PeerRouter("sglang-router", "0.3.2", ("python", "-m", "sglang_router.launch_router"), "warn")
"""SGLang's router, the peer of manager_overhead, stream_relay and prefix_routing."""

VLLM_ROUTER = PeerRouter("vllm-router", "0.1.17", ("vllm-router",), "warning")
"""vLLM's router (a Rust fork of SGLang's gateway, shipped as a wheel), the peer of vllm_router.py.
Its console script is the wheel's Python launcher (`vllm_router.launch_router`), which runs the
Rust router in the same process."""
