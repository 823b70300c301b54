"""`rollflow rl-sim search` as a user runs it: real step simulations, a best plan that reruns exactly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from rollflow.plan.rl_export import live_cluster_section
from rollflow.policy.placement import ClusterConfig
from tests.factories import assert_one_line_error
from tests.plan.test_serve_search import rollflow

REPO = Path(__file__).resolve().parents[2]


def rl_search_config(tmp_path: Path) -> Path:
    config = {
        "simulation": {
            "seed": 5,
            "steps": 2,
            "model": "meta-llama/Meta-Llama-3-8B",
            "device": "h100",
            "network_device": "h100_dgx",
            "workload": {
                "num_prompts": 16,
                "samples_per_prompt": 4,
                "prompt_tokens": 256,
                "output_median_tokens": 256,
                "max_new_tokens": 2048,
            },
            "rollout": {"execution": {"kind": "roofline"}},
            "training": {"num_minibatches": 2},
            "spot": {"availability": {"mean_lifetime_s": 200, "mean_downtime_s": 60}},
        },
        "space": {
            "num_gpus": [8],
            "placement": ["collocated", "disaggregated"],
            "splits": [
                {"actor": 2, "inference": 0},
                {"actor": 4, "inference": 2},
                {"actor": 6, "inference": 2},
            ],
            "pipelining": [False, True],
            "scheduling": ["static", "pre_process"],
            "spot_instances": [0, 4],
            "local_budget_s": [10],
        },
        "budget": {"usd_per_hour": 22},
        "output_dir": str(tmp_path / "rl"),
    }
    path = tmp_path / "rl_search.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rl_search(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`rollflow rl-sim search` on `rl_search_config`'s space, with dotted `overrides`."""
    return rollflow("rl-sim", "search", "--config", str(rl_search_config(tmp_path)), *overrides)


def test_rl_search_reports_every_plan_and_its_best_plan_reruns_with_the_same_step_time(tmp_path):
    result = rl_search(tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "rl"
    rows = json.loads((out / "results.json").read_text())
    # collocated: 0 spot, 4 spot; disaggregated: 3 splits x (static, pipelined static, pipelined pre_process)
    assert len(rows) == 2 + 9
    ran = [r for r in rows if not r["skipped"]]
    skipped = {
        (r["placement"], r["actor_gpus"], r["spot_instances"]): r["skipped"] for r in rows if r["skipped"]
    }
    assert "over the $22.00 budget" in skipped[("collocated", None, 4)]  # 8 x 2.5 + 4 x 1.0
    assert "leave no rollout GPU of 8" in skipped[("disaggregated", 6, 0)]  # nothing left for rollout
    for row in ran:
        assert (
            row["step_time_s"] > 0 and row["throughput_tokens_per_s"] > 0 and 0 < row["gpu_utilization"] <= 1
        )
        assert row["cost_usd_per_mtok"] > 0
    assert {r["scheduling"] for r in ran} == {"static", "pre_process"}
    assert (out / "pareto_throughput_cost.png").stat().st_size > 0
    best = max(ran, key=lambda r: r["throughput_tokens_per_s"])
    rerun_dir = tmp_path / "rerun"
    rerun = rollflow("rl-sim", "run", "--config", str(out / "best.yaml"), "--output-dir", str(rerun_dir))
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads((rerun_dir / "summary.json").read_text())
    assert summary["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert summary["cost_usd_per_mtok"] == pytest.approx(best["cost_usd_per_mtok"], rel=1e-12)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("space.scheduling=[]", "space.scheduling"),
        ("space.splits=[]", "splits: placement disaggregated needs at least one split"),
        ("space.scheduling=[fastest]", "space.scheduling[0]: Input should be 'static'"),
        ("space.off_policy=[-1]", "off_policy: staleness bounds must be >= 0"),
    ],
)
def test_bad_rl_search_configs_are_one_line_errors(tmp_path, override, expected):
    result = rl_search(tmp_path, override)
    assert_one_line_error(result, expected)


def test_off_policy_is_a_knob_of_the_rl_search_and_never_slower_than_its_on_policy_twin(tmp_path):
    result = rl_search(tmp_path, "space.placement=[disaggregated]", "space.off_policy=[0, 1]")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "rl"
    rows = json.loads((out / "results.json").read_text())
    # 3 splits x (static, pipelined static, pipelined pre_process), each on- and off-policy
    assert len(rows) == 9 + 9
    assert {r["scheduling"] for r in rows if r["off_policy"]} == {"static", "pre_process"}
    ran = {
        (r["actor_gpus"], r["inference_gpus"], r["pipelining"], r["scheduling"], r["off_policy"]): r
        for r in rows
        if not r["skipped"]
    }
    twins = [(key, row) for key, row in ran.items() if key[-1] == 1]
    assert twins
    for key, off in twins:
        on = ran[(*key[:-1], 0)]
        assert off["step_time_s"] <= on["step_time_s"] + 1e-9
    assert any(off["step_time_s"] < ran[(*key[:-1], 0)]["step_time_s"] for key, off in twins)
    assert "off-policy 1" in result.stderr + result.stdout
    best = yaml.safe_load((out / "best.yaml").read_text())
    best_row = max(ran.values(), key=lambda r: r["throughput_tokens_per_s"])  # the default objective
    assert best["off_policy"] == best_row["off_policy"]


