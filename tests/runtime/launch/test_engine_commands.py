"""The command lines the launcher starts engines with (vLLM runs in tests/integration; SGLang
does not install on this CPU machine, so its command line is checked here and nowhere else)."""

from __future__ import annotations

import sys

from rollflow.runtime.launch.config import EnginePool
from rollflow.runtime.launch.engine_commands import engine_command


def test_builtin_engine_runs_rollflow_with_its_version_flag():
    command = engine_command(EnginePool(model="m", threads=2), "m", "127.0.0.1", 9000, 3)
    assert command.rollflow and not command.version_over_http
    assert command.argv[:2] == ["engine", "serve"]
    assert command.argv[command.argv.index("--weight-version") + 1] == "3"


def test_vllm_runs_in_dev_mode_with_the_pools_interpreter_and_arguments():
    pool = EnginePool(model="m", server="vllm", python="/venv/bin/python", args=["--dtype", "float32"])
    command = engine_command(pool, "m", "127.0.0.1", 9000, 0)
    assert command.argv == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
        "--host", "127.0.0.1", "--port", "9000", "--dtype", "float32",
    ]  # fmt: skip
    assert command.env["VLLM_SERVER_DEV_MODE"] == "1" and command.version_over_http


def test_sglang_uses_model_path_and_this_interpreter_by_default():
    command = engine_command(EnginePool(model="m", server="sglang"), "m", "127.0.0.1", 9000, 0)
    assert command.argv[:5] == [sys.executable, "-m", "sglang.launch_server", "--model-path", "m"]
    assert command.version_over_http and not command.rollflow
