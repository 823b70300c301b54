"""Off-policy steps: the next rollout overlaps training within the staleness bound (`off_policy`)."""

import itertools

import pytest

from rollflow.policy.offload import OffloadBalancer, StepReport
from rollflow.policy.resources import StaticScheduler
from rollflow.sim.build import build_groups
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.runner import lanes_busy_until, simulate_steps
from rollflow.sim.rl.spot import SpotMarket
from rollflow.sim.rl.step import StepSimulator
from tests.sim.rl.factories import DISAGGREGATED, rl_config

SPOT = ["spot.instances=4", "spot.availability.mean_lifetime_s=40", "spot.offload.initial_budget_s=5"]
PLACEMENTS = {
    "collocated": [],
    "static": DISAGGREGATED,
    "static-pipelined": [*DISAGGREGATED, "placement.pipelining=true"],
    "spot": SPOT,
}


def _back_to_back(config):
    """Steps one after another, each starting at the previous one's end: the on-policy runner."""
    costs, scheduler, groups = (
        StepCosts.from_config(config),
        StaticScheduler(),
        build_groups(config.rollout_sim_config()),
    )
    balancer = market = None
    if config.spot.instances:
        balancer, market = (
            OffloadBalancer(config.spot.offload.settings()),
            SpotMarket(config.spot, config.seed),
        )
    steps, clock = [], 0.0
    for index in range(config.steps):
        step = StepSimulator(config, index, clock, costs, scheduler, balancer, market, groups).run()
        if balancer is not None:
            balancer.update(StepReport(step.step_time_s, step.bubble_s))
        steps.append(step)
        clock = step.end
    return steps


@pytest.mark.parametrize("name", PLACEMENTS)
def test_off_policy_zero_runs_steps_back_to_back(name):
    config = rl_config("steps=3", *PLACEMENTS[name])
    steps = simulate_steps(config)
    expected = _back_to_back(config)
    assert [s.step_time_s for s in steps] == [s.step_time_s for s in expected]
    assert [s.start for s in steps[1:]] == [s.end for s in steps[:-1]]
    assert [s.cost_usd for s in steps] == [s.cost_usd for s in expected]
    assert all(s.tokens_by_staleness == {0: s.generated_tokens} for s in steps)


@pytest.mark.parametrize("name", PLACEMENTS)
def test_off_policy_is_never_slower(name):
    on = summarize_run(
        rl_config("steps=3", *PLACEMENTS[name]), simulate_steps(rl_config("steps=3", *PLACEMENTS[name])), 0.0
    )
    config = rl_config("steps=3", "off_policy=1", *PLACEMENTS[name])
    off = summarize_run(config, simulate_steps(config), 0.0)
    assert off["step_time_s"] <= on["step_time_s"] + 1e-9
    assert off["throughput_tokens_per_s"] >= on["throughput_tokens_per_s"] - 1e-9


def test_off_policy_overlaps_rollout_with_training_when_placed_apart():
    # Rollout and training of comparable length on separate GPUs: the rollout GPUs start the next
    # step while the actor trains, so each step after the first adds less than a whole step.
    on_config = rl_config("steps=3", *DISAGGREGATED, "placement.pipelining=true")
    off_config = rl_config("steps=3", *DISAGGREGATED, "placement.pipelining=true", "off_policy=1")
    on, off = simulate_steps(on_config), simulate_steps(off_config)
    training = on[0].windows["training"][1] - on[0].windows["training"][0]
    rollout = on[0].rollout_end - on[0].start
    assert 0.2 < training / rollout < 5  # comparable
    assert off[-1].end < on[-1].end
    for prev, step in itertools.pairwise(off):
        assert step.start < prev.end  # overlapped
        first_training = min(s.start for s in step.spans if s.component == "training")
        assert first_training >= prev.end  # but trains only after the previous step's sync
    on_summary = summarize_run(on_config, on, 0.0)
    off_summary = summarize_run(off_config, off, 0.0)
    assert off_summary["steady_state_step_time_s"] < on_summary["steady_state_step_time_s"]
    assert off_summary["tokens_by_staleness"].get("1", 0) > 0


@pytest.mark.parametrize("bound", [1, 2])
@pytest.mark.parametrize("name", ["static-pipelined", "spot"])
def test_no_sample_trains_staler_than_the_bound(name, bound):
    steps = simulate_steps(rl_config("steps=4", f"off_policy={bound}", *PLACEMENTS[name]))
    for index, step in enumerate(steps):
        assert step.max_sample_staleness <= bound
        assert max(step.tokens_by_staleness) <= bound
        assert sum(step.tokens_by_staleness.values()) == step.generated_tokens
        if index > bound:  # weights of version index - bound are out before the rollout starts
            assert step.start >= steps[index - 1 - bound].end
        if index:
            assert step.start >= steps[index - 1].rollout_end
            assert step.paid_from == steps[index - 1].end


@pytest.mark.parametrize(
    "policy", [[], ["scheduling.pre_process=true"], ["scheduling.wait_before_last_iter=true"]]
)
def test_off_policy_composes_with_dynamic_scheduling(policy):
    """The next rollout starts on each GPU only once the previous step's grown actor has left it."""
    sections = [*DISAGGREGATED, "placement.pipelining=true", "scheduling.kind=dynamic", *policy]
    on = simulate_steps(on_config := rl_config("steps=3", *sections))
    off = simulate_steps(off_config := rl_config("steps=3", "off_policy=1", *sections))
    assert any(max(s.actor_sizes) > 2 for s in off)  # the actor grew onto rollout GPUs
    for before, after in itertools.pairwise(off):
        assert after.start < before.end  # the next rollout overlaps this step's training
        busy = lanes_busy_until(before, off_config.num_gpus)
        for gpu_start, num_gpus, _, started, _ in after.instance_windows:
            assert started >= max(busy[gpu_start : gpu_start + num_gpus]) - 1e-9
    summary = summarize_run(off_config, off, 0.0)
    assert summary["max_sample_staleness"] == 1
    assert summary["throughput_tokens_per_s"] > summarize_run(on_config, on, 0.0)["throughput_tokens_per_s"]
