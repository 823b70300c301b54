"""Config errors name the key and what is allowed."""

import pytest

from rollflow.config import ConfigError
from tests.sim.rl.factories import DISAGGREGATED, rl_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.num_minibatches=3"], "training.num_minibatches=3 must divide the global batch"),
        (["placement.kind=disaggregated"], "placement.actor: needed for placement.kind=disaggregated"),
        ([*DISAGGREGATED, "placement.actor=0-2"], "placement.rollout: starts at GPU 2, expected 3"),
        ([*DISAGGREGATED, "placement.inference=6-9"], "placement uses GPUs 0-9 but num_gpus=8"),
        (
            [*DISAGGREGATED, "placement.actor=0-2", "placement.rollout=3-5"],
            "placement.actor: the actor's 3 GPUs",
        ),
        (["scheduling.kind=dynamic"], "scheduling.kind=dynamic needs placement.kind=disaggregated"),
        ([*DISAGGREGATED, "scheduling.kind=dynamic"], "needs placement.pipelining=true"),
        ([*DISAGGREGATED, "spot.instances=2"], "spot.instances needs placement.kind=collocated"),
        (["spot.on_preemption=resume"], "spot.on_preemption: Input should be 'migrate' or 'restart'"),
        (["rollout.tensor_parallel=3"], "num_gpus=8 must be a multiple of rollout.tensor_parallel=3"),
        (["placement.actr=0-1"], "placement.actr: unknown key; did you mean 'actor'?"),
        (["num_gpus=6"], "valid sizes: [1, 2, 4]"),
        (["off_policy=-1"], "off_policy: Input should be greater than or equal to 0"),
        (["off_policy=1.5"], "off_policy: Input should be a valid integer"),
        (["off_policy=abc"], "off_policy: Input should be a valid integer"),
    ],
)
def test_config_error_is_one_line_naming_the_problem(overrides, message):
    with pytest.raises(ConfigError) as error:
        rl_config(*overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_rlinf_cluster_section_is_the_same_plan_as_placement_and_scheduling():
    from rollflow.sim.rl.runner import make_resource_scheduler

    section = [
        "cluster.auto_scheduler=true",
        "cluster.use_wait_before_last_iter_policy=false",
        "cluster.component_placement.actor=0-1",
        "cluster.component_placement.rollout=2-5",
        "cluster.component_placement.inference=6-7",
    ]
    from_cluster = rl_config(*section)
    by_hand = rl_config(
        *DISAGGREGATED,
        "placement.pipelining=true",
        "scheduling.kind=dynamic",
        "scheduling.pre_process=true",
    )
    assert from_cluster.model_dump(exclude={"cluster"}) == by_hand.model_dump(exclude={"cluster"})
    assert make_resource_scheduler(from_cluster.scheduling) == from_cluster.cluster.scheduler()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["scheduling.kind=static"], "scheduling.kind='static' disagrees with cluster"),
        (["num_gpus=4"], "num_gpus=4 disagrees with cluster (num_gpus=8)"),
        (
            ["cluster.component_placement.actor=0-2", "cluster.component_placement.rollout=3-5"],
            "rule 'actor data-parallel size divides the mini-batch'",
        ),
        (
            ["cluster.component_placement.rollout=1-5"],
            "cluster: Value error, component_placement: rule 'no overlap'",
        ),
    ],
)
def test_a_cluster_section_that_disagrees_or_breaks_a_rule_is_one_line(overrides, message):
    section = [
        "cluster.auto_scheduler=true",
        "cluster.component_placement.actor=0-1",
        "cluster.component_placement.rollout=2-5",
        "cluster.component_placement.inference=6-7",
    ]
    with pytest.raises(ConfigError) as error:
        rl_config(*section, *overrides)
    assert message in str(error.value) and "\n" not in str(error.value)
