"""`rollflow launch up` as a user runs it: a trainer command served by the launched manager,
no process left behind (after a normal exit and after kill -9), and one-line config errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.processes import ENV, REPO, http, rollflow

TRAINER = textwrap.dedent(
    """
    import json, os, sys
    from rollflow.runtime.manager.client import ManagerClient

    client = ManagerClient(os.environ["ROLLFLOW_MANAGER_URL"])
    batch = client.submit([[5, 6, 7], [8, 9]], n=2, max_new_tokens=4)
    samples = [s for groups in batch.micro_batches(min_groups=2) for g in groups for s in g]
    urls = [w["url"] for w in client.workers()]
    json.dump({"samples": len(samples), "urls": urls + [client.url]}, open(sys.argv[1], "w"))
    """
)


def _write_config(tmp_path, tiny_model, **section) -> str:
    raw = {
        "launch": {
            "work_dir": str(tmp_path / "work"),
            "engines": [{"kind": "local", "count": 1, "model": str(tiny_model)}],
            **section,
        }
    }
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _all_gone(urls: list[str], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for url in urls:
            try:
                http("GET", url + "/health", timeout=1)
                alive.append(url)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_launch_up_runs_the_trainer_against_the_manager_then_stops_everything(tmp_path, tiny_model):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    out = tmp_path / "trainer.json"
    config = _write_config(tmp_path, tiny_model, trainer={"command": [sys.executable, str(script), str(out)]})
    done = run_rollflow("launch", "up", "--config", config, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = yaml.safe_load(out.read_text())
    assert result["samples"] == 4 and len(result["urls"]) == 2
    assert _all_gone(result["urls"], timeout_s=1.0)


def test_launcher_killed_with_sigkill_leaves_no_process_behind(tmp_path, tiny_model):
    config = _write_config(tmp_path, tiny_model)
    log = open(tmp_path / "launcher.out", "w+b")  # noqa: SIM115 - closed below
    launcher = subprocess.Popen(
        rollflow("launch", "up", "--config", config), cwd=REPO, env=ENV, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 180
        while b"engines registered" not in (tmp_path / "launcher.out").read_bytes():
            assert launcher.poll() is None and time.monotonic() < deadline, (
                tmp_path / "launcher.out"
            ).read_text()
            time.sleep(0.2)
        line = next(
            x for x in (tmp_path / "launcher.out").read_text().splitlines() if "engines registered" in x
        )
        manager_url = line.split()[2].rstrip(";")
        urls = [manager_url] + [w["url"] for w in http("GET", manager_url + "/workers")[1]["workers"]]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _all_gone(urls)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        log.close()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("launch.backend=k8s", "launch.backend: Input should be 'local' or 'ray'"),
        ("launch.autoscale.pool=3", "autoscale.pool 3 names no entry of engines"),
    ],
)
def test_config_errors_are_one_line_with_the_key(tmp_path, tiny_model, override, message):
    config = _write_config(tmp_path, tiny_model, autoscale={"enabled": True})
    done = run_rollflow("launch", "up", "--config", config, override, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


def test_a_pool_pulling_weights_must_name_its_tokenizer(tmp_path, tiny_model):
    config = _write_config(tmp_path, tiny_model)
    raw = yaml.safe_load(Path(config).read_text())
    raw["launch"]["engines"] = [{"kind": "spot", "weights_url": "http://127.0.0.1:1"}]
    Path(config).write_text(yaml.safe_dump(raw))
    done = run_rollflow("launch", "show", "--config", config, timeout=60)
    assert done.returncode == 2
    assert "launch.engines[0]: " in done.stderr and "tokenizer" in done.stderr


@pytest.mark.parametrize("name", ["local", "ray"])
def test_the_shipped_examples_are_valid_launch_configs(name):
    done = run_rollflow("launch", "show", "--config", f"examples/launch/{name}.yaml", timeout=60)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["backend"] == name
