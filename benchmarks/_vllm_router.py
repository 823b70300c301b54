"""vllm-router, vLLM's router (a Rust fork of SGLang's gateway, shipped as a wheel), the peer
`benchmarks/vllm_router.py` measures the manager against: pinned, in `.venv-vllm-router/`, installed
on first use by `benchmarks/_pinned_venv.py`."""

from __future__ import annotations

from pathlib import Path

from benchmarks import _pinned_venv

VLLM_ROUTER_VERSION = "0.1.17"
VENV = _pinned_venv.REPO / ".venv-vllm-router"


def python() -> Path:
    """The interpreter of a venv holding vllm-router VLLM_ROUTER_VERSION, installed on first use."""
    return _pinned_venv.python("vllm-router", VLLM_ROUTER_VERSION, VENV)


def version(interpreter: Path) -> str | None:
    """The vllm-router version installed for `interpreter` (None when it is not there)."""
    return _pinned_venv.installed_version(interpreter, "vllm-router")


def router_argv(
    interpreter: Path, worker_urls: list[str], port: int, metrics_port: int, *options: str
) -> list[str]:
    """vllm-router on 127.0.0.1:`port` (its metrics on `metrics_port`) in front of `worker_urls`,
    with the benchmark's own `options` (policy). Its console script is the wheel's Python launcher
    (`vllm_router.launch_router`), which runs the Rust router in the same process."""
    argv = [str(interpreter.parent / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *worker_urls, "--prometheus-host", "127.0.0.1"]
    return [*argv, "--prometheus-port", str(metrics_port), "--log-level", "warning", *options]
