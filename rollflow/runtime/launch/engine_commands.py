"""The command that starts one engine of a pool: rollflow's built-in engine, vLLM or SGLang.

The launcher, the manager and the trainer treat all three alike; what differs is the command
line, the environment, and how the server learns which weight version it starts on (the
built-in engine takes a flag; vLLM and SGLang are told over HTTP once they answer).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from dataclasses import dataclass

from rollflow.runtime.launch.config import EnginePool
from rollflow.runtime.launch.process import LaunchError

# vLLM serves weight reloads, weight versions and pause/resume only in dev mode
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    rollflow: bool  # argv is a `rollflow` subcommand, run by the slot's own interpreter
    env: dict[str, str]
    version_over_http: bool  # tell the server its weight version once it is up


def engine_command(pool: EnginePool, model: str, host: str, port: int, version: int) -> EngineCommand:
    address = ["--host", host, "--port", str(port)]
    if pool.server == "builtin":
        argv = ["engine", "serve", "--model", model, *address]
        argv += ["--weight-version", str(version), "--threads", str(pool.threads), *pool.args]
        return EngineCommand(argv, True, dict(pool.env), False)
    python = pool.python or sys.executable
    if pool.server == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *address, *pool.args]
        return EngineCommand(argv, False, {**VLLM_ENV, **pool.env}, True)
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, *address, *pool.args]
    return EngineCommand(argv, False, dict(pool.env), True)


def set_weight_version(url: str, version: int) -> None:
    """`POST /update_weight_version`, which vLLM (dev mode) and SGLang both serve."""
    body = json.dumps({"new_version": str(version)}).encode()
    request = urllib.request.Request(
        url + "/update_weight_version", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
    except OSError as exc:
        raise LaunchError(f"{url} did not take its weight version {version}: {exc}") from None
