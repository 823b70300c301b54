"""What the profiler tests share: the `rollflow` CLI as a subprocess, and one prompt simulated on
profiled tables (the tiny model's shape), so a table can be checked to reproduce what it measured."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

from rollflow.runtime.launch import servers
from tests.factories import REPO

# `rollflow engine init-model`'s tiny Llama, as the simulator's model_shape
TINY_SHAPE = {
    "num_layers": 2,
    "num_q_heads": 2,
    "num_kv_heads": 2,
    "embedding_dim": 128,
    "mlp_hidden_dim": 256,
    "vocab_size": 512,
}


def run_rollflow(*args: str) -> subprocess.CompletedProcess:
    return servers.run_rollflow(*args, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def simulate_one_prompt(tables: Path, prompt_tokens: int, work_dir: Path) -> dict:
    """`rollflow sim serve` of one prompt on the tables in `tables`; its row of requests.csv."""
    [request] = simulate_requests(tables, [(0.0, prompt_tokens, 1)], work_dir)
    return request


def simulate_requests(
    tables: Path,
    requests: list[tuple[float, int, int]],
    work_dir: Path,
    chunk_size: int = 256,
    kv_cache_granularity: int = 64,
) -> list[dict]:
    """`rollflow sim serve` of (arrival, prompt, output) requests on the tables in `tables`; the
    rows of requests.csv."""
    (work_dir / "trace.csv").write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{arrival},{prompt},{output}\n" for arrival, prompt, output in requests)
    )
    config = {
        "cluster": {"model": "tiny", "model_shape": TINY_SHAPE},
        "scheduler": {"kind": "sarathi", "chunk_size": chunk_size},
        "execution": {
            "kind": "tables",
            "kv_cache_granularity": kv_cache_granularity,
            "compute_table": str(tables / "mlp.csv"),
            "attention_table": str(tables / "attention.csv"),
        },
        "workload": {"kind": "trace", "file": str(work_dir / "trace.csv")},
        "output": {"plots": False, "chrome_trace": False},
    }
    (work_dir / "sim.yaml").write_text(json.dumps(config))
    proc = run_rollflow(
        "sim", "serve", "--config", str(work_dir / "sim.yaml"), "--output-dir", str(work_dir / "sim")
    )
    assert proc.returncode == 0, proc.stderr
    return read_rows(work_dir / "sim" / "requests.csv")
