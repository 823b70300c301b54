"""GPUs a user describes in `cluster.devices`, and latency percentiles chosen in `output.percentiles`,
through `rollflow sim serve` as a user runs it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from rollflow.runtime.launch.process import rollflow_command
from tests.factories import assert_one_line_error, synthetic_workload

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# The catalog's a100 (rollflow.perf.specs.GPUS) and its a100_pairwise_nvlink node, written out.
A100_COPY = {
    "fp16_tflops": 312,
    "memory_gb": 80,
    "hbm_gb_per_s": 2039,
    "link_gb_per_s": 300,
    "devices_per_node": 4,
}


def serve_config(tmp_path: Path, name: str, cluster: dict, execution: dict | None = None) -> Path:
    """Llama-2-7B with TP 2 and 2 pipeline stages (all-reduces and stage hops both count)."""
    config = {
        "seed": 5,
        "cluster": {
            "model": "meta-llama/Llama-2-7b-hf",
            "tensor_parallel": 2,
            "pipeline_stages": 2,
            "replicas": 2,
            **cluster,
        },
        "execution": execution or {"kind": "roofline"},
        "workload": synthetic_workload(80, 6.0, kind="fixed", prefill_tokens=700, decode_tokens=90),
        "output": {"dir": str(tmp_path / name), "plots": False, "chrome_trace": False, "progress": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        rollflow_command("sim", "serve", "--config", str(config), *overrides),
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
    )


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def completions(run: Path) -> list[tuple[str, str, str]]:
    with open(run / "requests.csv") as handle:
        return [(row["id"], row["replica"], row["completed_at"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize(
    "execution",
    [
        {"kind": "roofline"},
        # No compute table exists for the user's device: the roofline stands in, and says so.
        {"kind": "tables", "compute_table": "./no/such/tables/{DEVICE}/{MODEL}/mlp.csv"},
    ],
    ids=["roofline", "tables_without_a_table"],
)
def test_a_user_device_with_the_a100s_numbers_simulates_exactly_like_the_a100(tmp_path, execution):
    catalog = serve_config(tmp_path, "a100", {"device": "a100"})
    user = serve_config(tmp_path, "mine", {"devices": {"mine": A100_COPY}, "device": "mine"}, execution)
    for config in (catalog, user):
        result = serve(config)
        assert result.returncode == 0, result.stderr
    a100, mine = summary_of(tmp_path / "a100"), summary_of(tmp_path / "mine")
    assert completions(tmp_path / "mine") == completions(tmp_path / "a100")
    for metric in ("ttft", "tpot", "e2e", "scheduling_delay"):
        assert mine[metric] == a100[metric]
    assert a100["execution_model"] == "roofline: meta-llama/Llama-2-7b-hf on a100"
    assert mine["execution_model"].startswith("roofline: meta-llama/Llama-2-7b-hf on mine")
    if execution["kind"] == "tables":
        assert "user device mine has no profile table ./no/such/tables/mine/" in mine["execution_model"]


def test_a_faster_user_device_serves_faster_in_a_group_beside_the_catalogs(tmp_path):
    fast = {**A100_COPY, "fp16_tflops": 624, "hbm_gb_per_s": 4078}
    config = serve_config(tmp_path, "mixed", {})
    raw = yaml.safe_load(config.read_text())
    raw["cluster"] = {
        "model": "meta-llama/Llama-2-7b-hf",
        "devices": {"fast": fast},
        "groups": [{"replicas": 1, "device": "a100"}, {"replicas": 1, "device": "fast"}],
    }
    config.write_text(yaml.safe_dump(raw))
    result = serve(config)
    assert result.returncode == 0, result.stderr
    e2e: dict[str, list[float]] = {}
    with open(tmp_path / "mixed" / "requests.csv") as handle:
        for row in csv.DictReader(handle):
            e2e.setdefault(row["replica"], []).append(float(row["e2e"]))
    assert np.mean(e2e["1"]) < np.mean(e2e["0"])  # replica 1 runs on the user's faster GPU


NO_FLOPS = {k: v for k, v in A100_COPY.items() if k != "fp16_tflops"}


@pytest.mark.parametrize(
    ("devices", "overrides", "expected"),
    [
        ({"mine": NO_FLOPS}, [], "cluster.devices.mine.fp16_tflops: Field required"),
        (
            {"mine": A100_COPY},
            ["cluster.devices.mine.memory_gb=-80"],
            "cluster.devices.mine.memory_gb: Input should be greater than 0",
        ),
        (
            {"mine": A100_COPY},
            ["cluster.devices.mine.devices_per_node=0"],
            "cluster.devices.mine.devices_per_node: Input should be greater than or equal to 1",
        ),
        (
            {"mine": A100_COPY},
            ["cluster.devices.mine.tflops=1"],
            "cluster.devices.mine.tflops: unknown key; did you mean 'fp16_tflops'",
        ),
        (
            {"mine": A100_COPY, "a100": A100_COPY},
            [],
            "cluster.devices: Value error, 'a100' clashes with a catalog device",
        ),
        (
            {"mine": A100_COPY},
            ["cluster.device=b200"],
            "cluster.device: Value error, unknown device 'b200'; pick one of: a100, h100, a40, mine",
        ),
        (
            {"mine": A100_COPY},
            ["cluster.network_device=mine_dgx"],
            "cluster.network_device: Value error, unknown network_device 'mine_dgx'",
        ),
        (
            {"mine": A100_COPY},
            ["output.percentiles=[50,100]"],
            "output.percentiles: Value error, every percentile must be in (0, 100), got 100",
        ),
    ],
)
def test_bad_device_specs_and_percentiles_are_one_line_errors(tmp_path, devices, overrides, expected):
    config = serve_config(tmp_path, "bad", {"devices": devices, "device": "mine"})
    result = serve(config, *overrides)
    assert_one_line_error(result, expected)


def test_chosen_percentiles_are_numpys_linear_percentiles_of_the_requests(tmp_path):
    config = serve_config(tmp_path, "pcts", {"device": "a100"})
    result = serve(config, "output.percentiles=[99.9,95,50]")
    assert result.returncode == 0, result.stderr
    summary = summary_of(tmp_path / "pcts")
    with open(tmp_path / "pcts" / "requests.csv") as handle:
        rows = list(csv.DictReader(handle))
    for metric in ("ttft", "e2e", "scheduling_delay"):
        values = np.array([float(row[metric]) for row in rows])
        assert set(summary[metric]) == {"p50", "p95", "p99.9", "mean"}
        for key, q in (("p50", 50), ("p95", 95), ("p99.9", 99.9)):
            assert summary[metric][key] == pytest.approx(np.percentile(values, q, method="linear"), rel=1e-9)
    assert "p99.9" in result.stdout  # the printed table has the chosen columns
