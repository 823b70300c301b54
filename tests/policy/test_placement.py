"""RLinf's `cluster:` section: its keys load unchanged, and a bad placement is one line naming its rule."""

import pytest
import yaml

from rollflow.config import ConfigError, validate_config
from rollflow.errors import UserError
from rollflow.policy.placement import ClusterConfig, DeviceRange
from rollflow.policy.resources import DynamicScheduler, StaticScheduler

# as RLinf's dynamic-scheduling tutorial writes it
RLINF_SECTION = """
cluster:
  num_nodes: 1
  auto_scheduler: True
  use_pre_process_policy: True
  use_wait_before_last_iter_policy: False
  component_placement:
    actor: 0-1
    rollout: 2-5
    inference: 6-7
"""


def cluster(**changes) -> ClusterConfig:
    raw = yaml.safe_load(RLINF_SECTION)["cluster"]
    placement = {**raw["component_placement"], **changes.pop("component_placement", {})}
    return validate_config(ClusterConfig, {**raw, **changes, "component_placement": placement})


def test_rlinf_keys_load_unchanged_and_name_the_dynamic_scheduler():
    section = cluster()
    assert section.ranges() == {
        "actor": DeviceRange(0, 2),
        "rollout": DeviceRange(2, 4),
        "inference": DeviceRange(6, 2),
    }
    assert section.total_devices == 8
    assert section.scheduler() == DynamicScheduler(pre_process=True, wait_before_last_iter=False)
    assert isinstance(cluster(auto_scheduler=False).scheduler(), StaticScheduler)


def test_rlinf_defaults_both_policies_on_and_inference_may_be_left_out():
    section = ClusterConfig(component_placement={"actor": "0", "rollout": 1}, auto_scheduler=True)
    assert section.scheduler() == DynamicScheduler(pre_process=True, wait_before_last_iter=True)
    assert section.ranges() == {"actor": DeviceRange(0, 1), "rollout": DeviceRange(1, 1)}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"component_placement": {"actor": "4-5", "rollout": "0-3"}},
            "rule 'order actor -> rollout -> inference': the devices go rollout (0-3) -> actor (4-5) -> inference (6-7)",
        ),
        (
            {"component_placement": {"rollout": "1-5"}},
            "rule 'no overlap': actor (0-1) and rollout (1-5) share device 1",
        ),
        (
            {"component_placement": {"inference": "7"}},
            "rule 'no unused device': device 6 is in no component (inference starts at 7)",
        ),
        (
            {"component_placement": {"actor": "1", "rollout": "2-5"}},
            "rule 'no unused device': device 0 is in no component (actor starts at 1)",
        ),
        ({"num_devices": 10}, "rule 'no unused device': devices 8-9 of num_devices=10 are in no component"),
        ({"num_devices": 6}, "component_placement: uses devices 0-7 but num_devices=6"),
        (
            {"component_placement": {"critic": "8"}},
            "unknown component 'critic'; allowed: actor, rollout, inference",
        ),
        ({"component_placement": {"rollout": "5-2"}}, "component_placement.rollout: device range '5-2'"),
    ],
)
def test_a_bad_placement_is_one_line_naming_the_rule(changes, message):
    with pytest.raises(ConfigError) as error:
        cluster(**changes)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_an_actor_whose_data_parallel_size_does_not_divide_the_mini_batch_is_one_line_naming_the_rule():
    section = cluster(component_placement={"actor": "0-2", "rollout": "3-5"})
    section.check_actor_size(minibatch_samples=12)  # 3 ranks take 4 samples each
    with pytest.raises(UserError) as error:
        section.check_actor_size(minibatch_samples=8)
    assert str(error.value) == (
        "config error: cluster.component_placement.actor: rule 'actor data-parallel size divides the "
        "mini-batch': the actor's 3 devices (data-parallel size 3) do not divide the 8-sample mini-batch; "
        "valid actor sizes: [1, 2, 4, 8]"
    )
