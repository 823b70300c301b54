"""`--backend ray` with no Ray cluster at the address: one line saying what was tried and what to
do, and a non-zero exit, instead of Ray's silent connection retries (over a minute, deaf to SIGTERM)."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.launch.ray_cluster import RAY_ENV
from tests.runtime.processes import ENV, REPO, free_port, rollflow

pytest.importorskip("ray")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # the timeout only guards against the old behaviour's hang
    return run_rollflow(*args, env={**ENV, **RAY_ENV, **env}, timeout=120)


def _no_cluster_line(address: str, source: str, instead: str) -> str:
    """The one line a run ends with when nothing answers at the Ray `address` its `source` set."""
    return (
        f"rollflow: no Ray cluster answers at {address} ({source}: {address}): connection refused; "
        f"start one there with `ray start --head --port={address.split(':')[1]}`, or {instead}"
    )


def test_search_on_ray_without_a_cluster_says_how_to_start_one(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    result = _run(
        "sim", "search", "--config", "examples/search/llama2_7b_a100.yaml", "--output-dir", str(tmp_path),
        "--backend", "ray", env={"RAY_ADDRESS": address},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == _no_cluster_line(
        address, "RAY_ADDRESS", "drop --backend ray to search on this machine"
    )
    assert "Traceback" not in result.stderr and "GCS" not in result.stderr


def test_launch_on_ray_without_a_cluster_names_the_config_key(tmp_path, tiny_model):
    address = f"127.0.0.1:{free_port()}"
    result = _run(
        "launch", "up", "--config", "examples/launch/ray.yaml", f"launch.ray.address={address}",
        f"launch.work_dir={tmp_path}", f"launch.engines=[{{model: {tiny_model}}}]", "launch.autoscale.enabled=false",
        env={},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == _no_cluster_line(
        address, "launch.ray.address", "set launch.backend=local to run on this machine"
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "manager.log").exists()


def test_sigterm_ends_a_search_waiting_on_an_address_that_answers_nothing(tmp_path):
    with socket.socket() as silent:  # takes connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        proc = subprocess.Popen(
            rollflow("sim", "search", "--config", "examples/search/llama2_7b_a100.yaml",
                     "--output-dir", str(tmp_path), "--backend", "ray"),
            cwd=REPO, env={**ENV, **RAY_ENV, "RAY_ADDRESS": address}, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            for line in proc.stderr:  # ray.init is inside its C++ connect loop, retrying
                if "Failed to connect to GCS" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)  # a guard: Ray's own handler runs after its retries, a minute on
            said = proc.stderr.read()
        finally:
            proc.kill()
            proc.stderr.close()
        assert code == 128 + signal.SIGTERM
        assert f"rollflow: stopped by SIGTERM while connecting to the Ray cluster at {address}" in said
