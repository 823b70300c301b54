"""`rollflow rl-sim` as a user runs it: a real process, the shipped examples, real files."""

import json
import os
import subprocess

import pytest

from rollflow.runtime.launch.servers import run_rollflow

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)

SHORT = [
    "steps=1",
    "workload.num_prompts=16",
    "workload.samples_per_prompt=4",
    "workload.output_median_tokens=256",
]


def _rollflow(*args):
    return run_rollflow(*args, env={**os.environ, "COLUMNS": "160"})


def rl_sim(command: str, example: str, output_dir, *args: str) -> subprocess.CompletedProcess:
    """`rollflow rl-sim COMMAND --config examples/rl/EXAMPLE.yaml --output-dir OUTPUT_DIR ARGS...`"""
    return _rollflow(
        "rl-sim", command, "--config", f"examples/rl/{example}.yaml", "--output-dir", str(output_dir), *args
    )


def test_run_writes_the_summary_gantt_and_trace(tmp_path):
    proc = rl_sim("run", "rlinf_dynamic", tmp_path, *SHORT)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "step_time_s",
        "throughput_tokens_per_s",
        "gpu_utilization",
        "idle_gpu_s_per_step",
        "cost_usd_per_mtok",
    ):
        assert summary[key] > 0
    (step,) = summary["steps"]
    assert {"rollout", "inference", "training", "sync"} <= set(step["components"])
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((tmp_path / "chrome_trace.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"rollout", "training", "sync"}
    assert "Step-time breakdown" in proc.stdout


def test_compare_writes_every_policy_of_the_spot_example(tmp_path):
    proc = rl_sim("compare", "rlboost_spot", tmp_path, *SHORT)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((tmp_path / "compare.json").read_text())
    assert list(table) == ["on-demand", "spot-migrate", "spot-restart", "spot-off-policy"]
    for row in table.values():
        assert set(row) >= {
            "step_time_s",
            "throughput_tokens_per_s",
            "gpu_utilization",
            "cost_usd_per_mtok",
            "regenerated_tokens",
        }
    assert table["on-demand"]["regenerated_tokens"] == table["spot-migrate"]["regenerated_tokens"] == 0
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "spot-restart" / "summary.json").is_file()
    assert "spot-migrate" in proc.stdout and "tokens/s" in proc.stdout and "tokens/$ vs first" in proc.stdout
    assert table["spot-off-policy"]["off_policy"] == 1 and table["spot-migrate"]["off_policy"] == 0
    assert set(table["spot-off-policy"]["tokens_by_staleness"]) <= {"0", "1"}
    assert table["spot-off-policy"]["tokens_per_usd"] > 0


def test_a_bad_placement_is_a_one_line_error_naming_the_key():
    proc = _rollflow("rl-sim", "run", "--config", "examples/rl/rlinf_dynamic.yaml", "placement.rollout=5-11")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "placement.rollout: starts at GPU 5, expected 4" in proc.stderr


def test_compare_without_variants_says_so():
    proc = _rollflow("rl-sim", "compare", "--config", "examples/rl/rlinf_dynamic.yaml", "compare=[]")
    assert proc.returncode == 2 and "lists no variants" in proc.stderr


def test_help_shows_examples():
    proc = _rollflow("rl-sim", "run", "--help")
    assert proc.returncode == 0 and "rl-sim compare --config" in proc.stdout


def test_config_prints_every_default():
    proc = _rollflow(
        "rl-sim", "config", "--config", "examples/rl/rlboost_spot.yaml", "spot.on_preemption=restart"
    )
    assert proc.returncode == 0, proc.stderr
    assert "on_preemption: restart" in proc.stdout and "reshard_gb_per_s: 50.0" in proc.stdout


def test_no_plots_writes_the_numbers_without_any_figure(tmp_path):
    proc = rl_sim("compare", "rlinf_dynamic", tmp_path, "--no-plots", *SHORT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "compare.json").read_text())
    assert not list(tmp_path.rglob("*.png"))
    assert list(tmp_path.rglob("summary.json"))


def test_rlinf_cluster_section_simulates_the_plan_written_with_placement_and_scheduling(tmp_path):
    # examples/rl/rlinf_cluster.yaml is rlinf_dynamic.yaml's plan with both policies, as RLinf's `cluster:` section
    pasted = rl_sim("run", "rlinf_cluster", tmp_path / "a", *SHORT)
    assert pasted.returncode == 0, pasted.stderr
    both_policies = ["scheduling.pre_process=true", "scheduling.wait_before_last_iter=true"]
    by_hand = rl_sim("run", "rlinf_dynamic", tmp_path / "b", *SHORT, *both_policies)
    assert by_hand.returncode == 0, by_hand.stderr
    first, second = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("a", "b"))
    assert first["step_time_s"] == second["step_time_s"] > 0
    assert first["steps"] == second["steps"]


def test_an_off_policy_run_reports_its_steady_state_and_tokens_per_staleness(tmp_path):
    overrides = [*SHORT, "steps=3", "scheduling.kind=static", "off_policy=1"]
    proc = rl_sim("run", "rlinf_dynamic", tmp_path, *overrides)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["off_policy"] == 1 and summary["max_sample_staleness"] <= 1
    assert summary["steady_state_step_time_s"] > 0 and summary["tokens_per_usd"] > 0
    by_staleness = summary["tokens_by_staleness"]
    assert set(by_staleness) <= {"0", "1"}
    assert sum(by_staleness.values()) == sum(s["generated_tokens"] for s in summary["steps"])
    assert "off-policy (bound 1): steady-state step" in proc.stdout
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_partial_rollout_with_dynamic_scheduling_carries_whole_groups_every_step(tmp_path):
    partial = ["steps=3", "partial_rollout=4", "scheduling.pre_process=true", "output.gantt=false"]
    proc = rl_sim("run", "rlinf_dynamic", tmp_path, *SHORT, *partial)
    assert proc.returncode == 0, proc.stderr  # a step whose samples are neither trained nor carried fails
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samples_per_step"] == 16 * 4
    # each step trains 16 whole groups and hands the 4 extra groups, whole, to the next
    assert [step["carried_samples"] for step in summary["steps"]] == [4 * 4] * 3
    assert all(step["tokens_by_staleness"].get("1", 0) > 0 for step in summary["steps"][1:])
    assert summary["migrated_sequences"] > 0  # instances released mid-rollout handed their samples on
    assert (
        f"partial rollout (+4 prompts): 48 samples ({summary['tokens_carried']} tokens) carried"
        in " ".join(proc.stdout.split())
    )
    assert summary["tokens_carried"] == sum(step["tokens_carried"] for step in summary["steps"]) > 0
