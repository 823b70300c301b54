"""sglang-router, the peer the manager's benchmarks measure against, pinned and in a venv of its own
(`.venv-sglang-router/`, installed on first use by `benchmarks/_pinned_venv.py`)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import _pinned_venv

SGLANG_ROUTER_VERSION = "0.3.2"
VENV = _pinned_venv.REPO / ".venv-sglang-router"


def python() -> Path:
    """The interpreter of a venv holding sglang-router SGLANG_ROUTER_VERSION, installed on first use."""
    return _pinned_venv.python("sglang-router", SGLANG_ROUTER_VERSION, VENV)


def version(interpreter: Path) -> str | None:
    """The sglang-router version installed for `interpreter` (None when it is not there)."""
    return _pinned_venv.installed_version(interpreter, "sglang-router")


def router_argv(
    interpreter: Path, worker_urls: list[str], port: int, metrics_port: int, *options: str
) -> list[str]:
    """`sglang_router.launch_router` on 127.0.0.1:`port` (its metrics on `metrics_port`) in front of
    `worker_urls`, with the benchmark's own `options` (policy, health checks)."""
    argv = [str(interpreter), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *worker_urls, "--prometheus-host", "127.0.0.1"]
    return [*argv, "--prometheus-port", str(metrics_port), "--log-level", "warn", *options]
