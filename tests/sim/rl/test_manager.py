"""The rollout manager's relay processes in `rollflow rl-sim run`: a step whose engines generate
faster than the relay carries waits for it, by what its capacity predicts; more processes lift it."""

import json
import statistics

import pytest

from rollflow.errors import UserError
from rollflow.sim.rl.config import ManagerConfig
from rollflow.sim.rl.manager import DEFAULT_RESULTS, MANAGER, ManagerCapacity, cpu_us_per_token
from tests.sim.rl.test_cli import rl_sim

# Static, pipelined, disaggregated (rlinf_dynamic.yaml with static scheduling), 64 samples: the
# engines generate ~1,500 tokens/s over the rollout, a few thousand at its start.
SMALL = [
    "steps=1",
    "workload.num_prompts=16",
    "workload.samples_per_prompt=4",
    "workload.output_median_tokens=256",
    "scheduling.kind=static",
]
SLOW_RELAY_US = 2000.0  # per token: one process relays 500 tokens/s, a third of the engines' rate


def _run(tmp_path, name: str, *overrides: str) -> tuple[dict, str]:
    out = tmp_path / name
    proc = rl_sim("run", "rlinf_dynamic", out, "--no-plots", *SMALL, *overrides)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "summary.json").read_text()), proc.stdout


@pytest.mark.process
def test_a_relay_slower_than_the_engines_ends_rollout_when_its_capacity_predicts(tmp_path):
    free, _ = _run(tmp_path, "free")
    bound, printed = _run(
        tmp_path, "bound", "manager.processes=1", f"manager.cpu_us_per_token={SLOW_RELAY_US}"
    )
    capacity = 1e6 / SLOW_RELAY_US
    assert bound["manager_tokens_per_s_capacity"] == pytest.approx(capacity)
    (step,) = bound["steps"]
    # Every response token passes the relay; the first of each sample is sampled by its prefill,
    # which the relay model does not count: the prediction is exact to one token per sample.
    predicted = step["generated_tokens"] / capacity
    assert abs(step["rollout_end_s"] - predicted) <= bound["samples_per_step"] / capacity + 1e-6
    assert step["rollout_end_s"] > 2 * free["steps"][0]["rollout_end_s"]  # the relay, not the GPUs
    assert bound["manager_bottleneck"] is True
    assert bound["manager_bound_s_per_step"] == pytest.approx(
        step["rollout_end_s"] - free["steps"][0]["rollout_end_s"]
    )
    assert bound["step_time_s"] > free["step_time_s"] + bound["manager_bound_s_per_step"] / 2
    assert "the bottleneck: rollout ends" in printed


@pytest.mark.process
def test_enough_relay_processes_give_the_step_of_a_run_without_the_manager(tmp_path):
    free, _ = _run(tmp_path, "free")
    enough, printed = _run(
        tmp_path, "enough", "manager.processes=64", f"manager.cpu_us_per_token={SLOW_RELAY_US}"
    )
    assert enough["manager_bottleneck"] is False and enough["manager_bound_s_per_step"] == 0
    assert enough["manager_max_sample_wait_s"] == 0  # no sample waited for the relay
    assert enough["steps"][0]["rollout_end_s"] == free["steps"][0]["rollout_end_s"]
    assert enough["step_time_s"] == free["step_time_s"]
    # the processes cost their CPU cores ($0.05/core-hour by default) over the step
    manager_cost = 64 * 0.05 * enough["step_time_s"] / 3600
    assert enough["manager_cost_usd_per_step"] == pytest.approx(manager_cost)
    assert enough["cost_usd_per_step"] == pytest.approx(free["cost_usd_per_step"] + manager_cost)
    assert "not the bottleneck" in printed


@pytest.mark.process
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["manager.procs=2"], "manager.procs: unknown key; did you mean 'processes'?"),
        (["manager.engine_writes=fast"], "manager.engine_writes: Input should be 'batched' or 'per_event'"),
        (["manager.processes=-1"], "manager.processes: Input should be greater than or equal to 0"),
        (
            ["manager.processes=2", "manager.results_file=/nonexistent/manager_overhead.json"],
            "manager.results_file: /nonexistent/manager_overhead.json not found",
        ),
    ],
)
def test_a_bad_manager_section_is_one_line_naming_the_key(tmp_path, overrides, message):
    proc = rl_sim("run", "rlinf_dynamic", tmp_path, *overrides)
    assert proc.returncode != 0
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_the_per_token_cost_is_the_benchmarks_median_over_rounds():
    rounds = json.loads(DEFAULT_RESULTS.read_text())["figures"]["rounds"]
    for writes, key in (
        ("batched", "batched_stream_cpu_us_per_token"),
        ("per_event", "stream_cpu_us_per_token"),
    ):
        value, source = cpu_us_per_token(ManagerConfig(processes=1, engine_writes=writes))
        assert value == statistics.median(r[MANAGER][key] for r in rounds)
        assert str(DEFAULT_RESULTS) in source
    capacity = ManagerCapacity.from_config(ManagerConfig(processes=3, cpu_us_per_token=5.0))
    assert capacity is not None and capacity.tokens_per_s == 600_000
    assert ManagerCapacity.from_config(ManagerConfig(processes=0)) is None  # left out


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"figures": {}}',
        '{"figures": {"rounds": [{"rollflow manager": {}}]}}',
        '{"figures": {"rounds": []}}',
    ],
)
def test_a_malformed_results_file_names_what_it_lacks_and_what_to_do(tmp_path, text):
    path = tmp_path / "manager_overhead.json"
    path.write_text(text)
    with pytest.raises(UserError) as error:
        cpu_us_per_token(ManagerConfig(processes=1, results_file=str(path)))
    message = str(error.value)
    assert message.startswith(f"manager.results_file: {path}") and "manager.cpu_us_per_token" in message
