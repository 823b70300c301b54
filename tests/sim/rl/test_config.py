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
    ],
)
def test_config_error_names_the_problem(overrides, message):
    with pytest.raises(ConfigError) as error:
        rl_config(*overrides)
    assert message in str(error.value)
