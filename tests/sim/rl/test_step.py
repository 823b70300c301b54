"""Simulated steps: samples are conserved, GPU moves are valid, preemptions cost what they should."""

import pytest

from rollflow.errors import UserError
from rollflow.sim.config import SimConfig
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests
from tests.sim.rl.factories import DISAGGREGATED, rl_config

POLICIES = {
    "collocated": [],
    "static": DISAGGREGATED,
    "static-pipelined": [*DISAGGREGATED, "placement.pipelining=true"],
    "dynamic": [*DISAGGREGATED, "placement.pipelining=true", "scheduling.kind=dynamic"],
    "dynamic-pre-process-wait-last": [
        *DISAGGREGATED,
        "placement.pipelining=true",
        "scheduling.kind=dynamic",
        "scheduling.pre_process=true",
        "scheduling.wait_before_last_iter=true",
    ],
    "spot-migrate": [
        "spot.instances=4",
        "spot.availability.mean_lifetime_s=40",
        "spot.offload.initial_budget_s=5",
    ],
    "spot-restart": [
        "spot.instances=4",
        "spot.availability.mean_lifetime_s=40",
        "spot.offload.initial_budget_s=5",
        "spot.on_preemption=restart",
    ],
}


@pytest.mark.parametrize("name", POLICIES)
def test_every_sample_is_generated_and_trained_exactly_once(name):
    config = rl_config("steps=2", *POLICIES[name])
    for step in simulate_steps(config):
        trained = sorted(i for batch in step.minibatches for i in batch)
        assert trained == list(range(step.num_samples))
        assert all(len(batch) == step.num_samples // 4 for batch in step.minibatches)
        assert step.actor_sizes == sorted(step.actor_sizes)  # the actor never shrinks in a step
        assert all(size in (1, 2, 4, 8) for size in step.actor_sizes)  # 16-sample mini-batches, 8 GPUs
        busy = sum(step.busy_gpu_s.values())
        assert 0 < busy <= step.reserved_gpu_s + step.spot_gpu_s + 1e-6
        assert step.start < step.windows["training"][1] <= step.windows["sync"][0] < step.end


def test_disaggregated_rollout_takes_as_long_as_the_serving_simulator_says():
    """With nothing moving, the RL step's rollout is exactly a `rollflow sim serve` run."""
    config = rl_config(*DISAGGREGATED)
    (step,) = simulate_steps(config)
    serving = config.rollout_sim_config().model_copy(
        update={"cluster": config.rollout_sim_config().cluster.model_copy(update={"replicas": 4})}
    )
    assert isinstance(serving, SimConfig)
    result = ServingSimulator(serving, build_requests(config.workload, config.seed)).run()
    assert step.windows["rollout"][1] == pytest.approx(result.simulated_time_s, rel=1e-12)


def test_dynamic_scheduling_grows_the_actor_and_shortens_a_long_tailed_step():
    tail = ["workload.output_sigma=1.5", "workload.num_prompts=32", "steps=1"]
    static = simulate_steps(rl_config(*tail, *POLICIES["static-pipelined"]))[0]
    dynamic = simulate_steps(rl_config(*tail, *POLICIES["dynamic-pre-process-wait-last"]))[0]
    assert dynamic.actor_sizes[-1] == 8 > dynamic.actor_sizes[0]
    assert dynamic.num_migrated > 0 and dynamic.reprefill_tokens > 0 and dynamic.regenerated_tokens == 0
    assert dynamic.step_time_s < static.step_time_s


def _spot_trace(tmp_path):
    """Instance 0 lives throughout; instance 1 is preempted 12 s in, mid-rollout."""
    path = tmp_path / "spot.csv"
    path.write_text("instance,start_s,end_s\n0,0,100000\n1,0,12\n")
    return path


@pytest.mark.parametrize("mode", ["migrate", "restart"])
def test_preemption_regenerates_nothing_with_migration_and_the_lost_tokens_with_restart(tmp_path, mode):
    config = rl_config(
        "spot.instances=2",
        "spot.startup_s=0",
        f"spot.availability={{kind: trace, file: {_spot_trace(tmp_path)}, notice_s: 0}}",
        "spot.offload.initial_budget_s=1000",
        f"spot.on_preemption={mode}",
        "workload.output_median_tokens=1024",
    )
    (step,) = simulate_steps(config)
    assert step.num_preemptions == 1 and step.preempted_sequences > 0
    if mode == "migrate":
        assert step.regenerated_tokens == 0 and step.reprefill_tokens > 0
    else:
        assert step.regenerated_tokens > 0 and step.reprefill_tokens == 0
    trained = sorted(i for batch in step.minibatches for i in batch)
    assert trained == list(range(step.num_samples))


def test_migration_beats_restart_on_step_time(tmp_path):
    common = [
        "spot.instances=2",
        "spot.startup_s=0",
        f"spot.availability={{kind: trace, file: {_spot_trace(tmp_path)}, notice_s: 0}}",
        "spot.offload.initial_budget_s=1000",
        "workload.output_median_tokens=1024",
    ]
    migrate = simulate_steps(rl_config(*common))[0]
    restart = simulate_steps(rl_config(*common, "spot.on_preemption=restart"))[0]
    assert migrate.step_time_s <= restart.step_time_s
    assert migrate.windows["rollout_spot"][1] < restart.windows["rollout_spot"][1]


def test_spot_instances_raise_throughput_and_are_paid_only_while_alive():
    # Throughput-bound rollout (many sequences per GPU, a short tail): more instances help.
    longer = [
        "steps=2",
        "workload.num_prompts=128",
        "workload.output_sigma=0.3",
        "workload.output_median_tokens=512",
    ]
    on_demand = simulate_steps(rl_config(*longer))
    spot = simulate_steps(
        rl_config(*longer, "spot.instances=8", "spot.startup_s=0", "spot.offload.initial_budget_s=5")
    )
    assert sum(s.step_time_s for s in spot) < sum(s.step_time_s for s in on_demand)
    for step in spot:
        assert 0 < step.spot_gpu_s <= 8 * step.step_time_s + 1e-6
        assert 0 < step.busy_gpu_s["rollout_spot"] <= step.spot_gpu_s
        assert step.cost_usd > step.reserved_gpu_s * 2.5 / 3600
    assert [s.spot_gpu_s for s in on_demand] == [0.0, 0.0]


def test_an_availability_trace_naming_an_unknown_instance_is_a_user_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("instance,start_s,end_s\n5,0,10\n")
    config = rl_config("spot.instances=2", f"spot.availability={{kind: trace, file: {path}}}")
    with pytest.raises(UserError, match=r"instance 5 is outside 0\.\.1"):
        simulate_steps(config)


def test_sequences_stranded_when_the_availability_trace_ends_are_a_user_error(tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("instance,start_s,end_s\n0,0,6\n")
    config = rl_config(
        "spot.instances=1",
        "spot.startup_s=0",
        f"spot.availability={{kind: trace, file: {path}, notice_s: 0}}",
        "spot.offload.initial_budget_s=2",
        "workload.output_median_tokens=1024",
    )
    with pytest.raises(UserError, match="sequences wait for a rollout instance and none will come"):
        simulate_steps(config)


def test_moves_cost_what_they_are_given_releases_holding_the_actor_and_resumes_the_sync():
    """Live, the executor releases engines one at a time on the trainer's lock and wakes each released
    one before the weights go out: rl-sim charges `release_s` and `resume_s` the same way."""
    tail = ["workload.output_sigma=1.5", "workload.num_prompts=32", "steps=1"]
    policy = POLICIES["dynamic-pre-process-wait-last"]
    free = simulate_steps(rl_config(*tail, *policy))[0]
    costly = simulate_steps(rl_config(*tail, *policy, "scheduling.release_s=5", "scheduling.resume_s=2"))[0]
    released = sum(1 for window in costly.instance_windows if window[2] == "local")
    assert released == 6  # every rollout instance, borrowed ones first
    assert costly.windows["sync"][0] == pytest.approx(costly.windows["training"][1] + released * 2)
    assert free.windows["sync"][0] == pytest.approx(free.windows["training"][1])
    # the first release (pre-process, as rollout thins out) holds the actor's next mini-batch 5 s
    assert costly.windows["training"][0] >= free.windows["training"][0] + 5
    assert costly.step_time_s > free.step_time_s + released * 2 + 5
    # a static step's rollout stops when done, and nothing moves: the same step either way
    static = [*tail, *POLICIES["static-pipelined"]]
    assert (
        simulate_steps(rl_config(*static, "scheduling.release_s=5", "scheduling.resume_s=2"))[0].step_time_s
        == simulate_steps(rl_config(*static))[0].step_time_s
    )
