"""Every server started on a port another process holds says so in one line, naming how to pick
another port, and exits non-zero: before loading a model or contacting an engine."""

from __future__ import annotations

import socket
import subprocess

import pytest

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import free_port


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_rollflow(*args, timeout=120)  # a server that started regardless would never end


@pytest.fixture
def taken_port():
    """A port some other process listens on (here: this test's socket)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _assert_one_line(result: subprocess.CompletedProcess, port: int, option: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"rollflow: port {port} on 127.0.0.1 is already in use (another process listens there, perhaps "
        f"an earlier run still going): stop it, or pick another port with {option} (0 picks a free one)"
    )


def test_manager_on_a_taken_port_says_so_before_contacting_its_engines(taken_port, tmp_path):
    # the configured engine is not there: the port is checked first, so no wait for it
    engine = f"http://127.0.0.1:{free_port()}"
    result = _run("manager", "serve", "--port", str(taken_port), f"engines=[{{url: '{engine}'}}]")
    _assert_one_line(result, taken_port, "--port")
    assert engine not in result.stderr


def test_builtin_engine_on_a_taken_port_says_so_before_loading_its_model(taken_port, tiny_model):
    result = _run("engine", "serve", "--model", str(tiny_model), "--port", str(taken_port))
    _assert_one_line(result, taken_port, "--port")


def test_weight_server_on_a_taken_port_says_so(taken_port, tmp_path):
    result = _run("weights", "serve", "--dir", str(tmp_path / "store"), "--port", str(taken_port))
    _assert_one_line(result, taken_port, "--port")


def test_launch_names_the_config_key_of_a_taken_manager_port(taken_port, tmp_path, tiny_model):
    result = _run(
        "launch", "up", "--config", "examples/launch/local.yaml",
        f"launch.work_dir={tmp_path}", f"launch.manager.port={taken_port}",
        f"launch.engines=[{{model: {tiny_model}}}]", "launch.autoscale.enabled=false",
    )  # fmt: skip
    _assert_one_line(result, taken_port, "launch.manager.port")
    assert not (tmp_path / "engine0-local.log").exists()  # nothing was started
