"""Running SkyRL's client (skyrl_client.py) from a test: as a process given its calls at once
(`skyrl`, `answer`), or as a long-lived one that runs each list of calls the test sends (`SkyRL`);
and what SkyRL's generators send and what an engine generates on its own, to compare with."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.runtime.processes import ENV, REPO, http

SKYRL = REPO / ".venv" / "skyrl-client"


def skyrl_sampling(max_tokens: int, **extra) -> dict:
    """The vLLM sampling params SkyRL's generators send (`get_vllm_sampling_params`), greedy."""
    return {
        "min_tokens": 1,
        "skip_special_tokens": True,
        "include_stop_str_in_output": True,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "logprobs": 1,
        "stop": None,
    } | extra


def _start(manager_url: str, engine_urls: list[str]) -> subprocess.Popen:
    if not (SKYRL / "skyrl").is_dir():
        pytest.fail(f"SkyRL's client is not installed at {SKYRL}: run `make .venv/.installed` again")
    env = {**ENV, "PYTHONPATH": f"{REPO}:{SKYRL}"}
    argv = [sys.executable, "-m", "tests.runtime.compat.skyrl_client", manager_url, *engine_urls]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def skyrl(manager_url: str, engine_urls: list[str], calls: list[dict]) -> subprocess.Popen:
    """SkyRL's client running `calls`, with the manager as its proxy and `engine_urls` as its
    servers (none: proxy-only mode, the manager is its server too)."""
    process = _start(manager_url, engine_urls)
    process.stdin.write(json.dumps(calls))
    process.stdin.close()
    process.stdin = None  # written: `communicate` reads the answer only
    return process


def answer(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out)


class SkyRL:
    """One SkyRL client process in proxy-only mode, running each list of calls as it is sent."""

    def __init__(self, manager_url: str) -> None:
        self.process = _start(manager_url, [])

    def run(self, calls: list[dict]) -> dict:
        self.process.stdin.write(json.dumps(calls) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            _, err = self.process.communicate(timeout=60)
            raise AssertionError(f"SkyRL's client exited: {err[-4000:]}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.stdin = None
        _, err = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, err[-4000:]


def greedy(engine_url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True},
    }
    status, output = http("POST", engine_url + "/generate", body)
    assert status == 200, output
    return output["output_ids"]
