"""sglang-router, the peer the manager's benchmarks measure against, pinned and in a venv of its own.

A comparison is only as good as the version it names: `SGLANG_ROUTER_VERSION` is installed with pip
into `.venv-sglang-router/` at the repository root the first time a benchmark needs it (as the
vLLM tier's `.venv-vllm/`), so every machine runs the same router and its dependencies leave
rollflow's venv alone. The version a results file records is read from that venv on every run.
A benchmark that cannot install it exits non-zero saying why; it never runs without its peer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SGLANG_ROUTER_VERSION = "0.3.2"
REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-sglang-router"


def python() -> Path:
    """The interpreter of a venv holding sglang-router SGLANG_ROUTER_VERSION, installed on first use;
    SystemExit naming what failed when pip cannot install it (it needs PyPI)."""
    interpreter = VENV / "bin" / "python"
    stamp = VENV / f".installed-{SGLANG_ROUTER_VERSION}"
    if stamp.exists() and interpreter.exists():
        return interpreter
    print(
        f"installing sglang-router=={SGLANG_ROUTER_VERSION} into {VENV.relative_to(REPO)}/ (once)",
        file=sys.stderr,
        flush=True,
    )
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(VENV)],
        [str(interpreter), "-m", "pip", "install", "-q", f"sglang-router=={SGLANG_ROUTER_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise SystemExit(
                f"could not install sglang-router=={SGLANG_ROUTER_VERSION}, the peer this benchmark "
                f"compares against ({' '.join(step[:4])} ... exited {done.returncode}):\n{tail}"
            )
    stamp.touch()
    return interpreter


def version(interpreter: Path) -> str | None:
    """The sglang-router version installed for `interpreter` (None when it is not there)."""
    code = "import importlib.metadata as m; print(m.version('sglang-router'))"
    done = subprocess.run([str(interpreter), "-c", code], capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def router_argv(
    interpreter: Path, worker_urls: list[str], port: int, metrics_port: int, *options: str
) -> list[str]:
    """`sglang_router.launch_router` on 127.0.0.1:`port` (its metrics on `metrics_port`) in front of
    `worker_urls`, with the benchmark's own `options` (policy, health checks)."""
    argv = [str(interpreter), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *worker_urls, "--prometheus-host", "127.0.0.1"]
    return [*argv, "--prometheus-port", str(metrics_port), "--log-level", "warn", *options]