def test_partial_rollout_is_a_knob_of_the_rl_search(tmp_path):
    result = rl_search(tmp_path, "space.placement=[collocated]", "space.partial_rollout=[0, 4]")
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "rl" / "results.json").read_text())
    # without preemptible instances, each collocated plan with and without partial rollout
    by_extra = {r["partial_rollout"]: r for r in rows if not r["spot_instances"] and not r["skipped"]}
    assert set(by_extra) == {0, 4}
    assert all(r["partial_rollout"] == 0 for r in rows if r["spot_instances"])
    assert by_extra[4]["throughput_tokens_per_s"] > by_extra[0]["throughput_tokens_per_s"]
    assert "partial +4" in result.stderr + result.stdout


def test_a_pipelined_disaggregated_plan_is_the_cluster_section_the_trainer_takes(tmp_path):
    plan = yaml.safe_load((REPO / "examples/rl/rlinf_dynamic.yaml").read_text())
    plan.pop("compare")
    plan["scheduling"] = {"kind": "dynamic", "wait_before_last_iter": True}
    section = live_cluster_section(plan)
    cluster = ClusterConfig.model_validate(section)
    assert {name: str(span) for name, span in cluster.ranges().items()} == {
        "actor": "0-3",
        "rollout": "4-11",
        "inference": "12-15",
    }
    assert cluster.auto_scheduler and cluster.use_wait_before_last_iter_policy
    assert not cluster.use_pre_process_policy
    # simulated from the section alone, the plan takes the same step time
    runs = {}
    for name, config in {
        "plan": plan,
        "section": {
            **{k: v for k, v in plan.items() if k not in ("placement", "scheduling", "num_gpus")},
            "cluster": section,
        },
    }.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**config, "steps": 1}))
        out = tmp_path / name
        result = rollflow("rl-sim", "run", "--config", str(path), "--output-dir", str(out))
        assert result.returncode == 0, result.stderr
        runs[name] = json.loads((out / "summary.json").read_text())["step_time_s"]
    assert runs["section"] == runs["plan"] > 0
    unpipelined = {**plan, "placement": {**plan["placement"], "pipelining": False}}
    assert live_cluster_section(unpipelined) is None
    assert live_cluster_section({**plan, "placement": {"kind": "collocated"}}) is None


def test_the_cluster_scale_example_searches_54_plans_of_256_to_1024_gpus(tmp_path):
    """examples/search/rl_cluster_scale.yaml as shipped expands to 54 plans that all fit, half with 8
    manager processes, half with 32; its 256-GPU plans, on a smaller workload, run through the CLI
    and each gives a step."""
    from rollflow.config import load_config
    from rollflow.plan.rl_config import RLSearchConfig
    from rollflow.plan.rl_plans import expand_plans

    example = REPO / "examples" / "search" / "rl_cluster_scale.yaml"
    plans = expand_plans(load_config(RLSearchConfig, example).space)
    assert len(plans) == 54 and {p["num_gpus"] for p in plans} == {256, 512, 1024}
    assert sorted({p["manager_processes"] for p in plans}) == [8, 32]
    split = [p for p in plans if p["placement"] == "disaggregated"]
    assert all(p["actor_gpus"] + p["inference_gpus"] < p["num_gpus"] for p in split)
    out = tmp_path / "scale"
    small = ["space.num_gpus=[256]", "simulation.workload.num_prompts=64", f"output_dir={out}"]
    result = rollflow("rl-sim", "search", "--config", str(example), *small)
    assert result.returncode == 0, result.stderr
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == 18 and not any(r["skipped"] for r in rows)
    assert all(r["step_time_s"] > 0 and r["num_gpus"] == 256 for r in rows)


def test_manager_processes_are_a_knob_of_the_rl_search_and_cost_their_cores(tmp_path):
    """A relay of one slow process holds every plan's rollout back; 64 of them do not, for 63 more
    CPU cores an hour."""
    result = rl_search(
        tmp_path,
        "space.placement=[disaggregated]",
        "space.splits=[{actor: 2, inference: 2}]",
        "space.pipelining=[true]",
        "space.scheduling=[static]",
        "space.manager_processes=[1, 64]",
        "simulation.manager.cpu_us_per_token=2000",
        "budget.usd_per_hour=30",  # 8 GPUs x $2.5 + 64 cores x $0.05
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "rl"
    rows = {r["manager_processes"]: r for r in json.loads((out / "results.json").read_text())}
    assert set(rows) == {1, 64} and not any(r["skipped"] for r in rows.values())
    assert rows[1]["manager_bound_s_per_step"] > 0 and rows[64]["manager_bound_s_per_step"] == 0
    assert rows[1]["step_time_s"] > rows[64]["step_time_s"]
    assert rows[64]["usd_per_hour"] - rows[1]["usd_per_hour"] == pytest.approx(63 * 0.05)
    printed = result.stderr + result.stdout
    assert "manager x64" in printed and "manager-bound" in printed
    assert yaml.safe_load((out / "best.yaml").read_text())["manager"]["processes"] == 64


def test_a_search_whose_manager_lacks_its_results_file_fails_once_naming_it(tmp_path):
    result = rl_search(
        tmp_path,
        "space.manager_processes=[4]",
        "simulation.manager.results_file=/nonexistent/manager_overhead.json",
    )
    assert_one_line_error(result, "manager.results_file: /nonexistent/manager_overhead.json not found")
