"""The CLI as a user runs it: a real process, real files."""

import json
import os
import subprocess
import sys

import pytest

from rollflow.runtime.launch.servers import run_rollflow
from tests.factories import CONV_TRACE, REPO, VIDUR_DATA

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)


def _rollflow(*args, cwd=REPO):
    return run_rollflow(*args, env={**os.environ, "COLUMNS": "120"}, cwd=cwd)


def test_sim_serve_on_the_demo_config_writes_every_output(tmp_path):
    out = tmp_path / "demo"
    proc = _rollflow(
        "sim",
        "serve",
        "--config",
        "examples/sim/demo.yaml",
        "--output-dir",
        str(out),
        "workload.num_requests=300",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    for metric in ("ttft", "tpot", "e2e", "scheduling_delay"):
        assert set(summary[metric]) == {"p50", "p90", "p99", "mean"}
        assert summary[metric]["p50"] <= summary[metric]["p90"] <= summary[metric]["p99"]
    assert summary["num_requests"] == summary["num_completed"] == 300
    assert summary["simulated_time_s"] > 0 and summary["wall_time_s"] > 0
    assert len((out / "requests.csv").read_text().splitlines()) == 301
    trace = json.loads((out / "chrome_trace.json").read_text())
    assert any(event["ph"] == "X" for event in trace["traceEvents"])
    for png in ("latency_cdf.png", "queue_and_kv.png"):
        assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Latency (seconds)" in proc.stdout


def test_a_config_typo_is_a_one_line_error_and_exit_code_2(tmp_path):
    proc = _rollflow("sim", "serve", "--config", "examples/sim/demo.yaml", "schedular.kind=vllm")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "schedular: unknown key; did you mean 'scheduler'?" in proc.stderr


def test_help_explains_the_commands():
    proc = _rollflow("sim", "serve", "--help")
    assert proc.returncode == 0 and "dotted overrides" in proc.stdout


def _imported_modules(*args, cwd=REPO) -> set[str]:
    """Top-level packages a real `rollflow ...` process imported, from `python -X importtime`."""
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rollflow.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines[1:]}


HEAVY = {"torch", "transformers", "matplotlib"}


def test_help_and_sim_never_import_torch_and_plot_only_when_asked(tmp_path):
    assert not _imported_modules("--help") & (HEAVY | {"numpy", "pydantic"})
    assert not _imported_modules("sim", "serve", "--help") & HEAVY
    run = ("sim", "serve", "--config", "examples/sim/demo.yaml", "workload.num_requests=50")
    without_plots = _imported_modules(*run, "--output-dir", str(tmp_path / "a"), "--no-plots")
    assert "rollflow" in without_plots and not without_plots & HEAVY
    assert not without_plots & {"rich", "PIL"}  # rich draws only a terminal's progress bar
    assert not (tmp_path / "a" / "plots").exists()
    with_plots = _imported_modules(*run, "--output-dir", str(tmp_path / "b"))
    assert not with_plots & HEAVY and "PIL" in with_plots  # figures are drawn on Pillow
    assert (tmp_path / "b" / "plots" / "latency_cdf.png").exists()


def test_help_imports_no_command_group():
    """`rollflow --help` lists every group from rollflow/cli.py's table, importing none of their modules."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rollflow.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {
        line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
    }
    assert {name for name in names if name.startswith("rollflow")} == {"rollflow", "rollflow.cli_util"}


def test_sim_from_vidur_without_plots_imports_no_plotting_yaml_or_rich(tmp_path):
    """Vidur's flags, its ./data/profiling layout and a 50-request trace, as a user runs it."""
    compute = tmp_path / "data" / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    compute.mkdir(parents=True)
    (compute / "mlp.csv").symlink_to(
        VIDUR_DATA / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    )
    (tmp_path / "data" / "profiling" / "network").symlink_to(VIDUR_DATA / "profiling" / "network")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(CONV_TRACE.read_text().splitlines()[:51]) + "\n")
    flags = ["--replica_scheduler_config_type", "sarathi", "--cluster_config_num_replicas", "2",
             "--request_generator_config_type", "trace_replay", "--trace_request_generator_config_trace_file",
             str(trace), "--no-metrics_config_store_plots"]  # fmt: skip
    imported = _imported_modules("sim", "from-vidur", "--output-dir", "out", "--", *flags, cwd=tmp_path)
    assert "rollflow" in imported and not imported & (HEAVY | {"PIL", "rich", "yaml"})
    assert len((tmp_path / "out" / "requests.csv").read_text().splitlines()) == 51
    assert not (tmp_path / "out" / "plots").exists()
