"""`rollflow profile engine` against a real built-in engine process, as a user runs it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.factories import REPO
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import free_port


def _rollflow(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "rollflow.cli", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    proc = _rollflow("engine", "init-model", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


def test_engine_profile_writes_tables_whose_simulation_gives_the_measured_times(tiny, tmp_path):
    engine = EngineProcess(tiny)
    try:
        proc = _rollflow(
            "profile", "engine", "--url", engine.url, "--kind", "builtin", "--model-config", str(tiny),
            "--out", str(tmp_path / "tables"), "--batch-sizes", "1,4", "--prompt-lengths", "16,128",
            "--decode-tokens", "8", "--repeats", "2",
        )  # fmt: skip
    finally:
        engine.stop()
    assert proc.returncode == 0, proc.stderr
    assert "decode batch 4:" in proc.stdout and "prompt 128 tokens:" in proc.stdout
    with open(tmp_path / "tables" / "mlp.csv", newline="") as handle:
        rows = {int(r["num_tokens"]): r for r in csv.DictReader(handle)}
    assert sorted(rows) == [1, 4, 16, 128]
    assert all(float(r["time_stats.attn_pre_proj.median"]) > 0 for r in rows.values())

    # One request of 128 prompt tokens is one 128-token iteration: the simulator must take the
    # engine's measured time for it (iteration time per layer x 2 layers).
    (tmp_path / "trace.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,128,1\n")
    config = {
        "cluster": {
            "model": "tiny",
            "model_shape": {
                "num_layers": 2, "num_q_heads": 2, "num_kv_heads": 2, "embedding_dim": 128,
                "mlp_hidden_dim": 256, "vocab_size": 512,
            },
        },
        "scheduler": {"kind": "sarathi", "chunk_size": 256},
        "execution": {
            "kind": "tables",
            "compute_table": str(tmp_path / "tables" / "mlp.csv"),
            "attention_table": str(tmp_path / "tables" / "attention.csv"),
        },
        "workload": {"kind": "trace", "file": str(tmp_path / "trace.csv")},
        "output": {"plots": False, "chrome_trace": False},
    }  # fmt: skip
    (tmp_path / "sim.yaml").write_text(json.dumps(config))
    proc = _rollflow(
        "sim", "serve", "--config", str(tmp_path / "sim.yaml"), "--output-dir", str(tmp_path / "sim")
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "sim" / "requests.csv", newline="") as handle:
        [request] = list(csv.DictReader(handle))
    measured_ms = 2 * float(rows[128]["time_stats.attn_pre_proj.median"])
    assert float(request["ttft"]) * 1e3 == pytest.approx(measured_ms, rel=1e-9)


def test_an_engine_that_is_not_there_is_a_one_line_error(tiny, tmp_path):
    proc = _rollflow(
        "profile", "engine", "--url", f"http://127.0.0.1:{free_port()}", "--model-config", str(tiny),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("rollflow: engine at http://127.0.0.1:")
