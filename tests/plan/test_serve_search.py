"""`rollflow sim search` as a user runs it: real simulations, cached rows, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from rollflow.plan.bisect import Probe, max_qps
from rollflow.plan.serve_config import BisectionConfig
from rollflow.runtime.launch.process import rollflow_command
from tests.factories import assert_one_line_error

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def search_config(tmp_path: Path) -> Path:
    """Llama-2-70B on A100s: tp1 cannot hold it (skipped), tp4 and tp8 can."""
    config = {
        "simulation": {
            "seed": 3,
            "cluster": {"model": "meta-llama/Llama-2-70b-hf"},
            "execution": {"kind": "roofline"},
            "workload": {
                "kind": "synthetic",
                "num_requests": 60,
                "max_tokens": 2048,
                "lengths": {"kind": "fixed", "prefill_tokens": 512, "decode_tokens": 64},
                "intervals": {"kind": "poisson"},
            },
        },
        "slos": [
            {"metric": "scheduling_delay", "quantile": 99, "max_s": 0.5},
            {"metric": "tbt", "max_s": 0.1},
        ],
        "prices": {"a100": 2.0},
        "space": {"tensor_parallel": [1, 4, 8], "scheduler": ["vllm"]},
        "bisection": {"start_qps": 2.0, "tolerance": 0.1},
        "workers": 2,
        "output_dir": str(tmp_path / "search"),
    }
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rollflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(rollflow_command(*args), cwd=ROOT, env=ENV, capture_output=True, text=True)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("search")
    config = search_config(tmp_path)
    result = rollflow("sim", "search", "--config", str(config))
    assert result.returncode == 0, result.stderr
    return tmp_path, config, result


def rows_of(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())


def test_outputs_and_a_configuration_that_does_not_fit_is_skipped_with_its_reason(searched):
    tmp_path, _, _ = searched
    out = tmp_path / "search"
    rows = rows_of(out)
    assert [r["tensor_parallel"] for r in rows] == [1, 4, 8]
    tp1, tp4, tp8 = rows
    assert "leaves no room" in tp1["skipped"] and tp1["simulations"] == 0 and tp1["max_qps"] == 0.0
    for row in (tp4, tp8):
        assert row["skipped"] is None and row["max_qps"] > 0 and row["simulations"] >= 2
        assert row["qps_per_dollar"] == pytest.approx(row["max_qps"] / (row["gpus"] * 2.0))
        assert row["scheduling_delay_p99"] <= 0.5 and row["tpot_p99"] <= 0.1
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert {"device", "tensor_parallel", "max_qps", "qps_per_dollar", "scheduling_delay_p99"} <= set(header)
    assert (out / "pareto_scheduling_delay_p99.png").stat().st_size > 0
    assert (out / "pareto_tpot_p99.png").stat().st_size > 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    winner = max(rows, key=lambda r: r["qps_per_dollar"])
    assert best["cluster"]["tensor_parallel"] == winner["tensor_parallel"]
    assert best["workload"]["intervals"]["qps"] == winner["max_qps"]


def test_max_qps_equals_bisection_over_single_sim_serve_runs(searched):
    """Bisect again with one `rollflow sim serve` process per probe; same probes, same answer."""
    tmp_path, _, _ = searched
    out = tmp_path / "search"
    row = rows_of(out)[1]
    base = tmp_path / "tp4.yaml"
    raw = yaml.safe_load((out / "best.yaml").read_text())
    raw["cluster"]["tensor_parallel"] = row["tensor_parallel"]
    base.write_text(yaml.safe_dump(raw))

    def serve(qps: float) -> Probe:
        run_dir = tmp_path / f"serve_{qps:g}"
        result = rollflow(
            "sim",
            "serve",
            "--config",
            str(base),
            "--output-dir",
            str(run_dir),
            f"workload.intervals.qps={qps}",
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        passed = (
            summary["num_completed"] == summary["num_requests"]
            and summary["scheduling_delay"]["p99"] <= 0.5
            and summary["tpot"]["p99"] <= 0.1
        )
        return Probe(qps, passed, {})

    bracket = max_qps(serve, BisectionConfig(start_qps=2.0, tolerance=0.1))
    assert [[p.qps, p.passed] for p in bracket.probes] == json.loads(
        (out / "cache").joinpath(f"{_key(out, row)}.json").read_text()
    )["probes"]
    assert bracket.best.qps == row["max_qps"]


def _key(out: Path, row: dict) -> str:
    for cached in (out / "cache").glob("*.json"):
        data = json.loads(cached.read_text())
        if data["tensor_parallel"] == row["tensor_parallel"]:
            return data["key"]
    raise AssertionError("no cached row")


def test_a_rerun_resumes_from_the_cache_and_resume_never_searches_again(searched):
    tmp_path, config, _ = searched
    out = tmp_path / "search"
    cached = {p: p.stat().st_mtime_ns for p in (out / "cache").glob("*.json")}
    before = rows_of(out)
    assert len(cached) == 3
    again = rollflow("sim", "search", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert "3 from cache, 0 to search" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "cache").glob("*.json")} == cached
    assert rows_of(out) == before  # rewritten from the cache
    fresh = rollflow(
        "sim", "search", "--config", str(config), "--resume", "never", "space.tensor_parallel=[4]"
    )
    assert fresh.returncode == 0, fresh.stderr
    assert "0 from cache, 1 to search" in fresh.stderr


def test_max_qps_bisection_brackets_a_threshold():
    settings = BisectionConfig(start_qps=1.0, tolerance=0.02, max_simulations=30)
    bracket = max_qps(lambda q: Probe(q, q <= 13.7, {}), settings)
    failing = min(p.qps for p in bracket.probes if not p.passed)
    assert bracket.best.qps <= 13.7 < failing
    assert (failing - bracket.best.qps) / failing <= 0.02
    assert max_qps(lambda q: Probe(q, False, {}), settings).best is None


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("slos.0.metric=latency", "slos[0].metric: Input should be 'ttft'"),
        ("space.tensor_parallel=[]", "space.tensor_parallel"),
        ("space.device=[b200]", "unknown device 'b200'"),
        ("space.device=[h100]", "no $/GPU-hour for device 'h100'"),
        ("slos.0.quantile=100", "slos[0].quantile: Input should be less than 100"),
        ("slos.0.quantile=0", "slos[0].quantile: Input should be greater than 0"),
    ],
)
def test_bad_search_configs_are_one_line_errors(tmp_path, override, expected):
    result = rollflow("sim", "search", "--config", str(search_config(tmp_path)), override)
    assert_one_line_error(result, expected)


@pytest.mark.xdist_group("ray")  # one Ray head on the machine at a time (tests/conftest.py)
def test_ray_backend_on_a_local_head_finds_the_same_max_qps(searched):
    """`--backend ray` runs the same searches as Ray tasks on a one-node head bound to 127.0.0.1."""
    pytest.importorskip("ray")
    from tests.runtime.launch.ray_cluster import RAY_ENV, RayHead

    tmp_path, config, _ = searched
    head = RayHead()
    try:
        argv = [
            "sim",
            "search",
            "--config",
            str(config),
            "--backend",
            "ray",
            "--output-dir",
            str(tmp_path / "ray"),
        ]
        result = subprocess.run(
            rollflow_command(*argv, "space.tensor_parallel=[4,8]"),
            cwd=ROOT,
            env={**ENV, **RAY_ENV, "RAY_ADDRESS": head.address},
            capture_output=True,
            text=True,
        )
    finally:
        head.stop()
    assert result.returncode == 0, result.stderr
    assert "2 to search on ray" in result.stderr
    cached = [json.loads(p.read_text()) for p in (tmp_path / "search" / "cache").glob("*.json")]
    local = {r["tensor_parallel"]: r["max_qps"] for r in cached}  # the local search's rows
    assert {r["tensor_parallel"]: r["max_qps"] for r in rows_of(tmp_path / "ray")} == {
        4: local[4],
        8: local[8],
    }


def user_device_search(tmp_path: Path) -> Path:
    """Llama-2-7B on the catalog's a100 and on a user's GPU with twice its FLOP/s and bandwidth,
    under a scheduling-delay p95 and a TBT p99.9 SLO."""
    config = yaml.safe_load(search_config(tmp_path).read_text())
    a100 = {"fp16_tflops": 312, "memory_gb": 80, "hbm_gb_per_s": 2039, "link_gb_per_s": 300}
    config["simulation"]["cluster"] = {
        "model": "meta-llama/Llama-2-7b-hf",
        "devices": {"a100x2": {**a100, "fp16_tflops": 624, "hbm_gb_per_s": 4078}},
    }
    config["slos"] = [
        {"metric": "scheduling_delay", "quantile": 95, "max_s": 0.5},
        {"metric": "tbt", "quantile": 99.9, "max_s": 0.1},
    ]
    config["prices"] = {"a100": 2.0, "a100x2": 3.0}
    config["space"] = {"device": ["a100", "a100x2"], "scheduler": ["vllm"]}
    config["output_dir"] = str(tmp_path / "search")
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_faster_user_device_has_a_higher_max_qps_at_its_own_price_and_chosen_quantiles(tmp_path):
    result = rollflow("sim", "search", "--config", str(user_device_search(tmp_path)))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "search"
    a100, fast = rows_of(out)
    assert (a100["device"], fast["device"]) == ("a100", "a100x2")
    assert fast["max_qps"] > a100["max_qps"] > 0
    assert fast["qps_per_dollar"] == pytest.approx(fast["max_qps"] / 3.0)
    assert fast["scheduling_delay_p95"] <= 0.5 and fast["tpot_p99.9"] <= 0.1
    assert (out / "pareto_tpot_p99.9.png").stat().st_size > 0
    # The best configuration's YAML reproduces its SLO metrics at the chosen quantiles.
    best = yaml.safe_load((out / "best.yaml").read_text())
    winner = max((a100, fast), key=lambda r: r["qps_per_dollar"])
    assert best["cluster"]["device"] == winner["device"]
    served = rollflow(
        "sim", "serve", "--config", str(out / "best.yaml"), "--output-dir", str(tmp_path / "best")
    )
    assert served.returncode == 0, served.stderr
    summary = json.loads((tmp_path / "best" / "summary.json").read_text())
    assert summary["scheduling_delay"]["p95"] == winner["scheduling_delay_p95"]
    assert summary["tpot"]["p99.9"] == winner["tpot_p99.9"]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "space.device=[a100,b200]",
            "space.device: unknown device 'b200'; pick from: a100, h100, a40, a100x2",
        ),
        ("prices={a100: 2.0}", "no $/GPU-hour for device 'a100x2'"),
        ("simulation.cluster.devices.a100x2.hbm_gb_per_s=-1", "cluster.devices.a100x2.hbm_gb_per_s"),
    ],
)
def test_bad_user_devices_in_a_search_are_one_line_errors(tmp_path, override, expected):
    result = rollflow("sim", "search", "--config", str(user_device_search(tmp_path)), override)
    assert_one_line_error(result, expected)
